package hostusage

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

const (
	goodStat = "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 100 0 100 700 100 0 0 0 0 0\nintr 1 2 3\n"
	goodMem  = "MemTotal:       1000 kB\nMemFree:         400 kB\nMemAvailable:    500 kB\n"
	goodPSI  = "some avg10=1.00 avg60=25.00 avg300=3.00 total=100\nfull avg10=0.00 avg60=5.00 avg300=0.00 total=10\n"
)

// fakeHost is a fake /proc tree and VM cgroup directory with a fake clock.
type fakeHost struct {
	t    *testing.T
	proc string
	cg   string
	now  time.Time
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	dir := t.TempDir()
	h := &fakeHost{
		t:    t,
		proc: filepath.Join(dir, "proc"),
		cg:   filepath.Join(dir, "kibotos-vmm.slice"),
		now:  time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	h.write("stat", goodStat)
	h.write("meminfo", goodMem)
	h.write("pressure/cpu", goodPSI)
	h.write("pressure/memory", goodPSI)
	return h
}

// write writes a file under the fake /proc.
func (h *fakeHost) write(rel, content string) {
	h.t.Helper()
	writeFile(h.t, filepath.Join(h.proc, rel), content)
}

// writeCgroup creates the VM slice directory with the given files.
func (h *fakeHost) writeCgroup(memCurrent, usageUsec string) {
	h.t.Helper()
	writeFile(h.t, filepath.Join(h.cg, "memory.current"), memCurrent)
	writeFile(h.t, filepath.Join(h.cg, "cpu.stat"), "usage_usec "+usageUsec+"\nuser_usec 1\nsystem_usec 2\n")
}

func (h *fakeHost) remove(rel string) {
	h.t.Helper()
	if err := os.Remove(filepath.Join(h.proc, rel)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *fakeHost) sampler() *Sampler {
	return NewSampler(Config{ProcRoot: h.proc, VMCgroup: h.cg, Now: func() time.Time { return h.now }})
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func meminfoText(totalKB, availKB int) string {
	return fmt.Sprintf("MemTotal: %d kB\nMemAvailable: %d kB\n", totalKB, availKB)
}

func near(got *float64, want float64) bool {
	return got != nil && math.Abs(*got-want) < 1e-9
}

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "nil"
	}
	b, _ := json.Marshal(*p)
	return string(b)
}

func TestCPUIdle(t *testing.T) {
	tests := []struct {
		name string
		next string  // /proc/stat for the second sample; the first is goodStat
		want float64 // -1: nil
	}{
		// deltas: user 200, system 100, idle 600, iowait 100, guest 50.
		// guest is inside user already, so total is 1000, not 1050.
		{"known deltas", "cpu  300 0 200 1300 200 0 0 0 50 0\n", 0.7},
		{"all idle", "cpu  100 0 100 1200 100 0 0 0 0 0\n", 1},
		{"no ticks passed", goodStat, -1},
		{"counters went backwards", "cpu  50 0 50 600 100 0 0 0 0 0\n", -1},
		{"malformed", "cpu  300 x 200 1300 200\n", -1},
		{"no cpu line", "cpu0 1 2 3 4\n", -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			s := h.sampler()
			if got := s.Sample().CPUIdle; got != nil {
				t.Fatalf("first sample CPUIdle = %v, want nil (no previous reading)", *got)
			}
			h.write("stat", tc.next)
			h.now = h.now.Add(10 * time.Second)
			got := s.Sample().CPUIdle
			if tc.want < 0 {
				if got != nil {
					t.Fatalf("CPUIdle = %v, want nil", *got)
				}
				return
			}
			if !near(got, tc.want) {
				t.Fatalf("CPUIdle = %s, want %v", fmtPtr(got), tc.want)
			}
		})
	}
}

// TestCPUIdleOldKernel: a 4-value cpu line (pre-2.6 layout) still works.
func TestCPUIdleOldKernel(t *testing.T) {
	h := newFakeHost(t)
	h.write("stat", "cpu 10 0 10 80\n")
	s := h.sampler()
	s.Sample()
	h.write("stat", "cpu 20 0 20 140\n")
	if got := s.Sample().CPUIdle; !near(got, 0.75) {
		t.Fatalf("CPUIdle = %s, want 0.75", fmtPtr(got))
	}
}

