package runtime

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
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
