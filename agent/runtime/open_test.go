package runtime_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
)

// TestOpenWithoutVMs covers what Open does before any VM runs: temporary
// files, directories without a record, records of launches that never ran,
// newer record formats and the exclusive lock.
func TestOpenWithoutVMs(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, time.Minute)
	inst := filepath.Join(h.root, "runtime", "instances")
	write := func(p, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	temps := []string{
		filepath.Join(inst, "vm-x", ".systemd.json-1a2b.tmp"),
		filepath.Join(h.root, "runtime", "registry", ".record-2826134621.tmp"),
		filepath.Join(h.root, "machine-logs", "vm-y", ".console.log-1.tmp"),
	}
	for _, p := range temps {
		write(p, "half-written, never read")
	}
	// vm-x has only a temp file: its launch never got a record.
	write(filepath.Join(inst, "vm-z", runtime.LaunchRecordFile),
		`{"format_version": 1, "instance_id": "vm-z", "launch_id": "l1", "unit": "kibotos-vmm-vm-z.service"}`)

	rt, err := h.open(t)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range temps {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("temp file %s after Open: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(inst, "vm-x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("instance directory without a record after Open: %v", err)
	}
	if _, err := h.open(t); err == nil || !strings.Contains(err.Error(), "locked") {
		t.Errorf("second Open while the first holds the lock: %v", err)
	}
	l := rt.List()
	if len(l) != 1 || l[0].ID != "vm-z" || l[0].State != runtime.StateFailed || !strings.Contains(l[0].Error, "start interrupted") {
		t.Fatalf("List: %+v; want vm-z FAILED (start interrupted)", l)
	}
	if err := rt.Delete(ctx, "vm-z"); err != nil {
		t.Fatal(err)
	}
	if e, err := runtime.ReadEndedRecord(filepath.Join(h.root, "runtime", "registry", "vm-z.json")); err != nil || e.How != "never started" {
		t.Errorf("registry record of vm-z: %+v, %v", e, err)
	}
	rt.Close()

	newer := filepath.Join(inst, "vm-n", runtime.LaunchRecordFile)
	body := `{"format_version": 2, "instance_id": "vm-n", "launch_id": "l2", "unit": "kibotos-vmm-vm-n.service"}`
	write(newer, body)
	if _, err := h.open(t); err == nil || !strings.Contains(err.Error(), newer) || !errors.Is(err, runtime.ErrNewerRecord) {
		t.Errorf("Open with a newer record: %v; want ErrNewerRecord naming %s", err, newer)
	}
	if b, _ := os.ReadFile(newer); string(b) != body {
		t.Errorf("refused record was changed: %s", b)
	}
}

// Open removes installations that no record references and nobody asked to
// keep; the one a (failed) Instance still references stays.
func TestOpenRemovesUnusedInstallations(t *testing.T) {
	h := newHarness(t)
	inst := filepath.Join(h.root, "installations")
	for _, d := range []string{"sha256-keep", "sha256-used", "sha256-unused", ".platform-build-1.tmp"} {
		if err := os.MkdirAll(filepath.Join(inst, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	rec := filepath.Join(h.root, "runtime", "instances", "vm-z", runtime.LaunchRecordFile)
	os.MkdirAll(filepath.Dir(rec), 0o700)
	if err := os.WriteFile(rec, []byte(`{"format_version": 1, "instance_id": "vm-z", "launch_id": "l1", "unit": "kibotos-vmm-vm-z.service", "installation_id": "sha256-used"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	h.keep = []string{"sha256-keep"}
	rt, err := h.open(t)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	for name, want := range map[string]bool{"sha256-keep": true, "sha256-used": true, "sha256-unused": false, ".platform-build-1.tmp": true} {
		_, err := os.Stat(filepath.Join(inst, name))
		if got := err == nil; got != want {
			t.Errorf("installation %s present=%v after Open, want %v", name, got, want)
		}
	}
}
