package agent

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
)

// The pool side of the temp-file rule, as the node applies it: a
// standalone pool loses every temporary file, a shared one only this
// node's, and a pool unavailable at start is swept once it is available;
// each change of availability is logged with a reason.
func TestPoolsSweptAndWatched(t *testing.T) {
	root := t.TempDir()
	standalone, shared, late := filepath.Join(root, "standalone"), filepath.Join(root, "shared"), filepath.Join(root, "late")
	put := func(p string) {
		t.Helper()
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{
		filepath.Join(standalone, "layers", ".node-a.layer-1.tmp"), filepath.Join(standalone, "layers", ".import-1.tmp"),
		filepath.Join(shared, "layers", ".node-a.layer-2.tmp"), filepath.Join(shared, "layers", ".node-b.layer-3.tmp"),
		filepath.Join(shared, "layers", "ws-1.qcow2"),
	} {
		put(p)
	}
	var logs bytes.Buffer
	a := &Agent{cfg: Config{NodeID: "node-a", Pools: []PoolConfig{
		{ID: "local", Path: standalone}, {ID: "nfs", Path: shared, Shared: true}, {ID: "usb", Path: late},
	}}, log: slog.New(slog.NewTextHandler(&logs, nil))}
	statuses := func() []api.Pool {
		var out []api.Pool
		for _, p := range a.cfg.Pools {
			st := poolStatus(p.ID, p.Path)
			st.Shared = p.Shared
			out = append(out, st)
		}
		return out
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	a.notePools(statuses())
	if exists(filepath.Join(standalone, "layers", ".node-a.layer-1.tmp")) || exists(filepath.Join(standalone, "layers", ".import-1.tmp")) {
		t.Error("the standalone pool kept temporary files")
	}
	if exists(filepath.Join(shared, "layers", ".node-a.layer-2.tmp")) || !exists(filepath.Join(shared, "layers", ".node-b.layer-3.tmp")) ||
		!exists(filepath.Join(shared, "layers", "ws-1.qcow2")) {
		t.Error("the shared pool: want node-a's temporary file gone, node-b's and the layer kept")
	}
	if n := strings.Count(logs.String(), "storage pool availability changed"); n != 3 {
		t.Errorf("%d availability lines at start, want one per pool:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "pool=usb") || !strings.Contains(logs.String(), "available=false") || !strings.Contains(logs.String(), "no such file or directory") {
		t.Errorf("the unavailable pool's line lacks its reason:\n%s", logs.String())
	}

	// Nothing changed: nothing logged.
	logs.Reset()
	a.notePools(statuses())
	if logs.Len() != 0 {
		t.Errorf("logged without a change:\n%s", logs.String())
	}
	// The late pool appears (mounted), with a leftover: swept now.
	put(filepath.Join(late, "volumes", "data", ".node-a.import-7.tmp"))
	a.notePools(statuses())
	if exists(filepath.Join(late, "volumes", "data", ".node-a.import-7.tmp")) {
		t.Error("a pool that became available was not swept")
	}
	if !strings.Contains(logs.String(), "pool=usb") || !strings.Contains(logs.String(), "available=true") || !strings.Contains(logs.String(), "reachable again") {
		t.Errorf("no line for the pool that became available:\n%s", logs.String())
	}
	// Swept once: a temporary file written while the node runs stays.
	put(filepath.Join(late, "volumes", "data", ".node-a.import-8.tmp"))
	a.notePools(statuses())
	if !exists(filepath.Join(late, "volumes", "data", ".node-a.import-8.tmp")) {
		t.Error("a running node's own temporary file was swept")
	}
}

// An import interrupted mid-download or mid-unpack leaves its archive in
// the pool's transfer staging (the process-model seed's
// .node-a.download-import-<n>.tar), which the next attempt never reuses:
// the start-up sweep deletes it and its fetch's partial and lock files,
// in a shared pool only this node's (node-b may be importing).
func TestPoolsSweepImportArchives(t *testing.T) {
	root := t.TempDir()
	standalone, shared := filepath.Join(root, "standalone"), filepath.Join(root, "shared")
	put := func(p string) string {
		t.Helper()
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	staged := func(pool, name string) string { return put(filepath.Join(pool, "volumes", "transfer-staging", name)) }
	gone := []string{
		staged(standalone, ".node-a.download-import-3170412187.tar"),
		staged(standalone, ".node-b.download-import-11.tar"), // a standalone pool is this node's alone
		staged(shared, ".node-a.download-import-3170412187.tar"),
		staged(shared, ".node-a.download-import-42.tar.partial"),
		staged(shared, ".node-a.download-import-42.tar.lock"),
	}
	kept := []string{
		staged(shared, ".node-b.download-import-7.tar"),
		staged(shared, ".node-b.download-import-8.tar.partial"),
		staged(shared, ".node-ab.download-import-9.tar"),
		staged(shared, "notes.tar"),
	}
	var logs bytes.Buffer
	a := &Agent{cfg: Config{NodeID: "node-a", Pools: []PoolConfig{{ID: "local", Path: standalone}, {ID: "nfs", Path: shared, Shared: true}}},
		log: slog.New(slog.NewTextHandler(&logs, nil))}
	var statuses []api.Pool
	for _, p := range a.cfg.Pools {
		st := poolStatus(p.ID, p.Path)
		st.Shared = p.Shared
		statuses = append(statuses, st)
	}
	a.notePools(statuses)
	for _, p := range gone {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s was not swept", p)
		}
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was swept: %v", p, err)
		}
	}
	if !strings.Contains(logs.String(), "pool=nfs path="+shared+" count=3") {
		t.Errorf("the shared pool's sweep is not logged with its count:\n%s", logs.String())
	}
}
