//go:build race

package clustertest

// The race detector slows a process 5-10×: Raft heartbeats and control
// session pings then miss the tight test deadlines, leaders step down and
// sessions expire although nothing failed. Under -race the harness stretches
// its timings by this factor.
const timingScale = 5