// TestCPUIdleAfterFailedRead: a failed read drops the baseline, so the
// next good reading is a new first reading.
func TestCPUIdleAfterFailedRead(t *testing.T) {
	h := newFakeHost(t)
	s := h.sampler()
	s.Sample()
	h.remove("stat")
	if got := s.Sample().CPUIdle; got != nil {
		t.Fatalf("CPUIdle with no /proc/stat = %v, want nil", *got)
	}
	h.write("stat", "cpu  300 0 200 1300 200 0 0 0 0 0\n")
	if got := s.Sample().CPUIdle; got != nil {
		t.Fatalf("CPUIdle right after a failed read = %v, want nil", *got)
	}
}

func TestMemoryTightHysteresis(t *testing.T) {
	type step struct {
		availPct int // of a 1000 kB total; -1: meminfo unreadable
		tight    bool
		since    int // index of the step whose time is expected; -1: nil
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"enter and leave", []step{
			{50, false, -1},
			{9, true, 1},
			{12, true, 1},
			{16, false, -1},
		}},
		{"boundaries are strict", []step{
			{10, false, -1}, // not below 10%
			{9, true, 1},
			{15, true, 1}, // not above 15%
			{15, true, 1},
			{20, false, -1},
			{12, false, -1}, // re-entering needs < 10% again
			{5, true, 6},    // a new episode gets a new since
		}},
		{"unreadable keeps state", []step{
			{5, true, 0},
			{-1, true, 0},
			{50, false, -1},
			{-1, false, -1},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			s := h.sampler()
			start := h.now
			for i, st := range tc.steps {
				h.now = start.Add(time.Duration(i) * 10 * time.Second)
				if st.availPct < 0 {
					h.write("meminfo", "garbage\n")
				} else {
					h.write("meminfo", meminfoText(1000, st.availPct*10))
				}
				u := s.Sample()
				if u.MemoryTight != st.tight {
					t.Fatalf("step %d (%d%%): MemoryTight = %v, want %v", i, st.availPct, u.MemoryTight, st.tight)
				}
				if st.since < 0 {
					if u.MemoryTightSince != nil {
						t.Fatalf("step %d: MemoryTightSince = %v, want nil", i, *u.MemoryTightSince)
					}
					continue
				}
				want := start.Add(time.Duration(st.since) * 10 * time.Second)
				if u.MemoryTightSince == nil || !u.MemoryTightSince.Equal(want) {
					t.Fatalf("step %d: MemoryTightSince = %s, want %v", i, fmtPtr(u.MemoryTightSince), want)
				}
			}
		})
	}
}

func TestMemoryItems(t *testing.T) {
	tests := []struct {
		name         string
		meminfo      string
		total, avail string // JSON of the pointer, "nil" when absent
	}{
		{"good", goodMem, "1024000", "512000"},
		{"no MemAvailable (pre-3.14)", "MemTotal: 1000 kB\nMemFree: 10 kB\n", "1024000", "nil"},
		{"bad MemAvailable keeps MemTotal", "MemTotal: 1000 kB\nMemAvailable: lots kB\n", "1024000", "nil"},
		{"zero total", "MemTotal: 0 kB\nMemAvailable: 0 kB\n", "nil", "0"},
		{"no unit", "MemTotal: 1000\nMemAvailable: 500\n", "nil", "nil"},
		{"overflow", "MemTotal: 18446744073709551615 kB\nMemAvailable: 1 kB\n", "nil", "1024"},
		{"empty", "", "nil", "nil"},
		{"binary", "\x00\xff:\x00\n:\n::::", "nil", "nil"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			h.write("meminfo", tc.meminfo)
			u := h.sampler().Sample()
			if got := fmtPtr(u.MemoryTotalBytes); got != tc.total {
				t.Errorf("MemoryTotalBytes = %s, want %s", got, tc.total)
			}
			if got := fmtPtr(u.MemoryAvailableBytes); got != tc.avail {
				t.Errorf("MemoryAvailableBytes = %s, want %s", got, tc.avail)
			}
			if u.MemoryTight {
				t.Errorf("MemoryTight set from incomplete meminfo")
			}
		})
	}
}

