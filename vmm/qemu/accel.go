package qemu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Accel is the QEMU accelerator setting.
type Accel string

const (
	AccelAuto Accel = "auto"
	AccelKVM  Accel = "kvm"
	AccelTCG  Accel = "tcg"
)

// ParseAccel checks a configured accel value; "" means auto.
func ParseAccel(s string) (Accel, error) {
	switch a := Accel(strings.ToLower(strings.TrimSpace(s))); a {
	case "", AccelAuto:
		return AccelAuto, nil
	case AccelKVM, AccelTCG:
		return a, nil
	}
	return "", fmt.Errorf("accel %q: want auto, kvm or tcg", s)
}

// Host is the view of the host the accelerator choice is made from. Tests
// point the roots at fake trees.
type Host struct {
	ProcRoot string // default /proc
	SysRoot  string // default /sys
	DevRoot  string // default /dev
	// ProbeKVM opens the KVM device and checks it answers; default: open
	// read-write and KVM_GET_API_VERSION == 12.
	ProbeKVM func(path string) error
}

func (h Host) proc(p ...string) string {
	return filepath.Join(append([]string{or(h.ProcRoot, "/proc")}, p...)...)
}
func (h Host) sys(p ...string) string {
	return filepath.Join(append([]string{or(h.SysRoot, "/sys")}, p...)...)
}
func (h Host) dev(p ...string) string {
	return filepath.Join(append([]string{or(h.DevRoot, "/dev")}, p...)...)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Choice is the accelerator picked and why, for the log.
type Choice struct {
	Accel  Accel
	Reason string
}

// SelectAccel resolves the configured accel. auto picks KVM only on real
// hardware virtualisation: /dev/kvm usable, not PVM (a stock guest kernel
// dies under kvm_pvm) and vmx or svm in /proc/cpuinfo; otherwise TCG.
// An explicit kvm fails when /dev/kvm is unusable and never falls back.
func SelectAccel(want Accel, h Host) (Choice, error) {
	want, err := ParseAccel(string(want))
	if err != nil {
		return Choice{}, err
	}
	if want == AccelTCG {
		return Choice{AccelTCG, "accel=tcg configured"}, nil
	}
	kvmErr := h.probeKVM()
	pvm := h.isPVM()
	flag, cpuErr := h.virtFlag()
	if want == AccelKVM {
		if kvmErr != nil {
			return Choice{}, fmt.Errorf("accel=kvm configured but %w", kvmErr)
		}
		reason := "accel=kvm configured"
		if pvm {
			reason += " (warning: KVM is PVM here; a stock guest kernel will not boot)"
		}
		return Choice{AccelKVM, reason}, nil
	}
	switch {
	case kvmErr != nil:
		return Choice{AccelTCG, "accel=auto: " + kvmErr.Error()}, nil
	case pvm:
		return Choice{AccelTCG, "accel=auto: KVM is PVM (" + h.sys("module", "kvm_pvm") + " exists), which cannot run a stock guest kernel"}, nil
	case cpuErr != nil:
		return Choice{AccelTCG, "accel=auto: " + cpuErr.Error()}, nil
	case flag == "":
		return Choice{AccelTCG, "accel=auto: no vmx or svm flag in " + h.proc("cpuinfo")}, nil
	}
	return Choice{AccelKVM, "accel=auto: " + h.dev("kvm") + " usable and the CPU has " + flag}, nil
}

func (h Host) probeKVM() error {
	path := h.dev("kvm")
	probe := h.ProbeKVM
	if probe == nil {
		probe = probeKVMDevice
	}
	if err := probe(path); err != nil {
		return fmt.Errorf("%s is not usable: %w", path, err)
	}
	return nil
}

func probeKVMDevice(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	const kvmGetAPIVersion = 0xAE00 // _IO(KVMIO, 0x00)
	v, err := unix.IoctlRetInt(int(f.Fd()), kvmGetAPIVersion)
	if err != nil {
		return fmt.Errorf("KVM_GET_API_VERSION: %w", err)
	}
	if v != 12 {
		return fmt.Errorf("KVM API version %d, want 12", v)
	}
	return nil
}

func (h Host) isPVM() bool {
	_, err := os.Stat(h.sys("module", "kvm_pvm"))
	return err == nil
}

// virtFlag returns "vmx" or "svm" if the first CPU of /proc/cpuinfo has it.
func (h Host) virtFlag() (string, error) {
	b, err := os.ReadFile(h.proc("cpuinfo"))
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "flags" {
			continue
		}
		for _, f := range strings.Fields(v) {
			if f == "vmx" || f == "svm" {
				return f, nil
			}
		}
		return "", nil
	}
	return "", nil
}

// TSCKHz is the host TSC frequency estimate for tsc_early_khz= (the first
// "cpu MHz" of /proc/cpuinfo × 1000). Under TCG the guest's TSC calibration
// otherwise hangs in most boots.
func (h Host) TSCKHz() (int, error) {
	b, err := os.ReadFile(h.proc("cpuinfo"))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || mhz <= 0 {
			return 0, fmt.Errorf("%s: bad cpu MHz %q", h.proc("cpuinfo"), strings.TrimSpace(v))
		}
		return int(mhz*1000 + 0.5), nil
	}
	return 0, errors.New(h.proc("cpuinfo") + " has no cpu MHz line")
}
