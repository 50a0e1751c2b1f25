package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/hostusage"
)

// fakeCPU is a cgroup's CPU time the test moves.
type fakeCPU struct{ usec map[string]uint64 }

func (f *fakeCPU) read(cg string) (uint64, error) {
	u, ok := f.usec[cg]
	if !ok {
		return 0, fmt.Errorf("cgroup %s: no cpu.stat", cg)
	}
	return u, nil
}

// An Instance is idle from the last look that found it in use: a
// connection open now, one bound since the last look (however short),
// guest CPU at or above 5% of a vCPU over the last 30 s. What the node
// cannot tell counts as use, and an Instance that stopped is forgotten.
func TestIdleMeter(t *testing.T) {
	cpu := &fakeCPU{usec: map[string]uint64{"/cg/a": 0, "/cg/b": 0}}
	m := idleMeter{readCPU: cpu.read}
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	now := t0
	a := idleLook{ID: "inst-a", Cgroup: "/cg/a"}
	conns := map[string]InstanceConns{}
	// step advances a second, the guest using usecPerSec of CPU in it.
	step := func(n int, usecPerSec uint64, ins ...idleLook) {
		for range n {
			now = now.Add(time.Second)
			for _, in := range ins {
				cpu.usec[in.Cgroup] += usecPerSec
			}
			m.look(now, ins, conns, true)
		}
	}
	idle := func(want int64, why string) {
		t.Helper()
		if got := m.seconds("inst-a", now); got != want {
			t.Fatalf("%s: idle %d s, want %d", why, got, want)
		}
	}
	m.look(now, []idleLook{a}, conns, true)
	idle(0, "first look")
	step(10, 10_000, a) // 1% of a vCPU: quiet
	idle(10, "quiet since its first look")
	if got := m.reported("inst-a", now); got != 0 {
		t.Fatalf("idle 10 s reported as %d s: a report says idle only after %s", got, idleReportedAfter)
	}
	step(20, 10_000, a)
	if got := m.reported("inst-a", now); got != 30 {
		t.Fatalf("idle 30 s reported as %d s", got)
	}

	conns["inst-a"] = InstanceConns{Open: 1, Bound: 1}
	step(5, 10_000, a)
	idle(0, "a connection open")
	conns["inst-a"] = InstanceConns{Bound: 1}
	step(3, 10_000, a)
	idle(3, "3 s after the last look that saw the connection open")
	conns["inst-a"] = InstanceConns{Bound: 2} // an exec that came and went between two looks
	step(1, 10_000, a)
	idle(0, "a connection bound since the last look")

	// A burst of 10 s at a full vCPU keeps it in use until the 30 s
	// average falls under 5%, that is until the window has (nearly) left
	// the burst behind.
	step(10, 1_000_000, a)
	idle(0, "a CPU burst")
	step(20, 0, a)
	idle(0, "the burst still weighs in the 30 s average")
	step(15, 0, a)
	if got := m.seconds("inst-a", now); got <= 0 || got > 15 {
		t.Fatalf("after the burst left the window: idle %d s, want between 1 and 15", got)
	}
	// Just under and at the threshold.
	step(40, 49_000, a)
	if m.seconds("inst-a", now) == 0 {
		t.Fatalf("4.9%% of a vCPU counted as use")
	}
	step(40, 50_000, a)
	idle(0, "5% of a vCPU")

	// What the node cannot tell counts as use.
	step(5, 0, a)
	m.look(now.Add(time.Second), []idleLook{a}, nil, false)
	now = now.Add(time.Second)
	idle(0, "a data plane that did not answer")
	noCgroup := idleLook{ID: "inst-a"}
	step(5, 0, noCgroup)
	idle(0, "no cgroup to read")
	gone := idleLook{ID: "inst-a", Cgroup: "/cg/gone"}
	step(5, 0, gone)
	idle(0, "a cgroup that cannot be read")

	// Stopped: forgotten; back as a new Instance, idle counts anew.
	step(5, 0, a)
	m.look(now, nil, conns, true)
	if len(m.states) != 0 {
		t.Fatalf("a stopped Instance is still measured: %v", m.states)
	}
}

// The meter reads a cgroup v2 cpu.stat as the node does.
func TestIdleMeterReadsCgroup(t *testing.T) {
	dir := t.TempDir()
	write := func(usec int) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "cpu.stat"), fmt.Appendf(nil, "usage_usec %d\nuser_usec 1\nsystem_usec 2\n", usec), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m := idleMeter{readCPU: hostusage.CgroupCPUUsec}
	in := []idleLook{{ID: "inst-a", Cgroup: dir}}
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	write(1_000_000)
	m.look(t0, in, nil, true)
	write(1_100_000) // 0.1 s over 10 s: 1%
	m.look(t0.Add(10*time.Second), in, nil, true)
	if got := m.seconds("inst-a", t0.Add(10*time.Second)); got != 10 {
		t.Fatalf("quiet guest: idle %d s, want 10", got)
	}
	write(4_100_000) // 3 s over 20 s: 15%
	m.look(t0.Add(20*time.Second), in, nil, true)
	if got := m.seconds("inst-a", t0.Add(20*time.Second)); got != 0 {
		t.Fatalf("busy guest: idle %d s, want 0", got)
	}
}
