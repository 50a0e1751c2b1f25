package storagepool

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

func TestTempNames(t *testing.T) {
	pool, err := Temp{Node: "node-a", Purpose: "import"}.Name()
	if err != nil || !regexp.MustCompile(`^\.node-a\.import-[0-9]+\.tmp$`).MatchString(pool) {
		t.Errorf("pool temp name %q, %v", pool, err)
	}
	local, err := Temp{Purpose: "record"}.Name()
	if err != nil || !regexp.MustCompile(`^\.record-[0-9]+\.tmp$`).MatchString(local) {
		t.Errorf("local temp name %q, %v", local, err)
	}
	if !IsTemp(pool) || !IsTemp(local) || !WrittenBy(pool, "node-a") || WrittenBy(pool, "node-ab") || WrittenBy(local, "node-a") {
		t.Errorf("IsTemp/WrittenBy disagree with Name: %q %q", pool, local)
	}
	for _, bad := range []Temp{{Purpose: ""}, {Purpose: "Record"}, {Purpose: "a/b"}, {Node: "a/b", Purpose: "x"}, {Node: "a.b", Purpose: "x"}} {
		if n, err := bad.Name(); err == nil {
			t.Errorf("%+v named %q", bad, n)
		}
	}
	for _, name := range []string{"record.tmp", ".tmp", "layer.qcow2", ".hidden"} {
		if IsTemp(name) {
			t.Errorf("IsTemp(%q)", name)
		}
	}
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "launch.json")
	if err := WriteFile(path, []byte("one"), 0o600, Temp{Purpose: "record"}); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("two"), 0o600, Temp{Purpose: "record"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	fi, _ := os.Stat(path)
	if err != nil || string(b) != "two" || fi.Mode().Perm() != 0o600 {
		t.Errorf("after two writes: %q %v mode %v", b, err, fi.Mode())
	}
	// A write that fails leaves the old file and no temporary file.
	boom := errors.New("disk on fire")
	if err := Write(path, 0o600, Temp{Purpose: "record"}, func(f *os.File) error {
		f.WriteString("half")
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("failed write: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Errorf("a failed write changed the file: %q", b)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"launch.json"}) {
		t.Errorf("directory after a failed write: %v", names)
	}
	// A file another program wrote into TempPath is committed the same way.
	tmp, err := TempPath(dir, Temp{Node: "node-a", Purpose: "layer-ws-1"})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(tmp, []byte("qcow2"), 0o600)
	if err := Commit(tmp, filepath.Join(dir, "ws-1.qcow2")); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"launch.json", "ws-1.qcow2"}) {
		t.Errorf("directory after a commit: %v", names)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
