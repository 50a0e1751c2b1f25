//go:build !race

package clustertest

const timingScale = 1
