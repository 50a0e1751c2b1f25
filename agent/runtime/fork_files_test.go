package runtime_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/faultfs"
	"github.com/kibotos/kibotos/internal/testenv"
)

// The files of forks, without a VM: the source's layer becomes a base
// both it and every fork of the pause write over, each with its own
// reference; a second fork of the same pause and a retry reuse it; the
// state file is linked, never copied; a source paused again and forked
// again chains a second base; deleting the source first leaves its
// forks' bases, which go with the last layer over them.
func TestForkFiles(t *testing.T) {
	p := newForkPool(t, t.TempDir())
	pool, layer, snap := p.dir, p.layer, p.snap
	paused := p.paused
	forkOf := func(ws, inst string) {
		t.Helper()
		if err := p.fork(ws, inst, layer(ws)); err != nil {
			t.Fatal(err)
		}
	}
	bases := func() string { return strings.Join(dirEntries(t, filepath.Join(pool, "bases")), " ") }
	refs := func(base string) string {
		return strings.Join(dirEntries(t, filepath.Join(pool, "bases", base+".refs")), " ")
	}
	chain := func(ws string) string {
		t.Helper()
		b, err := runtime.LayerBases(layer(ws))
		if err != nil {
			t.Fatal(err)
		}
		for i := range b {
			b[i] = filepath.Base(b[i])
		}
		return strings.Join(b, " ")
	}

	paused("i1")
	forkOf("f1", "i1")
	forkOf("f2", "i1")
	forkOf("f2", "i1") // a retry: nothing new
	if got := bases(); got != "src@i1.qcow2 src@i1.qcow2.refs" {
		t.Fatalf("bases: %s", got)
	}
	if got := refs("src@i1.qcow2"); got != "f1 f2 src" {
		t.Errorf("references to the base: %s", got)
	}
	for _, ws := range []string{"src", "f1", "f2"} {
		if got := chain(ws); got != "src@i1.qcow2" {
			t.Errorf("bases under %s: %q", ws, got)
		}
	}
	st1, _ := os.Stat(filepath.Join(snap("src"), runtime.SnapshotStateFile))
	st2, _ := os.Stat(filepath.Join(snap("f2"), runtime.SnapshotStateFile))
	if !os.SameFile(st1, st2) {
		t.Error("the fork's state file is not a link to the source's")
	}
	if b, _ := os.ReadFile(filepath.Join(snap("f1"), runtime.SnapshotMetaFile)); !strings.Contains(string(b), "i1") {
		t.Errorf("the fork's snapshot.json: %s", b)
	}

	// Resumed, paused again, forked again: a second base over the first.
	paused("i2")
	forkOf("f3", "i2")
	if got := chain("f3"); got != "src@i2.qcow2 src@i1.qcow2" {
		t.Errorf("bases under a fork of the second pause: %q", got)
	}
	if got := refs("src@i1.qcow2"); got != "f1 f2 src" {
		t.Errorf("references to the first base after the second: %s", got)
	}

	// The source goes first: every base stays for the forks over it.
	if err := runtime.RemoveLayer(layer("src"), "src"); err != nil {
		t.Fatal(err)
	}
	if got := refs("src@i2.qcow2"); got != "f3" {
		t.Errorf("references to the second base without the source: %s", got)
	}
	for _, ws := range []string{"f3", "f1"} {
		if err := runtime.RemoveLayer(layer(ws), ws); err != nil {
			t.Fatal(err)
		}
	}
	// f3's base went with it and dropped its reference (as src's layer).
	if got := bases(); got != "src@i1.qcow2 src@i1.qcow2.refs" || refs("src@i1.qcow2") != "f2" {
		t.Errorf("after f3 and f1: bases %s, references %s", got, refs("src@i1.qcow2"))
	}
	if err := runtime.RemoveLayer(layer("f2"), "f2"); err != nil {
		t.Fatal(err)
	}
	if got := bases(); got != "" {
		t.Errorf("bases after every layer went: %s", got)
	}
	if err := runtime.RemoveLayer(layer("f2"), "f2"); err != nil {
		t.Errorf("a layer removed twice: %v", err)
	}
}

// forkPool is a storage pool for the fork file tests: a template, and a
// Workspace "src" whose layer is over it.
type forkPool struct {
	t        *testing.T
	dir, tpl string
}

func newForkPool(t *testing.T, dir string) *forkPool {
	testenv.LookPath(t, "qemu-img", "qemu-utils")
	p := &forkPool{t: t, dir: dir, tpl: filepath.Join(t.TempDir(), "root.img")}
	qemuImgCreate(t, "-f", "raw", p.tpl, "16M")
	if err := os.MkdirAll(filepath.Join(dir, "layers"), 0o700); err != nil {
		t.Fatal(err)
	}
	qemuImgCreate(t, "-f", "qcow2", "-F", "raw", "-b", p.tpl, p.layer("src"))
	return p
}

func (p *forkPool) layer(ws string) string  { return filepath.Join(p.dir, "layers", ws+".qcow2") }
func (p *forkPool) snap(ws string) string   { return filepath.Join(p.dir, "snapshots", ws) }
func (p *forkPool) base(name string) string { return filepath.Join(p.dir, "bases", name) }

// paused gives src the snapshot of a pause of Instance inst.
func (p *forkPool) paused(inst string) {
	p.t.Helper()
	dir := p.snap("src")
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		p.t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, runtime.SnapshotStateFile), []byte("memory of "+inst), 0o600)
	os.WriteFile(filepath.Join(dir, runtime.SnapshotMetaFile), []byte(`{"instance_id":"`+inst+`"}`), 0o600)
}

