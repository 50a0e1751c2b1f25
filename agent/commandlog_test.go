package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/template"
)

// recording gives a, built for a test, the command log of its storage
// root, as New does.
func recording(t *testing.T, a *Agent) *Agent {
	t.Helper()
	l, err := openCommandLog(a.cfg.DataDir.StorageRoot())
	if err != nil {
		t.Fatal(err)
	}
	a.commands = l
	return a
}

// testClock is the command log's clock in a test: it moves when told.
type testClock struct{ now time.Time }

func (c *testClock) read() time.Time { return c.now }

// restarted is a's node after a restart: a new agent over the same data
// directory, its command log read from the disk, on clock.
func restarted(t *testing.T, a *Agent, clock *testClock, logs *bytes.Buffer) *Agent {
	t.Helper()
	b := recording(t, &Agent{cfg: a.cfg, log: slog.New(slog.NewTextHandler(logs, nil))})
	b.commands.now = clock.read
	return b
}

// onDisk is volume-commands.json under root as "id kind state" lines.
func onDisk(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(runtime.RegistryDir(root), runtime.VolumeCommandsFile))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		FormatVersion int `json:"format_version"`
		Commands      []struct {
			CommandID string `json:"command_id"`
			Kind      string `json:"kind"`
			State     string `json:"state"`
		} `json:"commands"`
	}
	if err := json.Unmarshal(b, &f); err != nil || f.FormatVersion != 1 {
		t.Fatalf("volume-commands.json (format %d): %v\n%s", f.FormatVersion, err, b)
	}
	var out []string
	for _, c := range f.Commands {
		out = append(out, c.CommandID+" "+c.Kind+" "+c.State)
	}
	return out
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A Workspace delete's removal of its writable layer is recorded in
// volume-commands.json; after a node restart the same command is
// answered from the record (a failure as it was, not run again), a new
// command runs; 24 hours after it ended the record is gone and the
// command runs again. A start's creation of a new layer is recorded the
// same way.
func TestLayerCommandsRecorded(t *testing.T) {
	qemuImg := testenv.LookPath(t, "qemu-img", "qemu-utils")
	dir := t.TempDir()
	clock := &testClock{now: time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)}
	var logs bytes.Buffer
	a := restarted(t, &Agent{cfg: Config{NodeID: "node-a", DataDir: datadir.Dir(dir)}}, clock, &logs)
	root := a.cfg.DataDir.StorageRoot()
	layer, err := a.layerPath("", "ws-1")
	if err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(dir, "template.img")
	if err := os.WriteFile(image, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	start := api.WorkspaceTask{WorkspaceID: "ws-1", Command: api.WorkspaceCommand{Kind: api.WSCmdStart, CommandID: "start-1"}}
	if err := a.createLayer(context.Background(), start, layer, image); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(qemuImg, "info", layer).CombinedOutput(); err != nil || !strings.Contains(string(out), "backing file: "+image) {
		t.Fatalf("the layer made: %v\n%s", err, out)
	}
	if got := onDisk(t, root); !has(got, "start-1/layer layer_create ok") {
		t.Fatalf("recorded %q, want the layer's creation", got)
	}

	// A delete that fails: a directory where the layer should be.
	if err := os.Remove(layer); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(layer, "x"), 0o700)
	del := func(id string) api.WorkspaceTask {
		return api.WorkspaceTask{WorkspaceID: "ws-1", Command: api.WorkspaceCommand{Kind: api.WSCmdDelete, CommandID: id}}
	}
	r := a.execute(context.Background(), del("delete-1"))
	if r.Outcome != fsm.OutcomeFailed || !strings.Contains(r.Error, "remove writable layer "+layer) {
		t.Fatalf("delete over a directory: %+v", r)
	}
	failure := r.Error
	if got := onDisk(t, root); !has(got, "delete-1/layer layer_delete failed") {
		t.Fatalf("recorded %q, want the failed delete", got)
	}

	// The node restarts; a layer file is there now. ctrl sends the same
	// command again: the same answer, and the file stays.
	os.RemoveAll(layer)
	if err := os.WriteFile(layer, []byte("layer"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	b := restarted(t, a, clock, &logs)
	if r := b.execute(context.Background(), del("delete-1")); r.Outcome != fsm.OutcomeFailed || r.Error != failure {
		t.Fatalf("the same delete after a restart: %+v, want failed %q as before", r, failure)
	}
	if _, err := os.Stat(layer); err != nil {
		t.Fatalf("the same delete ran again: %v", err)
	}
	if !strings.Contains(logs.String(), "command answered from its record") {
		t.Errorf("node log lacks the answer from the record:\n%s", logs.String())
	}
	// A new command runs.
	if r := b.execute(context.Background(), del("delete-2")); r.Outcome != fsm.OutcomeOK {
		t.Fatalf("a new delete: %+v", r)
	}
	if _, err := os.Stat(layer); !os.IsNotExist(err) {
		t.Fatalf("a new delete left the layer: %v", err)
	}

	// 24 hours after it ended the record still answers; a second later
	// it is gone: the command runs, and its old record leaves the file.
	os.WriteFile(layer, []byte("layer"), 0o600)
	clock.now = clock.now.Add(commandsKeep)
	if r := restarted(t, a, clock, &logs).execute(context.Background(), del("delete-1")); r.Outcome != fsm.OutcomeFailed {
		t.Fatalf("24 h after: %+v, want the recorded answer", r)
	}
	clock.now = clock.now.Add(time.Second)
	c := restarted(t, a, clock, &logs)
	if r := c.execute(context.Background(), del("delete-1")); r.Outcome != fsm.OutcomeOK {
		t.Fatalf("24 h and 1 s after: %+v, want the delete run again", r)
	}
	if _, err := os.Stat(layer); !os.IsNotExist(err) {
		t.Fatalf("the delete run again left the layer: %v", err)
	}
	got := onDisk(t, root)
	if has(got, "start-1/layer layer_create ok") || has(got, "delete-2/layer layer_delete ok") || !has(got, "delete-1/layer layer_delete ok") || len(got) != 1 {
		t.Fatalf("recorded %q after 24 h: want the expired records gone", got)
	}
}

// A start's fetch of a published template is recorded in
// volume-commands.json; after a node restart the same start is answered
// from the record (a damaged object's failure, a refusal) without
// fetching again, a new start fetches; 24 hours after it ended the record
// is gone and the start fetches.
func TestTemplateFetchRecorded(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	dir := t.TempDir()
	store, err := artifacts.NewDir(filepath.Join(dir, "store"), "node-b")
	if err != nil {
		t.Fatal(err)
	}
	img, good := published(t, store, "solo")
	object := filepath.Join(dir, "store", "objects", "sha256", strings.TrimPrefix(img.Digest, "sha256:"))
	setObject := func(b []byte) {
		os.Chmod(object, 0o600)
		if err := os.WriteFile(object, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	damaged := bytes.Clone(good)
	damaged[len(damaged)/2] ^= 1
	setObject(damaged)

	clock := &testClock{now: time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)}
	var logs bytes.Buffer
	a := restarted(t, &Agent{cfg: Config{NodeID: "node-b", DataDir: datadir.Dir(filepath.Join(dir, "data")), Artifacts: store}}, clock, &logs)
	root := a.cfg.DataDir.StorageRoot()
	start := func(id string) api.WorkspaceTask {
		return api.WorkspaceTask{WorkspaceID: "ws-1", Template: "solo", Published: &img, Command: api.WorkspaceCommand{Kind: api.WSCmdStart, CommandID: id}}
	}
	_, _, err = a.templateFor(context.Background(), start("start-1"))
	if err == nil || !strings.Contains(err.Error(), img.Digest) {
		t.Fatalf("damaged object: %v", err)
	}
	failure := err.Error()
	if got := onDisk(t, root); !has(got, "start-1/template template_fetch failed") {
		t.Fatalf("recorded %q, want the failed fetch", got)
	}

	// Repaired in the store; the node restarts and ctrl sends the same
	// start again: the same failure, nothing fetched.
	setObject(good)
	logs.Reset()
	b := restarted(t, a, clock, &logs)
	if _, _, err := b.templateFor(context.Background(), start("start-1")); err == nil || err.Error() != failure {
		t.Fatalf("the same start after a restart: %v, want %q as before", err, failure)
	}
	if strings.Contains(logs.String(), "template fetch started") {
		t.Fatalf("the same start fetched again:\n%s", logs.String())
	}
	if _, err := template.Get(root, "solo"); err == nil {
		t.Fatal("the same start installed the template")
	}

	// A store the node cannot read: a refusal, answered again after a
	// restart though the store is back.
	b.cfg.Artifacts, _ = artifacts.NewDir(filepath.Join(dir, "not-mounted"), "node-b")
	_, refusal, err := b.templateFor(context.Background(), start("start-2"))
	if err != nil || !strings.Contains(refusal, "template solo could not be fetched") {
		t.Fatalf("unreachable store: %q, %v", refusal, err)
	}
	if got := onDisk(t, root); !has(got, "start-2/template template_fetch refused") {
		t.Fatalf("recorded %q, want the refused fetch", got)
	}
	c := restarted(t, a, clock, &logs)
	if _, again, err := c.templateFor(context.Background(), start("start-2")); err != nil || again != refusal {
		t.Fatalf("the same start after a restart: %q, %v, want the refusal %q", again, err, refusal)
	}

	// 24 hours and a second after the failure: the start fetches.
	clock.now = clock.now.Add(commandsKeep + time.Second)
	logs.Reset()
	d := restarted(t, a, clock, &logs)
	tpl, refusal, err := d.templateFor(context.Background(), start("start-1"))
	if err != nil || refusal != "" || tpl.ImageDigest != img.Digest {
		t.Fatalf("the same start 24 h later: %q, %v", refusal, err)
	}
	if !strings.Contains(logs.String(), "template fetched") {
		t.Errorf("node log lacks the fetch:\n%s", logs.String())
	}
	if got := onDisk(t, root); !has(got, "start-1/template template_fetch ok") || has(got, "start-2/template template_fetch refused") {
		t.Fatalf("recorded %q after 24 h: want the new fetch and the expired refusal gone", got)
	}
}

// Each entry of volume-commands.json is kept 24 hours (the process-model
// seed), also one of a command the node's restart interrupted and ctrl
// never sent again: it leaves the file 24 hours after it started.
func TestInterruptedCommandRecordsExpire(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)}
	root := datadir.Dir(dir).StorageRoot()
	file := filepath.Join(runtime.RegistryDir(root), runtime.VolumeCommandsFile)
	os.MkdirAll(filepath.Dir(file), 0o700)
	started := func(ago time.Duration) string { return clock.now.Add(-ago).Format(time.RFC3339Nano) }
	if err := os.WriteFile(file, []byte(`{"format_version":1,"commands":[
 {"command_id":"ws-1/2/layer","kind":"layer_create","workspace_id":"ws-1","state":"running","started_at":"`+started(commandsKeep+time.Second)+`"},
 {"command_id":"vol-1/2","kind":"resize","volume_id":"vol-1","pool_id":"default","state":"running","started_at":"`+started(time.Hour)+`"}
]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	a := restarted(t, &Agent{cfg: Config{NodeID: "node-a", DataDir: datadir.Dir(dir)}}, clock, &logs)
	layer, err := a.layerPath("", "ws-2")
	if err != nil {
		t.Fatal(err)
	}
	if r := a.execute(context.Background(), api.WorkspaceTask{WorkspaceID: "ws-2", Command: api.WorkspaceCommand{Kind: api.WSCmdDelete, CommandID: "ws-2/3"}}); r.Outcome != fsm.OutcomeOK {
		t.Fatalf("delete of %s: %+v", layer, r)
	}
	got := onDisk(t, root)
	if has(got, "ws-1/2/layer layer_create running") || !has(got, "vol-1/2 resize running") || !has(got, "ws-2/3/layer layer_delete ok") {
		t.Fatalf("recorded %q: want the command interrupted 24 h ago gone, the one an hour ago kept", got)
	}
}
