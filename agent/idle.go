package agent

import (
	"context"
	"sync"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
)

// The node's idle measure (api/idle.go): an Instance is in use while the
// data plane has a connection bound to it, when one was bound since the
// last look, and while its guest's CPU use averaged over
// api.IdleCPUWindow is at or above api.IdleCPUPercent of one vCPU (from
// the VMM unit's cgroup). It is idle since the last look that found it in
// use, or since it was first seen. What cannot be told (a data plane that
// does not answer, a cgroup that cannot be read) counts as use: an
// Instance is never paused on a guess.

// InstanceConns is what the data plane says of one Instance's client
// connections (over its running processes).
type InstanceConns struct {
	Open  int    // bound to it now
	Bound uint64 // ever bound to it, summed over the processes
}

// DataPlaneActivity is a DataPlane that tells each Instance's
// connections; ok is false when it cannot (a process does not answer, or
// is an earlier build that does not count them).
type DataPlaneActivity interface {
	Activity(ctx context.Context) (conns map[string]InstanceConns, ok bool)
}

// activityTimeout bounds one question to the data plane, so a process
// that hangs does not hold the report watcher: its answer counts as use.
const activityTimeout = 2 * time.Second

// idleMeter keeps, per running Instance, when it was last in use.
type idleMeter struct {
	mu     sync.Mutex
	states map[string]*idleState
	// readCPU reads a cgroup's CPU time in microseconds.
	readCPU func(cgroup string) (uint64, error)
}

type idleState struct {
	busyAt time.Time   // the last look that found it in use, or its first
	bound  uint64      // InstanceConns.Bound at the last look
	cpu    []cpuSample // oldest first, spanning a little over the window
}

type cpuSample struct {
	at   time.Time
	usec uint64
}

// idleLook is one running Instance as a look finds it.
type idleLook struct {
	ID     string
	Cgroup string // "" unknown
}

// look takes one look at the running Instances at now, with the data
// plane's connections (connsKnown false: it could not tell). Instances
// not running any more are forgotten.
func (m *idleMeter) look(now time.Time, running []idleLook, conns map[string]InstanceConns, connsKnown bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.states == nil {
		m.states = map[string]*idleState{}
	}
	seen := make(map[string]bool, len(running))
	for _, in := range running {
		seen[in.ID] = true
		st := m.states[in.ID]
		if st == nil {
			st = &idleState{busyAt: now}
			m.states[in.ID] = st
		}
		c := conns[in.ID]
		busy := !connsKnown || c.Open > 0 || c.Bound != st.bound
		st.bound = c.Bound
		if !m.cpuQuiet(st, in.Cgroup, now) {
			busy = true
		}
		if busy {
			st.busyAt = now
		}
	}
	for id := range m.states {
		if !seen[id] {
			delete(m.states, id)
		}
	}
}

// cpuQuiet samples the Instance's CPU time and says whether its use over
// the window stayed below the threshold; false when it cannot tell.
func (m *idleMeter) cpuQuiet(st *idleState, cgroup string, now time.Time) bool {
	if cgroup == "" || m.readCPU == nil {
		return false
	}
	usec, err := m.readCPU(cgroup)
	if err != nil {
		st.cpu = nil
		return false
	}
	st.cpu = append(st.cpu, cpuSample{at: now, usec: usec})
	// Keep the newest sample at or before the window's start as its base.
	start := now.Add(-api.IdleCPUWindow)
	for len(st.cpu) > 2 && !st.cpu[1].at.After(start) {
		st.cpu = st.cpu[1:]
	}
	first, last := st.cpu[0], st.cpu[len(st.cpu)-1]
	span := last.at.Sub(first.at)
	if span <= 0 || last.usec < first.usec {
		return false // one sample, or a counter that went back (a new VMM)
	}
	// used/span < IdleCPUPercent% of one vCPU, in integers.
	used := time.Duration(last.usec-first.usec) * time.Microsecond
	return used*100 < span*api.IdleCPUPercent
}

// seconds is how long id has been idle as of now, 0 while in use (or
// unknown).
func (m *idleMeter) seconds(id string, now time.Time) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.states[id]
	if st == nil {
		return 0
	}
	return int64(now.Sub(st.busyAt) / time.Second)
}

// idleReportedAfter is how long an Instance is idle before its report
// says so. Each time a report says an Instance is idle, the node must push
// one again as soon as it is in use (ctrl counts the idle time on from the
// report): below this an Instance used every few seconds would cost two
// reports, two Raft entries, per use.
const idleReportedAfter = api.IdleCPUWindow

// reported is the idle seconds id's report carries: seconds, or 0 below
// idleReportedAfter.
func (m *idleMeter) reported(id string, now time.Time) int64 {
	s := m.seconds(id, now)
	if s < int64(idleReportedAfter/time.Second) {
		return 0
	}
	return s
}

// lookIdle takes the watcher's look at the running Instances' activity.
func (a *Agent) lookIdle(ctx context.Context) {
	rt := a.cfg.Runtime
	if rt == nil {
		return
	}
	var running []idleLook
	for _, st := range rt.Owned() {
		if st.State == runtime.StateRunning {
			running = append(running, idleLook{ID: st.ID, Cgroup: st.Cgroup})
		}
	}
	conns, known := map[string]InstanceConns(nil), true // no data plane: no connections
	if dp := a.cfg.DataPlane; dp != nil && len(running) > 0 {
		known = false
		if act, ok := dp.(DataPlaneActivity); ok {
			actx, cancel := context.WithTimeout(ctx, activityTimeout)
			conns, known = act.Activity(actx)
			cancel()
		}
	}
	a.idle.look(time.Now(), running, conns, known)
}
