package hostusage

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The parsers below take file contents and never panic: anything they do
// not understand is an error, and the caller leaves the item nil.

// readParsed reads path and parses it. Read errors already name the file
// (*fs.PathError); parse errors are wrapped so they do too. The parsed value
// is returned even with a parse error, so items that did parse survive.
func readParsed[T any](path string, parse func([]byte) (T, error)) (T, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := parse(data)
	if err != nil {
		return v, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// cpuTimes is the aggregate "cpu" line of /proc/stat, reduced to what the
// idle fraction needs. Units are USER_HZ ticks; only ratios are used.
type cpuTimes struct {
	idle  uint64 // idle + iowait
	total uint64 // user..steal
}

// parseProcStat parses the aggregate "cpu" line of /proc/stat. Fields are
// user nice system idle iowait irq softirq steal guest guest_nice; old
// kernels have fewer. guest and guest_nice are already counted in user and
// nice, so adding them would count guest time twice.
func parseProcStat(data []byte) (cpuTimes, error) {
	for line := range strings.Lines(string(data)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "cpu" { // "cpu0".. are per-CPU lines
			continue
		}
		vals := fields[1:]
		if len(vals) < 4 {
			return cpuTimes{}, fmt.Errorf("cpu line has %d values, want at least 4", len(vals))
		}
		vals = vals[:min(len(vals), 10)] // fields a future kernel adds have unknown meaning
		var t cpuTimes
		for i, f := range vals {
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return cpuTimes{}, fmt.Errorf("cpu value %d: %w", i+1, err)
			}
			if i >= 8 { // guest, guest_nice
				continue
			}
			var carry uint64
			if t.total, carry = bits.Add64(t.total, v, 0); carry != 0 {
				return cpuTimes{}, errors.New("cpu values overflow")
			}
			if i == 3 || i == 4 { // idle, iowait; both are part of total, so no overflow
				t.idle += v
			}
		}
		return t, nil
	}
	return cpuTimes{}, errors.New(`no aggregate "cpu" line`)
}

// meminfo holds the /proc/meminfo items used; each is nil if absent or bad.
type meminfo struct {
	total, avail *uint64
}

// parseMeminfo reads MemTotal and MemAvailable (kB in the file, bytes here).
// MemAvailable is missing on kernels before 3.14; that item is then nil.
func parseMeminfo(data []byte) (meminfo, error) {
	var m meminfo
	var errs []error
	seen := map[string]bool{}
	for line := range strings.Lines(string(data)) {
		key, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst **uint64
		switch key {
		case "MemTotal":
			dst = &m.total
		case "MemAvailable":
			dst = &m.avail
		default:
			continue
		}
		seen[key] = true
		v, err := parseKB(rest)
		if err == nil && key == "MemTotal" && v == 0 {
			err = errors.New("zero") // a host has memory; 0 means a broken file
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
			continue
		}
		*dst = &v
	}
	for _, key := range []string{"MemTotal", "MemAvailable"} {
		if !seen[key] {
			errs = append(errs, fmt.Errorf("no %s line", key))
		}
	}
	return m, errors.Join(errs...)
}

// parseKB parses the " 16384000 kB" part of a meminfo line into bytes.
func parseKB(s string) (uint64, error) {
	f := strings.Fields(s)
	if len(f) != 2 || f[1] != "kB" {
		return 0, fmt.Errorf("want \"<n> kB\", got %q", strings.TrimSpace(s))
	}
	v, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return 0, err
	}
	if v > math.MaxUint64/1024 {
		return 0, errors.New("value overflows bytes")
	}
	return v * 1024, nil
}

// psi holds avg60 of a /proc/pressure file as a fraction 0..1.
type psi struct {
	some, full *float64
}

// parsePSI parses lines like "some avg10=0.30 avg60=0.85 avg300=0.73 total=3665306".
// A missing "full" line is not an error: /proc/pressure/cpu had none before
// Linux 5.13. A missing "some" line is, as every PSI file has one.
func parsePSI(data []byte) (psi, error) {
	var p psi
	var errs []error
	sawSome := false
	for line := range strings.Lines(string(data)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		var dst **float64
		switch fields[0] {
		case "some":
			dst, sawSome = &p.some, true
		case "full":
			dst = &p.full
		default:
			continue
		}
		v, err := psiAvg60(fields[1:])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s line: %w", fields[0], err))
			continue
		}
		*dst = &v
	}
	if !sawSome {
		errs = append(errs, errors.New(`no "some" line`))
	}
	return p, errors.Join(errs...)
}

// psiAvg60 finds avg60=<percent> and returns it as a fraction.
func psiAvg60(fields []string) (float64, error) {
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k != "avg60" {
			continue
		}
		pct, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("avg60: %w", err)
		}
		if !(pct >= 0 && pct <= 100) { // also rejects NaN, which ParseFloat accepts
			return 0, fmt.Errorf("avg60 %q out of range 0..100", v)
		}
		return pct / 100, nil
	}
	return 0, errors.New("no avg60")
}

// parseUint parses a single-number cgroup file such as memory.current.
func parseUint(data []byte) (uint64, error) {
	return strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
}

// CgroupCPUUsec reads usage_usec from the cgroup v2 directory dir: the
// CPU time its processes used, in microseconds.
func CgroupCPUUsec(dir string) (uint64, error) {
	return readParsed(filepath.Join(dir, "cpu.stat"), parseCPUStatUsage)
}

// parseCPUStatUsage returns usage_usec from a cgroup v2 cpu.stat file.
func parseCPUStatUsage(data []byte) (uint64, error) {
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "usage_usec" {
			continue
		}
		if len(f) != 2 {
			return 0, fmt.Errorf("usage_usec line has %d fields, want 2", len(f))
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("usage_usec: %w", err)
		}
		return v, nil
	}
	return 0, errors.New("no usage_usec line")
}
