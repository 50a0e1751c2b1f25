package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

type procCPU struct {
	name string
	pid  int
	tid  int // 0: the whole process
}

// vmProcs finds the VMM of the Instance and, with dp, the data-plane
// process (read-only: their CPU time is all this looks at).
func (b *bench) vmProcs(dp bool) func() []procCPU {
	var qemu, plane int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cl := string(raw)
		switch {
		case strings.Contains(cl, b.dataSock) && strings.Contains(cl, "microvm"):
			qemu = pid
		case strings.Contains(cl, "dataplane\x00--socket-dir") && strings.Contains(cl, b.tmp):
			plane = pid
		}
	}
	return func() []procCPU {
		ps := []procCPU{{name: "bench", pid: os.Getpid()}}
		if qemu != 0 {
			ps = append(ps, procCPU{name: "qemu", pid: qemu})
			tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", qemu))
			for _, t := range tasks {
				tid, _ := strconv.Atoi(t.Name())
				// Threads are unnamed: all but the main loop are the
				// vCPU (TCG) and I/O workers.
				if tid != qemu {
					ps = append(ps, procCPU{name: "qemu-threads", pid: qemu, tid: tid})
				}
			}
		}
		if dp && plane != 0 {
			ps = append(ps, procCPU{name: "dataplane", pid: plane})
		}
		return ps
	}
}

type cpuSnap map[string]float64

func snapshot(procs func() []procCPU) cpuSnap {
	s := cpuSnap{}
	for _, p := range procs() {
		path := fmt.Sprintf("/proc/%d/stat", p.pid)
		if p.tid != 0 {
			path = fmt.Sprintf("/proc/%d/task/%d/stat", p.pid, p.tid)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		s[p.name] += (ut + st) / 100 // USER_HZ
	}
	return s
}

func cpuDelta(a, b cpuSnap, d time.Duration) string {
	var parts []string
	for _, k := range []string{"bench", "bench+agent", "qemu", "qemu-threads", "dataplane", "guest-user", "guest-sys", "guest-irq", "agent-user", "agent-sys"} {
		if v, ok := b[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", k, 100*(v-a[k])/d.Seconds()))
		}
	}
	return "cpu: " + strings.Join(parts, ", ")
}

// guestCPU reads the guest's CPU split (/proc/stat) and the agent's
// (PID 1) with ReadFile; nothing on loopback.
func (b *bench) guestCPU(e pathEnv) cpuSnap {
	s := cpuSnap{}
	if e.diskDir == "" {
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st, one bytes.Buffer
	if _, err := e.c.ReadFile(ctx, "/proc/stat", &st); err != nil {
		return s
	}
	if _, err := e.c.ReadFile(ctx, "/proc/1/stat", &one); err != nil {
		return s
	}
	line, _, _ := strings.Cut(st.String(), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq
	num := func(i int) float64 { v, _ := strconv.ParseFloat(f[i], 64); return v / 100 }
	if len(f) > 7 {
		s["guest-user"] = num(1) + num(2)
		s["guest-sys"] = num(3)
		s["guest-irq"] = num(6) + num(7)
	}
	raw := one.Bytes()
	if i := bytes.LastIndexByte(raw, ')'); i > 0 && i+2 < len(raw) {
		g := strings.Fields(string(raw[i+2:]))
		ut, _ := strconv.ParseFloat(g[11], 64)
		stt, _ := strconv.ParseFloat(g[12], 64)
		s["agent-user"], s["agent-sys"] = ut/100, stt/100
	}
	return s
}

// ---- report ----
