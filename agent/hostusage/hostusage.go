// Package hostusage owns the host usage readings a Kibotos node reports to
// its control plane: memory and CPU from /proc, pressure stall information
// (PSI) from /proc/pressure, and CPU and memory of the VM cgroup slice.
//
// It only reads; it never writes anything to /proc, /sys or the cgroup tree.
// An item that cannot be read or parsed is absent (a nil pointer, "-" in the
// CLI), never 0: a made-up 0 would look like an idle or empty host to the
// scheduler.
package hostusage

import (
	"context"
	"path/filepath"
	"sync"
	"time"
)

// Usage is one sample. Pointer fields are nil when the item could not be
// read ("-" in the CLI), never 0.
type Usage struct {
	SampledAt time.Time `json:"sampled_at"`
	// VMCPUCores is the CPU used by all VMs, in cores, averaged since the
	// previous sample (from cpu.stat usage_usec of the VM slice).
	VMCPUCores *float64 `json:"vm_cpu_cores,omitempty"`
	// VMMemoryBytes is memory.current of the VM slice.
	VMMemoryBytes    *uint64 `json:"vm_memory_bytes,omitempty"`
	MemoryTotalBytes *uint64 `json:"memory_total_bytes,omitempty"`
	// MemoryAvailableBytes is MemAvailable from /proc/meminfo.
	MemoryAvailableBytes *uint64 `json:"memory_available_bytes,omitempty"`
	// MemoryTight is set with hysteresis: on below 10% available, off only
	// above 15%, so a host hovering near the line does not flap.
	MemoryTight bool `json:"memory_tight"`
	// MemoryTightSince is the SampledAt of the sample that turned
	// MemoryTight on; nil while not tight.
	MemoryTightSince *time.Time `json:"memory_tight_since,omitempty"`
	// CPUIdle is the idle fraction 0..1 of the whole host over the interval
	// since the previous sample: (idle+iowait)/total from /proc/stat.
	CPUIdle *float64 `json:"cpu_idle,omitempty"`
	// Pressure items are PSI avg60 as a fraction 0..1.
	CPUPressureSome    *float64 `json:"cpu_pressure_some,omitempty"`
	CPUPressureFull    *float64 `json:"cpu_pressure_full,omitempty"`
	MemoryPressureSome *float64 `json:"memory_pressure_some,omitempty"`
	MemoryPressureFull *float64 `json:"memory_pressure_full,omitempty"`
}

// Config configures a Sampler. Zero values get the defaults noted.
type Config struct {
	ProcRoot string // default "/proc"; tests point it at a fake tree
	// VMCgroup is the absolute path of the VM slice cgroup directory, e.g.
	// /sys/fs/cgroup/kibotos.slice/kibotos-vmm.slice under the host's
	// systemd (runtime.Runtime.VMSliceCgroup). Empty or missing
	// means the VM items are nil.
	VMCgroup string
	Interval time.Duration    // default 10 s
	Now      func() time.Time // default time.Now
}

const (
	defaultProcRoot = "/proc"
	defaultInterval = 10 * time.Second

	tightBelow = 0.10 // available/total under this turns MemoryTight on
	relaxAbove = 0.15 // ... and only over this turns it off again
)

// Sampler takes Usage samples and keeps the state that spans samples: the
// previous counter readings for rates, and the memory-tight hysteresis.
type Sampler struct {
	procRoot string
	vmCgroup string
	interval time.Duration
	now      func() time.Time

	// sampleMu serialises Sample: rates are deltas between consecutive
	// readings, so two samples must not interleave.
	sampleMu   sync.Mutex
	prevCPU    *cpuTimes    // nil: no usable previous /proc/stat reading
	prevVM     *vmCPUSample // nil: no usable previous cpu.stat reading
	tight      bool
	tightSince time.Time

	// mu guards latest alone, so Latest never waits for file reads.
	mu     sync.Mutex
	latest Usage
}

// vmCPUSample is a cpu.stat usage_usec reading and when it was taken.
type vmCPUSample struct {
	usec uint64
	at   time.Time
}

