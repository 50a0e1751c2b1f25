package runtime

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// A process that execs another binary while its executable is read is
// reported with one binary's path and dev:ino, never the path of one and
// the dev:ino of the other (which made a takeover refuse its own VMM:
// the log wrapper's path recorded with QEMU's dev:ino).
func TestProcExeAgreesAcrossExec(t *testing.T) {
	env, err := exec.LookPath("env")
	if err != nil {
		t.Fatal(err)
	}
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	// The process execs env and sh in turn, forever.
	script := filepath.Join(t.TempDir(), "flip")
	if err := os.WriteFile(script, []byte("exec "+env+" "+sh+" \"$0\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sh, script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	ids := map[string][2]uint64{}
	for _, p := range []string{env, sh} {
		real, _ := filepath.EvalSymlinks(p)
		dev, ino, err := fileID(real)
		if err != nil {
			t.Fatal(err)
		}
		ids[real] = [2]uint64{dev, ino}
	}
	seen := map[string]int{}
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		path, dev, ino, err := procExe(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		want, ok := ids[path]
		if !ok {
			t.Fatalf("executable %s: neither %v", path, ids)
		}
		if want != [2]uint64{dev, ino} {
			t.Fatalf("executable %s reported with dev:ino %d:%d, its own is %d:%d", path, dev, ino, want[0], want[1])
		}
		seen[path]++
	}
	if len(seen) != 2 {
		t.Fatalf("the process was seen running only %v", seen)
	}
}

// A process that runs has not ended; one that exited and is not reaped
// yet (a zombie: its /proc entry answers, its executable link is gone)
// has, and so has one that is gone or whose PID another process took.
func TestProcEnded(t *testing.T) {
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
	start, err := procStartTime(sleep.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if procEnded(sleep.Process.Pid, start) {
		t.Error("a running process is reported ended")
	}
	if !procEnded(sleep.Process.Pid, start+1) {
		t.Error("a process with another start time (a reused PID) is not reported ended")
	}

	exited := exec.Command("true")
	if err := exited.Start(); err != nil {
		t.Fatal(err)
	}
	pid := exited.Process.Pid
	zstart, err := procStartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Not waited for: it stays a zombie until Wait reaps it.
	if !testenv.Poll(t, 10*time.Second, func() bool { _, _, _, err := procExe(pid); return err != nil }) {
		t.Fatal("the exited child's executable link never went")
	}
	if !procEnded(pid, zstart) {
		t.Error("a zombie is not reported ended")
	}
	exited.Wait()
	if !procEnded(pid, zstart) {
		t.Error("a reaped process is not reported ended")
	}
}
