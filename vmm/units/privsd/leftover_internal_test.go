package privsd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// A private systemd is ended as a leftover only on a well-formed record
// that names the process running in its cgroup: anything else is refused
// and nothing is signalled.
func TestEndLeftoverRefusals(t *testing.T) {
	me := os.Getpid()
	myStart, err := procStart(me)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, record string
		want         string
	}{
		{"no record", "", "no record of who started it"},
		{"not four numbers", "12 34\n", "malformed"},
		{"text", "a b c d\n", "malformed"},
		{"PID 1", fmt.Sprintf("1 %d 999999 1\n", myStart), "malformed"},
		{"recorded PID runs outside the cgroup", fmt.Sprintf("%d %d 999999 1\n", me, myStart), "runs outside cgroup"},
		{"its starter still runs", fmt.Sprintf("%d %d %d %d\n", me, myStart, me, myStart), "still runs"},
		{"recorded PID gone, a process it did not record stays", fmt.Sprintf("%d %d 999999 1\n", me, myStart+1), "were still there"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.record != "" {
				if err := os.WriteFile(filepath.Join(dir, starterFileName), []byte(c.record), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			pids := []int{12345}
			if strings.Contains(c.name, "stays") || strings.Contains(c.name, "starter") {
				pids = []int{me} // in the cgroup, but not the recorded process
			}
			ended, err := endLeftover(dir, fakeCgroup(t, pids), pids)
			if ended != 0 || err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("ended %d, err %v; want 0 and %q", ended, err, c.want)
			}
		})
	}
}

// A private systemd that ended by itself (its recorded PID is gone, as the
// parent-death signal meant) is ended already once its cgroup is empty:
// no error, and its record goes.
func TestEndLeftoverOfOneEndingByItself(t *testing.T) {
	me := os.Getpid()
	myStart, err := procStart(me)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	record := filepath.Join(dir, starterFileName)
	if err := os.WriteFile(record, fmt.Appendf(nil, "%d %d 999999 1\n", me, myStart+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if ended, err := endLeftover(dir, fakeCgroup(t, nil), []int{12345}); ended != me || err != nil {
		t.Fatalf("ended %d, err %v; want %d (the recorded PID) and no error", ended, err, me)
	}
	if _, err := os.Stat(record); !os.IsNotExist(err) {
		t.Errorf("its record stayed: %v", err)
	}
}

// fakeCgroup is a directory that reads as a cgroup holding pids, and a
// short KillTimeout for the wait on it.
func fakeCgroup(t *testing.T, pids []int) string {
	cg := t.TempDir()
	var procs []byte
	for _, p := range pids {
		procs = fmt.Appendf(procs, "%d\n", p)
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), procs, 0o600); err != nil {
		t.Fatal(err)
	}
	old := KillTimeout
	KillTimeout = 200 * time.Millisecond
	t.Cleanup(func() { KillTimeout = old })
	return cg
}

// EndLeftover of a directory with no private systemd does nothing.
func TestEndLeftoverNothingRunning(t *testing.T) {
	if err := Available(); err != nil {
		testenv.Skipf(t, "private systemd unavailable: %v", err)
	}
	if pid, err := EndLeftover(t.TempDir()); pid != 0 || err != nil {
		t.Errorf("EndLeftover of an empty directory: %d, %v", pid, err)
	}
}