func TestPressure(t *testing.T) {
	tests := []struct {
		name     string
		cpu, mem string // file contents; "" with missing set: file absent
		missing  bool
		// want values as JSON, "nil" when absent
		cpuSome, cpuFull, memSome, memFull string
	}{
		{name: "both files", cpu: goodPSI, mem: "some avg10=0 avg60=0.00 avg300=0 total=0\nfull avg10=0 avg60=100.00 avg300=0 total=0\n",
			cpuSome: "0.25", cpuFull: "0.05", memSome: "0", memFull: "1"},
		{name: "cpu without full line (pre-5.13)", cpu: "some avg10=1.00 avg60=50.00 avg300=3.00 total=100\n", mem: goodPSI,
			cpuSome: "0.5", cpuFull: "nil", memSome: "0.25", memFull: "0.05"},
		{name: "missing files", missing: true,
			cpuSome: "nil", cpuFull: "nil", memSome: "nil", memFull: "nil"},
		{name: "malformed values", cpu: "some avg10=1 avg60=abc total=1\nfull avg10=1 avg60=NaN\n", mem: "some avg60=150\nfull avg60=-1\n",
			cpuSome: "nil", cpuFull: "nil", memSome: "nil", memFull: "nil"},
		{name: "no avg60 / no some line", cpu: "some avg10=1.00\nfull avg10=0 avg60=2.00\n", mem: "full avg60=3.00\n",
			cpuSome: "nil", cpuFull: "0.02", memSome: "nil", memFull: "0.03"},
		{name: "garbage", cpu: "\x00\xff=\n= = =\nsome\nfull =\n", mem: "some avg60=\n",
			cpuSome: "nil", cpuFull: "nil", memSome: "nil", memFull: "nil"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			if tc.missing {
				h.remove("pressure/cpu")
				h.remove("pressure/memory")
			} else {
				h.write("pressure/cpu", tc.cpu)
				h.write("pressure/memory", tc.mem)
			}
			u := h.sampler().Sample()
			for _, c := range []struct {
				field     string
				got, want string
			}{
				{"CPUPressureSome", fmtPtr(u.CPUPressureSome), tc.cpuSome},
				{"CPUPressureFull", fmtPtr(u.CPUPressureFull), tc.cpuFull},
				{"MemoryPressureSome", fmtPtr(u.MemoryPressureSome), tc.memSome},
				{"MemoryPressureFull", fmtPtr(u.MemoryPressureFull), tc.memFull},
			} {
				if c.got != c.want {
					t.Errorf("%s = %s, want %s", c.field, c.got, c.want)
				}
			}
		})
	}
}

func TestVMCgroup(t *testing.T) {
	t.Run("no cgroup configured", func(t *testing.T) {
		h := newFakeHost(t)
		s := NewSampler(Config{ProcRoot: h.proc, Now: func() time.Time { return h.now }})
		s.Sample()
		if u := s.Sample(); u.VMCPUCores != nil || u.VMMemoryBytes != nil {
			t.Fatalf("VM items = %s, %s; want nil", fmtPtr(u.VMCPUCores), fmtPtr(u.VMMemoryBytes))
		}
	})
	t.Run("missing cgroup dir", func(t *testing.T) {
		h := newFakeHost(t) // h.cg is never created
		s := h.sampler()
		s.Sample()
		h.now = h.now.Add(10 * time.Second)
		if u := s.Sample(); u.VMCPUCores != nil || u.VMMemoryBytes != nil {
			t.Fatalf("VM items = %s, %s; want nil", fmtPtr(u.VMCPUCores), fmtPtr(u.VMMemoryBytes))
		}
	})

	tests := []struct {
		name      string
		next      string        // usage_usec at the second sample; the first is 1000000
		wall      time.Duration // clock advance between samples
		wantCores float64       // -1: nil
	}{
		{"two cores", "21000000", 10 * time.Second, 2},
		{"idle VMs", "1000000", 10 * time.Second, 0},
		{"half a core over 2s", "2000000", 2 * time.Second, 0.5},
		{"slice recreated", "5", 10 * time.Second, -1},
		{"clock did not move", "21000000", 0, -1},
		{"malformed", "lots", 10 * time.Second, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t)
			h.writeCgroup("123456\n", "1000000")
			s := h.sampler()
			u := s.Sample()
			if u.VMCPUCores != nil {
				t.Fatalf("first sample VMCPUCores = %v, want nil (no previous reading)", *u.VMCPUCores)
			}
			if fmtPtr(u.VMMemoryBytes) != "123456" {
				t.Fatalf("VMMemoryBytes = %s, want 123456", fmtPtr(u.VMMemoryBytes))
			}
			h.writeCgroup("654321\n", tc.next)
			h.now = h.now.Add(tc.wall)
			u = s.Sample()
			if fmtPtr(u.VMMemoryBytes) != "654321" {
				t.Errorf("VMMemoryBytes = %s, want 654321", fmtPtr(u.VMMemoryBytes))
			}
			if tc.wantCores < 0 {
				if u.VMCPUCores != nil {
					t.Fatalf("VMCPUCores = %v, want nil", *u.VMCPUCores)
				}
				return
			}
			if !near(u.VMCPUCores, tc.wantCores) {
				t.Fatalf("VMCPUCores = %s, want %v", fmtPtr(u.VMCPUCores), tc.wantCores)
			}
		})
	}

	t.Run("malformed memory.current", func(t *testing.T) {
		h := newFakeHost(t)
		h.writeCgroup("max\n", "1")
		if u := h.sampler().Sample(); u.VMMemoryBytes != nil {
			t.Fatalf("VMMemoryBytes = %d, want nil", *u.VMMemoryBytes)
		}
	})
}

