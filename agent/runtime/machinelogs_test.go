package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// Past the quota, whole Instances' log tails go, oldest first, never the
// one just copied; within it nothing goes.
func TestPruneMachineLogs(t *testing.T) {
	root := t.TempDir()
	base := time.Now().Add(-time.Hour)
	put := func(id string, age time.Duration, size int) {
		t.Helper()
		dir := filepath.Join(root, id)
		os.MkdirAll(dir, 0o700)
		for _, name := range []string{"console.log", "vmm.log"} {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
				t.Fatal(err)
			}
			os.Chtimes(p, base.Add(-age), base.Add(-age))
		}
	}
	put("old", 3*time.Minute, 100)    // 200 bytes
	put("older", 5*time.Minute, 100)  // 200 bytes
	put("new", time.Minute, 100)      // 200 bytes
	put("fresh", 10*time.Minute, 100) // oldest files, but just copied
	left := func() []string {
		es, _ := os.ReadDir(root)
		var out []string
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}
	if n, _, err := pruneMachineLogs(root, 800, ""); err != nil || n != 0 {
		t.Fatalf("within the quota: removed %d, %v", n, err)
	}
	n, freed, err := pruneMachineLogs(root, 450, "fresh")
	if err != nil || n != 2 || freed != 400 {
		t.Fatalf("over the quota: removed %d (%d bytes), %v; want the two oldest but the kept one", n, freed, err)
	}
	if got := left(); !slices.Equal(got, []string{"fresh", "new"}) {
		t.Errorf("left %v, want fresh (kept) and new", got)
	}
	if n, _, err := pruneMachineLogs(filepath.Join(root, "missing"), 1, ""); err != nil || n != 0 {
		t.Errorf("missing directory: %d, %v", n, err)
	}
}

// ReadMachineLog: the live logs of an Instance the node holds (the
// console across both halves of its ring), else the kept tails; at most
// the bytes asked, saying when there is more; ids that are not Instance
// ids (paths) are refused before any file is opened.
func TestReadMachineLog(t *testing.T) {
	root := t.TempDir()
	write := func(path, data string) {
		t.Helper()
		os.MkdirAll(filepath.Dir(path), 0o700)
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	live := filepath.Join(root, "instances", "inst-live")
	write(filepath.Join(live, "console.log.1"), "boot line 1\n")
	write(filepath.Join(live, "console.log"), "boot line 2\n")
	write(filepath.Join(live, "vmm.log"), "qemu started\n")
	kept := filepath.Join(root, "machine-logs", "inst-ended")
	write(filepath.Join(kept, "console.log"), "0123456789abcdef")
	write(filepath.Join(kept, "vmm.log"), "kibotos: vmm exited result=success\n")
	rt := &Runtime{logsDir: filepath.Join(root, "machine-logs"), instances: map[string]*instance{
		"inst-live": {id: "inst-live", paths: Paths{Console: filepath.Join(live, "console.log"), VMMLog: filepath.Join(live, "vmm.log")}},
	}}

	l, err := rt.ReadMachineLog("inst-live", 1<<20)
	if err != nil || !l.Live || string(l.Console.Data) != "boot line 1\nboot line 2\n" || l.Console.Truncated || string(l.VMM.Data) != "qemu started\n" {
		t.Fatalf("live: %+v, %v", l, err)
	}
	if l, err = rt.ReadMachineLog("inst-live", 15); err != nil || string(l.Console.Data) != " 1\nboot line 2\n" || !l.Console.Truncated || l.VMM.Truncated {
		t.Fatalf("live, 15 bytes: console %q vmm %q (%+v), %v", l.Console.Data, l.VMM.Data, l, err)
	}
	l, err = rt.ReadMachineLog("inst-ended", 10)
	if err != nil || l.Live || string(l.Console.Data) != "6789abcdef" || !l.Console.Truncated || len(l.VMM.Data) != 10 {
		t.Fatalf("kept, 10 bytes: console %q vmm %q (%+v), %v", l.Console.Data, l.VMM.Data, l, err)
	}
	if _, err := rt.ReadMachineLog("inst-pruned", 10); !errors.Is(err, ErrNoMachineLog) {
		t.Errorf("pruned: %v, want ErrNoMachineLog", err)
	}
	write(filepath.Join(root, "secret", "console.log"), "host secret")
	for _, id := range []string{"../secret", "..", "inst-ended/../../secret", "", "Inst-Upper", "inst.ended"} {
		if l, err := rt.ReadMachineLog(id, 10); err == nil || errors.Is(err, ErrNoMachineLog) || len(l.Console.Data) != 0 {
			t.Errorf("id %q: %q, %v; want refused", id, l.Console.Data, err)
		}
	}
}
