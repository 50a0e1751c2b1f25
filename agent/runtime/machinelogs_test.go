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
		"inst-live": {id: "inst-live", state: StateRunning, paths: Paths{Console: filepath.Join(live, "console.log"), VMMLog: filepath.Join(live, "vmm.log")}},
	}}

	l, err := rt.ReadMachineLog("inst-live", ConsoleCursor{}, 1<<20)
	if err != nil || !l.Live || !l.Running || l.Cursor == (ConsoleCursor{}) || string(l.Console.Data) != "boot line 1\nboot line 2\n" || l.Console.Truncated || string(l.VMM.Data) != "qemu started\n" {
		t.Fatalf("live: %+v, %v", l, err)
	}
	if l, err = rt.ReadMachineLog("inst-live", ConsoleCursor{}, 15); err != nil || string(l.Console.Data) != " 1\nboot line 2\n" || !l.Console.Truncated || l.VMM.Truncated {
		t.Fatalf("live, 15 bytes: console %q vmm %q (%+v), %v", l.Console.Data, l.VMM.Data, l, err)
	}
	l, err = rt.ReadMachineLog("inst-ended", ConsoleCursor{}, 10)
	if err != nil || l.Live || l.Running || l.Cursor != (ConsoleCursor{}) || string(l.Console.Data) != "6789abcdef" || !l.Console.Truncated || len(l.VMM.Data) != 10 {
		t.Fatalf("kept, 10 bytes: console %q vmm %q (%+v), %v", l.Console.Data, l.VMM.Data, l, err)
	}
	if _, err := rt.ReadMachineLog("inst-pruned", ConsoleCursor{}, 10); !errors.Is(err, ErrNoMachineLog) {
		t.Errorf("pruned: %v, want ErrNoMachineLog", err)
	}
	rt.instances["inst-starting"] = &instance{id: "inst-starting", state: StateStarting, paths: Paths{Console: filepath.Join(root, "instances", "inst-starting", "console.log")}}
	if l, err := rt.ReadMachineLog("inst-starting", ConsoleCursor{}, 10); err != nil || !l.Live || !l.Running || len(l.Console.Data) != 0 {
		t.Errorf("starting, nothing written yet: %+v, %v; want an empty live log", l, err)
	}
	write(filepath.Join(root, "secret", "console.log"), "host secret")
	for _, id := range []string{"../secret", "..", "inst-ended/../../secret", "", "Inst-Upper", "inst.ended"} {
		if l, err := rt.ReadMachineLog(id, ConsoleCursor{}, 10); err == nil || errors.Is(err, ErrNoMachineLog) || len(l.Console.Data) != 0 {
			t.Errorf("id %q: %q, %v; want refused", id, l.Console.Data, err)
		}
	}
}

// A read from a cursor returns only what the guest wrote after it, also
// across one rotation of the ring (the cursor names the file by inode);
// past two rotations, or more than the limit since, it says output was
// left out.
func TestReadConsoleSince(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	appendTo := func(s string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
	}
	rotate := func() {
		t.Helper()
		if err := os.Rename(path, path+".1"); err != nil {
			t.Fatal(err)
		}
	}
	read := func(from ConsoleCursor, limit int64, want string, wantCut bool) ConsoleCursor {
		t.Helper()
		b, cut, next, err := readConsoleSince(path, from, limit)
		if err != nil || string(b) != want || cut != wantCut {
			t.Fatalf("from %v, %d bytes: %q cut %v, %v; want %q cut %v", from, limit, b, cut, err, want, wantCut)
		}
		if back, err := ParseConsoleCursor(next.String()); err != nil || back != next {
			t.Fatalf("cursor %v does not survive the API: %v, %v", next, back, err)
		}
		return next
	}
	appendTo("one\n")
	c := read(ConsoleCursor{}, 100, "one\n", false)
	c = read(c, 100, "", false)
	appendTo("two\n")
	c = read(c, 100, "two\n", false)
	appendTo("three\n")
	rotate()
	appendTo("four\n")
	c = read(c, 100, "three\nfour\n", false)
	appendTo("five\nsix\n")
	c = read(c, 4, "six\n", true) // more since than asked
	rotate()
	appendTo("seven\n")
	rotate()
	appendTo("eight\n")
	read(c, 100, "seven\neight\n", true) // "four".."six" are gone with the older half
	for _, bad := range []string{"x", "1", "1.-2", "a.b", "1.2.3"} {
		if _, err := ParseConsoleCursor(bad); err == nil {
			t.Errorf("cursor %q accepted", bad)
		}
	}
}
