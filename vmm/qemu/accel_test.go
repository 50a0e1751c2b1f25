package qemu

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeHost builds /proc, /sys and /dev roots under a temp dir.
func fakeHost(t *testing.T, cpuFlags string, pvm, kvmOK bool) Host {
	t.Helper()
	root := t.TempDir()
	h := Host{ProcRoot: filepath.Join(root, "proc"), SysRoot: filepath.Join(root, "sys"), DevRoot: filepath.Join(root, "dev")}
	for _, d := range []string{h.ProcRoot, h.SysRoot, h.DevRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cpuinfo := "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu MHz\t\t: 2596.140\nflags\t\t: fpu vme " + cpuFlags + " sse2\n\nprocessor\t: 1\ncpu MHz\t\t: 1000.000\nflags\t\t: fpu vmx\n"
	if err := os.WriteFile(filepath.Join(h.ProcRoot, "cpuinfo"), []byte(cpuinfo), 0o644); err != nil {
		t.Fatal(err)
	}
	if pvm {
		if err := os.MkdirAll(filepath.Join(h.SysRoot, "module", "kvm_pvm"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.ProbeKVM = func(path string) error {
		if path != filepath.Join(h.DevRoot, "kvm") {
			t.Errorf("probe of %s, want the fake dev root", path)
		}
		if !kvmOK {
			return errors.New("no such device")
		}
		return nil
	}
	return h
}

func TestSelectAccel(t *testing.T) {
	cases := []struct {
		name      string
		want      Accel
		flags     string
		pvm, kvm  bool
		got       Accel
		reason    string
		expectErr bool
	}{
		{"auto vmx", AccelAuto, "vmx", false, true, AccelKVM, "CPU has vmx", false},
		{"auto svm", "", "svm", false, true, AccelKVM, "CPU has svm", false},
		{"auto pvm", AccelAuto, "vmx", true, true, AccelTCG, "PVM", false},
		{"auto no flag", AccelAuto, "", false, true, AccelTCG, "no vmx or svm", false},
		{"auto no kvm", AccelAuto, "vmx", false, false, AccelTCG, "not usable", false},
		{"tcg forced", AccelTCG, "vmx", false, true, AccelTCG, "configured", false},
		{"kvm forced on pvm", AccelKVM, "", true, true, AccelKVM, "warning: KVM is PVM", false},
		{"kvm forced unusable", AccelKVM, "vmx", false, false, "", "not usable", true},
		{"bogus", "xen", "vmx", false, true, "", "want auto, kvm or tcg", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := fakeHost(t, tc.flags, tc.pvm, tc.kvm)
			ch, err := SelectAccel(tc.want, h)
			if tc.expectErr {
				if err == nil || !strings.Contains(err.Error(), tc.reason) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ch.Accel != tc.got || !strings.Contains(ch.Reason, tc.reason) {
				t.Fatalf("got %s (%q), want %s with %q", ch.Accel, ch.Reason, tc.got, tc.reason)
			}
		})
	}
}

func TestTSCKHz(t *testing.T) {
	h := fakeHost(t, "", false, false)
	khz, err := h.TSCKHz()
	if err != nil {
		t.Fatal(err)
	}
	if khz != 2596140 {
		t.Fatalf("TSCKHz = %d, want 2596140 (first cpu MHz × 1000)", khz)
	}
	if err := os.WriteFile(filepath.Join(h.ProcRoot, "cpuinfo"), []byte("processor\t: 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := h.TSCKHz(); err == nil {
		t.Fatal("no cpu MHz line: want an error")
	}
}

// The machines this project is developed on are PVM: make sure the real
// detection says TCG there, and whatever it says comes with a reason.
func TestSelectAccelThisHost(t *testing.T) {
	ch, err := SelectAccel(AccelAuto, Host{})
	if err != nil {
		t.Fatal(err)
	}
	if ch.Reason == "" {
		t.Fatal("no reason given")
	}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil && ch.Accel != AccelTCG {
		t.Fatalf("PVM host: got %s (%s), want tcg", ch.Accel, ch.Reason)
	}
	t.Logf("this host: %s (%s)", ch.Accel, ch.Reason)
}