// fork prepares the files of fork ws of src's pause inst, its layer at
// layer.
func (p *forkPool) fork(ws, inst, layer string) error {
	return runtime.PrepareFork(context.Background(), "node-a", runtime.ForkFiles{Source: "src", Fork: ws, SourceInstance: inst,
		SourceLayer: p.layer("src"), SourceSnapshot: p.snap("src"), Layer: layer, Snapshot: p.snap(ws)})
}

// qemuImgCreate runs qemu-img create quietly with args.
func qemuImgCreate(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", append([]string{"create", "-q"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create %v: %v: %s", args, err, out)
	}
}

// A layer whose header cannot be read (the pool's disk fails the read)
// is not removed: the base under it is known only from that header, and
// it would stay in the pool for good once the layer was gone (the fault
// harness's seed 35: a fork's base left after every Workspace was
// deleted). The delete fails, and its retry removes both.
func TestRemoveLayerWhoseHeaderCannotBeRead(t *testing.T) {
	testenv.LookPath(t, "qemu-img", "qemu-utils")
	testenv.RequireRoot(t, "a FUSE mount")
	scratch := t.TempDir()
	pool := filepath.Join(scratch, "pool")
	if err := os.Mkdir(filepath.Join(scratch, "disk"), 0o700); err != nil {
		t.Fatal(err)
	}
	disk := faultfs.Mount(t, filepath.Join(scratch, "disk"), pool)
	p := newForkPool(t, pool)
	layer := p.layer
	p.paused("i1")
	if err := p.fork("f1", "i1", layer("f1")); err != nil {
		t.Fatal(err)
	}
	if err := runtime.RemoveLayer(layer("src"), "src"); err != nil {
		t.Fatal(err)
	}

	disk.Fail(syscall.EIO, 1)
	err := runtime.RemoveLayer(layer("f1"), "f1")
	disk.Heal()
	if err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("removing a layer whose header read fails: %v, want the EIO", err)
	}
	if _, err := os.Stat(layer("f1")); err != nil {
		t.Fatalf("the layer went although its header was not read: %v", err)
	}
	if err := runtime.RemoveLayer(layer("f1"), "f1"); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if got := dirEntries(t, filepath.Join(pool, "bases")); len(got) != 0 {
		t.Errorf("bases after the retry removed the last layer: %v", got)
	}
}

// References that nothing holds go with their Workspace (the fault
// harness's seed 37: two bases left after every Workspace was deleted).
// A fork's reference to its base is made before its layer: one whose
// layer was never made (the pool failed the write) boots afresh over its
// template and keeps no base, yet its reference held the base for good.
// A freeze cut short (the source's layer linked to its base name, the
// node gone before the overlay took its place) leaves a base that is a
// second name of the layer, and the next freeze a sibling of it over the
// same base: the source's one reference there must last while either
// stands.
func TestStrayReferencesGoWithTheirWorkspace(t *testing.T) {
	p := newForkPool(t, t.TempDir())
	layer, base, paused, fork := p.layer, p.base, p.paused, p.fork
	remove := func(ws string) {
		t.Helper()
		if err := runtime.RemoveLayer(layer(ws), ws); err != nil {
			t.Fatal(err)
		}
	}
	refs := func(name string) string { return strings.Join(dirEntries(t, base(name)+".refs"), " ") }

	// f1's layer cannot be made; it boots afresh over the template.
	paused("i1")
	if err := fork("f1", "i1", filepath.Join(p.dir, "unwritable", "f1.qcow2")); err == nil {
		t.Fatal("a fork whose layer cannot be made: no error")
	}
	if got := refs("src@i1.qcow2"); got != "f1 src" {
		t.Fatalf("references after the failed fork: %q", got)
	}
	if err := runtime.EnsureLayer(context.Background(), "node-a", layer("f1"), p.tpl); err != nil {
		t.Fatal(err)
	}
	// Pause i2's freeze cut short by a crash; pause i3's forked to f3.
	paused("i2")
	os.MkdirAll(base("src@i2.qcow2.refs"), 0o700)
	if err := os.Link(layer("src"), base("src@i2.qcow2")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(base("src@i2.qcow2.refs/src"), nil, 0o600)
	paused("i3")
	if err := fork("f3", "i3", layer("f3")); err != nil {
		t.Fatal(err)
	}

	remove("src")
	remove("f1")
	b, err := runtime.LayerBases(layer("f3"))
	if err != nil {
		t.Fatalf("f3's bases after its source went: %v", err)
	}
	for _, p := range b {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("a base f3 stands on is gone: %v", err)
		}
	}
	if got := refs("src@i1.qcow2"); got != "src" {
		t.Errorf("references to f3's lowest base: %q, want only src (held by src@i3)", got)
	}
	remove("f3")
	if got := dirEntries(t, filepath.Join(p.dir, "bases")); len(got) != 0 {
		t.Errorf("bases left after every layer went: %v", got)
	}
}

// A Workspace id that would be a pattern or a path is refused before any
// file is touched: RemoveLayer looks for references in its name.
func TestRemoveLayerRefusesAnIdThatIsNoFileName(t *testing.T) {
	p := newForkPool(t, t.TempDir())
	for _, ws := range []string{"*", "src?", "[a", "../src", `a\b`} {
		if err := runtime.RemoveLayer(p.layer("src"), ws); err == nil || !strings.Contains(err.Error(), "is no file name") {
			t.Errorf("RemoveLayer with workspace id %q: %v, want a refusal", ws, err)
		}
	}
	if _, err := os.Stat(p.layer("src")); err != nil {
		t.Errorf("the layer after the refusals: %v", err)
	}
}
