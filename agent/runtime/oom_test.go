package runtime

import (
	"os"
	"path/filepath"
	"testing"
)

// The two witnesses of an OOM kill: the unit's result in the VMM log, and
// the kernel's record of the kill, which counts only for the recorded PID
// and only after the process started.
func TestOOMWitnesses(t *testing.T) {
	log := filepath.Join(t.TempDir(), "vmm.log")
	os.WriteFile(log, []byte("qemu: something\n"+VMMExitedLine+" result=signal code=killed status=KILL\n"), 0o600)
	if got := vmmExitResult(log); got != "signal" {
		t.Errorf("result of a killed VMM: %q", got)
	}
	os.WriteFile(log, []byte(VMMExitedLine+" result=success code=exited status=0\n"+VMMExitedLine+" result=oom-kill code=killed status=KILL\n"), 0o600)
	if got := vmmExitResult(log); got != unitResultOOM {
		t.Errorf("result of an OOM-killed VMM: %q", got)
	}
	if got := vmmExitResult(filepath.Join(t.TempDir(), "none")); got != "" {
		t.Errorf("result without a log: %q", got)
	}

	const start = 5000 // ticks: 50 s after boot
	kill := "3,1234,60000000,-;Memory cgroup out of memory: Killed process 4242 (qemu-system-x86) total-vm:1048576kB, anon-rss:200000kB\n"
	for _, c := range []struct {
		rec  string
		pid  string
		want bool
	}{
		{kill, "4242", true},
		{kill, "424", false},
		{"3,1234,40000000,-;Out of memory: Killed process 4242 (qemu-system-x86)\n", "4242", false}, // before the start: an older process
		{"6,99,70000000,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=qemu,pid=4242\n", "4242", false},
		{"garbage", "4242", false},
	} {
		if got := matchOOMRecord([]byte(c.rec), c.pid, start*1_000_000/clockTicks); got != c.want {
			t.Errorf("record %q for pid %s: %v, want %v", c.rec, c.pid, got, c.want)
		}
	}
}