// TestParsersMalformed feeds every parser junk: each must return an error
// rather than panic.
func TestParsersMalformed(t *testing.T) {
	inputs := []string{
		"", "\n", "\x00", "cpu", "cpu \n", "cpu 1 2 3\n", "cpu -1 2 3 4\n",
		"cpu 18446744073709551615 18446744073709551615 0 0\n",
		"MemTotal:\n", "MemTotal: kB\n", ":::\n", "some\n", "some avg60\n", "full avg60=1\n",
		"usage_usec\n", "usage_usec 1 2\n", "usage_usec -3\n", "-1\n", "1.5\n",
	}
	for _, in := range inputs {
		data := []byte(in)
		if _, err := parseProcStat(data); err == nil {
			t.Errorf("parseProcStat(%q): no error", in)
		}
		if _, err := parseMeminfo(data); err == nil {
			t.Errorf("parseMeminfo(%q): no error", in)
		}
		if _, err := parsePSI(data); err == nil {
			t.Errorf("parsePSI(%q): no error", in)
		}
		if _, err := parseUint(data); err == nil {
			t.Errorf("parseUint(%q): no error", in)
		}
		if _, err := parseCPUStatUsage(data); err == nil {
			t.Errorf("parseCPUStatUsage(%q): no error", in)
		}
	}
}

func TestErrorsNameTheFile(t *testing.T) {
	h := newFakeHost(t)
	h.write("stat", "cpu 1\n")
	path := filepath.Join(h.proc, "stat")
	if _, err := readParsed(path, parseProcStat); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("error %v does not name %s", err, path)
	}
	missing := filepath.Join(h.proc, "nope")
	if _, err := readParsed(missing, parseProcStat); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("error %v does not name %s", err, missing)
	}
}

func TestLatestAndRun(t *testing.T) {
	h := newFakeHost(t)
	s := h.sampler()
	if got := s.Latest(); !got.SampledAt.IsZero() || got.MemoryTotalBytes != nil {
		t.Fatalf("Latest before any sample = %+v, want zero", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Run(ctx) // samples once, then sees ctx done
	if got := s.Latest(); !got.SampledAt.Equal(h.now) || fmtPtr(got.MemoryTotalBytes) != "1024000" {
		t.Fatalf("Latest after Run = %+v, want a sample at %v", got, h.now)
	}
}

// TestConcurrent is for -race: Sample and Latest from several goroutines.
func TestConcurrent(t *testing.T) {
	h := newFakeHost(t)
	h.writeCgroup("1\n", "1")
	s := NewSampler(Config{ProcRoot: h.proc, VMCgroup: h.cg}) // real clock: h.now is not safe to share
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				s.Sample()
				_ = s.Latest()
			}
		})
	}
	wg.Wait()
}

func TestJSON(t *testing.T) {
	h := newFakeHost(t)
	h.remove("pressure/cpu")
	b, err := json.Marshal(h.sampler().Sample())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"sampled_at", "memory_tight", "memory_total_bytes", "memory_available_bytes", "memory_pressure_some", "memory_pressure_full"} {
		if _, ok := m[k]; !ok {
			t.Errorf("%s missing from %s", k, b)
		}
	}
	// Unreadable items are left out, not sent as 0.
	for _, k := range []string{"cpu_idle", "cpu_pressure_some", "cpu_pressure_full", "vm_cpu_cores", "vm_memory_bytes", "memory_tight_since"} {
		if _, ok := m[k]; ok {
			t.Errorf("%s present in %s, want omitted", k, b)
		}
	}
}

// TestRealProc reads this machine's /proc.
func TestRealProc(t *testing.T) {
	if runtime.GOOS != "linux" {
		testenv.Skipf(t, "needs Linux /proc")
	}
	u := NewSampler(Config{}).Sample()
	if u.MemoryTotalBytes == nil || *u.MemoryTotalBytes == 0 {
		t.Errorf("MemoryTotalBytes = %s, want > 0", fmtPtr(u.MemoryTotalBytes))
	}
	if u.MemoryAvailableBytes == nil || *u.MemoryAvailableBytes == 0 {
		t.Errorf("MemoryAvailableBytes = %s, want > 0", fmtPtr(u.MemoryAvailableBytes))
	}
}