// NewSampler returns a Sampler; it reads nothing until Sample or Run.
func NewSampler(cfg Config) *Sampler {
	s := &Sampler{
		procRoot: cfg.ProcRoot,
		vmCgroup: cfg.VMCgroup,
		interval: cfg.Interval,
		now:      cfg.Now,
	}
	if s.procRoot == "" {
		s.procRoot = defaultProcRoot
	}
	if s.interval <= 0 {
		s.interval = defaultInterval
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// Sample reads everything once, updates the memory-tight hysteresis and
// returns the reading. Safe for concurrent use with Latest.
//
// Read and parse errors are not returned or logged: the nil item is the
// report, and logging a missing file every tick would only be noise.
//
// CPUIdle and VMCPUCores are rates of cumulative counters, so they need a
// previous reading: they are nil on the first Sample, and again on the
// sample after a failed read, a counter going backwards (e.g. the VM slice
// was recreated) or no time passing. A rate against a missing or stale
// baseline would be a guess, and a guess must not look like a measurement.
func (s *Sampler) Sample() Usage {
	s.sampleMu.Lock()
	defer s.sampleMu.Unlock()

	now := s.now()
	u := Usage{SampledAt: now}
	s.readMemory(&u, now)
	u.CPUIdle = s.readCPUIdle()
	cpu, _ := readParsed(filepath.Join(s.procRoot, "pressure", "cpu"), parsePSI)
	u.CPUPressureSome, u.CPUPressureFull = cpu.some, cpu.full
	mem, _ := readParsed(filepath.Join(s.procRoot, "pressure", "memory"), parsePSI)
	u.MemoryPressureSome, u.MemoryPressureFull = mem.some, mem.full
	s.readVM(&u, now)

	s.mu.Lock()
	s.latest = u
	s.mu.Unlock()
	return u
}

// Latest returns the most recent sample (zero Usage with SampledAt zero
// before the first).
func (s *Sampler) Latest() Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest
}

// Run samples immediately and then every Interval until ctx is done.
func (s *Sampler) Run(ctx context.Context) {
	s.Sample()
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sample()
		}
	}
}

// readMemory fills the memory items and steps the tight hysteresis. If
// total or available is unreadable the previous tight state is kept: one
// bad read is no evidence that the pressure went away or arrived.
func (s *Sampler) readMemory(u *Usage, now time.Time) {
	m, _ := readParsed(filepath.Join(s.procRoot, "meminfo"), parseMeminfo)
	u.MemoryTotalBytes, u.MemoryAvailableBytes = m.total, m.avail
	if m.total != nil && m.avail != nil { // parseMeminfo never yields a zero total
		free := float64(*m.avail) / float64(*m.total)
		switch {
		case !s.tight && free < tightBelow:
			s.tight, s.tightSince = true, now
		case s.tight && free > relaxAbove:
			s.tight = false
		}
	}
	u.MemoryTight = s.tight
	if s.tight {
		since := s.tightSince // a copy: Usage values are handed out and must not share state
		u.MemoryTightSince = &since
	}
}

// readCPUIdle returns the idle fraction since the previous /proc/stat reading.
func (s *Sampler) readCPUIdle() *float64 {
	cur, err := readParsed(filepath.Join(s.procRoot, "stat"), parseProcStat)
	if err != nil {
		s.prevCPU = nil
		return nil
	}
	prev := s.prevCPU
	s.prevCPU = &cur
	if prev == nil || cur.total <= prev.total || cur.idle < prev.idle {
		return nil
	}
	idle := float64(cur.idle-prev.idle) / float64(cur.total-prev.total)
	// iowait may step backwards while other fields advance; keep the
	// fraction inside its documented range.
	idle = min(idle, 1)
	return &idle
}

// readVM fills the VM slice items. A missing directory simply fails both
// reads, which is the "no VM slice" case.
func (s *Sampler) readVM(u *Usage, now time.Time) {
	if s.vmCgroup == "" {
		return
	}
	if v, err := readParsed(filepath.Join(s.vmCgroup, "memory.current"), parseUint); err == nil {
		u.VMMemoryBytes = &v
	}
	usec, err := CgroupCPUUsec(s.vmCgroup)
	if err != nil {
		s.prevVM = nil
		return
	}
	cur := vmCPUSample{usec: usec, at: now}
	prev := s.prevVM
	s.prevVM = &cur
	if prev == nil || cur.usec < prev.usec {
		return
	}
	wall := cur.at.Sub(prev.at).Seconds()
	if wall <= 0 {
		return
	}
	cores := float64(cur.usec-prev.usec) / 1e6 / wall
	u.VMCPUCores = &cores
}
