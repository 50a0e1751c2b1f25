package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/template"
	"github.com/kibotos/kibotos/vmm/units"
)

// warmCreate is what a node does for the first start of a Workspace that
// finds a warm guest (agent.startWorkspace): restore it over a copy of
// its layer with a new identity (its machine id written into the
// Workspace's filesystem the guest has mounted), and configure what it
// has not mounted yet.
func warmCreate(ctx context.Context, rt *runtime.Runtime, store runtime.WarmStore, spec runtime.Spec, slot string, m runtime.WarmMeta, ws string) error {
	spec.Configure = workspaceConfigure(ws)
	store.Restore(&spec, slot, m, ws, []string{agent.WorkspaceRoot})
	if !slices.Equal(spec.Identity.Roots, []string{agent.WorkspaceRoot}) {
		return fmt.Errorf("warm guest of slot %s: its identity goes to roots %q; want the Workspace's, mounted by the warm guest (%+v)", slot, spec.Identity.Roots, m.Mounts)
	}
	_, err := rt.Start(ctx, spec)
	return errors.Join(err, store.Remove(slot))
}

// workspaceConfigure mounts the Workspace's filesystem as the node does.
func workspaceConfigure(ws string) func(guestproto.GuestInfo) guestproto.ConfigureRequest {
	return func(g guestproto.GuestInfo) guestproto.ConfigureRequest { return agent.WorkspaceConfigure(ws, g) }
}

func warmSpec(tpl *template.Template, inst *platform.Installation, mib int) runtime.WarmSpec {
	return runtime.WarmSpec{WarmKey: runtime.WarmKey{Template: tpl.Name, TemplateID: tpl.ID, InstallationID: inst.ID, VCPUs: 1, MemoryMiB: mib},
		Image: tpl.Image(), Installation: inst, Mounts: agent.TemplateMounts}
}

// A warm guest: booted on a memory file, its template's filesystem
// mounted, and paused with its layer into a slot, its RAM left in the
// memory file, root's alone while it waits; only a start of the same
// template build, Platform and size takes it, and only once; restored
// over a copy of its layer and on its memory file as the Workspace's it
// is that Workspace (its hostname, its filesystem mounted once, a machine
// id of its own), the memory file unlinked; that Workspace pauses and
// resumes as any (its RAM then in its state file); and a restore over a
// layer that exists already is refused before QEMU starts.
func TestWarmGuest(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	rt := h.mustOpen(t)
	ctx := testCtx(t, 4*time.Minute)
	tpl := busyboxTemplate(ctx, t, h, "sh", "cat", "echo", "sync", "hostname")
	dir := filepath.Join(h.scratch, "warm", tpl.Name)
	store := rt.WarmStore(dir)
	ws := warmSpec(tpl, inst, 256)
	// The warm guest's VMM runs at the lowest priority while it boots:
	// nobody waits for it.
	bootNice := make(chan string, 1)
	go func() {
		for ctx.Err() == nil {
			for _, i := range rt.List() {
				if runtime.IsWarm(i.ID) && i.HostPID != 0 {
					bootNice <- testenv.ProcStatField(i.HostPID, 19)
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	slot, err := rt.BootWarm(ctx, dir, ws)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-bootNice:
		if n != strconv.Itoa(units.BackgroundNice) {
			t.Errorf("nice of the warm guest's VMM while it booted: %s; want %d", n, units.BackgroundNice)
		}
	default:
		t.Error("the warm guest's VMM was not seen while it booted")
	}
	if got := dirEntries(t, dir); !slices.Equal(got, []string{filepath.Base(slot)}) {
		t.Errorf("warm directory after a boot: %v; want the slot alone (no layer)", got)
	}
	if got := dirEntries(t, slot); strings.Join(got, " ") != "layer.qcow2 snapshot.json state warm.json" {
		t.Errorf("slot %s holds %v", slot, got)
	}
	// The kept layer is root's alone while it waits (the VMM account had
	// it while the guest ran).
	if st, err := os.Stat(filepath.Join(slot, runtime.WarmLayerFile)); err != nil || st.Mode().Perm() != 0o600 || st.Sys().(*syscall.Stat_t).Uid != 0 || st.Sys().(*syscall.Stat_t).Gid != 0 {
		t.Errorf("the slot's layer: %v, %v; want 0600 root:root", st.Mode(), err)
	}
	// So is its memory file, allocated whole; the state file holds the
	// devices alone.
	memory := filepath.Join(h.warmMemory, tpl.Name, filepath.Base(slot)+runtime.WarmMemorySuffix)
	if st, err := os.Stat(memory); err != nil || st.Mode().Perm() != 0o600 || st.Sys().(*syscall.Stat_t).Uid != 0 || st.Sys().(*syscall.Stat_t).Gid != 0 ||
		st.Size() != 256<<20 || st.Sys().(*syscall.Stat_t).Blocks*512 < 256<<20 {
		t.Errorf("the slot's memory file %s: %+v, %v; want 256 MiB allocated, 0600 root:root", memory, st, err)
	}
	if st, err := os.Stat(filepath.Join(slot, runtime.SnapshotStateFile)); err != nil || st.Size() > 16<<20 {
		t.Errorf("the slot's state file: %v; want the devices' state alone, not the guest's RAM (under 16 MiB)", err)
		if err == nil {
			t.Logf("state file of %d bytes", st.Size())
		}
	}
	if l := rt.List(); len(l) != 0 {
		t.Errorf("instances after a warm boot: %+v", l)
	}
	if ended, _ := rt.Ended(0); len(ended) != 0 {
		t.Errorf("ended records after a warm boot: %+v", ended)
	}
	other := ws.WarmKey
	other.MemoryMiB = 512
	if s, _, err := store.Take(other); s != "" || err != nil {
		t.Errorf("take of another size: %q, %v", s, err)
	}
	other = ws.WarmKey
	other.TemplateID = "another-build"
	if s, _, err := store.Take(other); s != "" || err != nil {
		t.Errorf("take of another template build: %q, %v", s, err)
	}
	taken, meta, err := store.Take(ws.WarmKey)
	if err != nil || taken == "" {
		t.Fatalf("take: %q, %v", taken, err)
	}
	if len(meta.Mounts) != 6 || meta.Mounts[0].Target != agent.WorkspaceRoot || meta.Mounts[5].Target != agent.WorkspaceRoot+guestproto.ResolvConf {
		t.Errorf("the warm guest mounted %+v; want the template's filesystem, the pseudo filesystems and resolv.conf in it", meta.Mounts)
	}
	if s, _, _ := store.Take(ws.WarmKey); s != "" {
		t.Errorf("a slot taken twice: %s", s)
	}

	pool := filepath.Join(h.scratch, "pool", "layers")
	os.MkdirAll(pool, 0o700)
	spec := runtime.Spec{InstanceID: "w-1", Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true, RootImage: tpl.Image(), LayerPath: filepath.Join(pool, "ws-a.qcow2")}
	if out, err := osexec.Command("qemu-img", "create", "-q", "-f", "qcow2", spec.LayerPath, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	refused := spec
	refused.InstanceID = "w-0"
	store.Restore(&refused, taken, meta, "ws-0", nil)
	if _, err := rt.Start(ctx, refused); err == nil || !strings.Contains(err.Error(), "a warm guest restores over a copy of its own layer, and "+spec.LayerPath+" exists") {
		t.Errorf("restore of a warm guest over an existing layer: %v", err)
	}
	rt.Delete(ctx, "w-0")
	os.Remove(spec.LayerPath)

	if _, err := os.Stat(memory); err != nil {
		t.Fatalf("the memory file after a refused restore: %v; want it kept for the restore that QEMU starts for", err)
	}
	if err := warmCreate(ctx, rt, store, spec, taken, meta, "ws-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(memory); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the memory file of the restored guest: %v; want it unlinked (the VMM maps it, nobody else may)", err)
	}
	// The Workspace restored from it is not background work.
	if st, err := rt.Status("w-1"); err != nil || testenv.ProcStatField(st.HostPID, 19) != "0" {
		t.Errorf("nice of the restored Workspace's VMM: %q (%v); want 0", testenv.ProcStatField(st.HostPID, 19), err)
	}
	sh := func(script string) string {
		t.Helper()
		r, err := run(ctx, rt, "w-1", guestproto.ExecRequest{Root: agent.WorkspaceRoot, Argv: []string{"/bin/sh", "-c", script}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			t.Fatalf("%s: %+v, %v", script, r, err)
		}
		return strings.TrimSpace(r.stdout)
	}
	if got := sh("hostname; cat /etc/kibotos-template; cat /etc/machine-id"); !strings.HasPrefix(got, "ws-a\ncoding\n") || len(got) != len("ws-a\ncoding\n")+32 {
		t.Errorf("restored warm guest: hostname, template marker, machine id %q", got)
	}
	// Mounted once, by the warm guest, not again over it by the start.
	if got := sh("grep -c ' / ext4 ' /proc/mounts; grep -c ' /proc proc ' /proc/mounts; grep -c ' /dev/pts devpts ' /proc/mounts; grep -c ' /etc/resolv.conf ' /proc/mounts"); got != "1\n1\n1\n1" {
		t.Errorf("mounts of the Workspace's root, its /proc, /dev/pts and resolv.conf: %q, want each once", got)
	}
	// A terminal in the Workspace has a name there (tmux, ssh need it):
	// its pair comes from the Workspace's own devpts.
	named := func(id string) {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Root: agent.WorkspaceRoot, PTY: &guestproto.WinSize{Rows: 24, Cols: 80},
			Argv: []string{"/bin/sh", "-c", `t=$(tty) && test -c "$t" && echo "$t"`}}, nil)
		if got := strings.TrimSpace(r.stdout); err != nil || r.exit.ExitCode != 0 || !strings.HasPrefix(got, "/dev/pts/") {
			t.Errorf("tty in a terminal of %s: %q, exit %+v, %v; want its /dev/pts name", id, got, r.exit, err)
		}
	}
	named("w-1")
	// The agent's resolv.conf, written in place by the network configure.
	if got := sh("cat /etc/resolv.conf"); !strings.HasPrefix(got, "nameserver ") {
		t.Errorf("the Workspace's resolv.conf: %q, want the guest's nameserver", got)
	}
	sh("echo kept > /data.txt && sync")
	// Paused, its RAM goes into its state file, and it resumes without
	// the memory file.
	sh("sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > /sleeper.pid")
	paused := filepath.Join(h.scratch, "paused-w-1")
	if _, err := rt.Pause(ctx, "w-1", paused); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, "w-1"); err != nil {
		t.Fatal(err)
	}
	resumed := spec
	resumed.InstanceID, resumed.Restore = "w-1r", &runtime.RestoreSpec{Dir: paused}
	if _, err := rt.Start(ctx, resumed); err != nil {
		t.Fatalf("resume of a Workspace made from a warm guest: %v", err)
	}
	r, err := run(ctx, rt, "w-1r", guestproto.ExecRequest{Root: agent.WorkspaceRoot, Argv: []string{"/bin/sh", "-c", "kill -0 $(cat /sleeper.pid) && hostname"}}, nil)
	if err != nil || r.exit.ExitCode != 0 || strings.TrimSpace(r.stdout) != "ws-a" {
		t.Errorf("after the resume: %+v, %v; want its process and hostname", r, err)
	}
	if err := rt.Stop(ctx, "w-1r", runtime.DefaultGrace); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, "w-1r"); err != nil {
		t.Fatal(err)
	}
	// The layer is the Workspace's: a cold start of it reads what it wrote.
	spec.InstanceID = "w-2"
	spec.Configure = workspaceConfigure("ws-a")
	if _, err := rt.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	r, err = run(ctx, rt, "w-2", guestproto.ExecRequest{Root: agent.WorkspaceRoot, Argv: []string{"cat", "/data.txt"}}, nil)
	if err != nil || strings.TrimSpace(r.stdout) != "kept" {
		t.Errorf("the layer after a cold start: %+v, %v", r, err)
	}
	named("w-2")
	if err := rt.Delete(ctx, "w-2"); err != nil {
		t.Fatal(err)
	}
	// Nothing is left of the warm guest but what Clean keeps.
	if n, err := store.Clean(func(runtime.WarmMeta) bool { return false }, true); n != 0 || err != nil {
		t.Errorf("clean after the take: %d removed, %v", n, err)
	}
	if got := dirEntries(t, filepath.Join(h.warmMemory, tpl.Name)); len(got) != 0 {
		t.Errorf("memory files after the take: %v", got)
	}
}

// BenchmarkWarmCreate measures on one node, with the same Platform,
// template and a 512 MiB, 1-vCPU guest, what a node does for the first
// start of a Workspace, to the first exec answer in its filesystem: a
// cold boot (a new layer, boot, mount) against the restore of a warm
// guest (take the slot, restore over a copy of its layer, its filesystem
// mounted, with a new identity and machine id). The warm guest is made
// before each
// iteration's timings and is not in them. It reports the medians in ms
// and warm/cold, the ratio the issue sets at ≤ 0.15. What ctrl adds to a
// create (the write, placement, the session) is the same for both.
//
//	go test ./agent/runtime -run X -bench WarmCreate -benchtime 3x
func BenchmarkWarmCreate(b *testing.B) {
	h, inst, rt, ctx := benchRuntime(b)
	tpl := busyboxTemplate(ctx, b, h, "sh", "true")
	dir := filepath.Join(h.scratch, "warm", tpl.Name)
	store := rt.WarmStore(dir)
	layers := filepath.Join(h.scratch, "pool", "layers")
	os.MkdirAll(layers, 0o700)
	ws := warmSpec(tpl, inst, 512)
	exec := func(id string) {
		b.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Root: agent.WorkspaceRoot, Argv: []string{"true"}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			b.Fatalf("true in %s: %+v, %v", id, r, err)
		}
	}
	var cold, warm []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		if _, err := rt.BootWarm(ctx, dir, ws); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		spec := func(id string) runtime.Spec {
			return runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 512, Network: true, RootImage: tpl.Image(), LayerPath: filepath.Join(layers, id+".qcow2")}
		}
		c := spec(fmt.Sprintf("c-%d", i))
		c.Configure = workspaceConfigure(c.InstanceID)
		t0 := time.Now()
		if _, err := rt.Start(ctx, c); err != nil {
			b.Fatal(err)
		}
		exec(c.InstanceID)
		cold = append(cold, time.Since(t0))
		// Each runs alone: a TCG guest just booted still takes CPU.
		b.StopTimer()
		if err := rt.Delete(ctx, c.InstanceID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		w := spec(fmt.Sprintf("w-%d", i))
		t0 = time.Now()
		slot, m, err := store.Take(ws.WarmKey)
		if err != nil || slot == "" {
			b.Fatalf("take: %q, %v", slot, err)
		}
		if err := warmCreate(ctx, rt, store, w, slot, m, w.InstanceID); err != nil {
			b.Fatal(err)
		}
		exec(w.InstanceID)
		warm = append(warm, time.Since(t0))

		b.StopTimer()
		if err := rt.Delete(ctx, w.InstanceID); err != nil {
			b.Fatal(err)
		}
		os.Remove(c.LayerPath)
		os.Remove(w.LayerPath)
		b.StartTimer()
	}
	if os.Getenv("KB_DUMP") != "" {
		b.Logf("%s", h.logs.String())
	}
	c, w := median(cold), median(warm)
	b.ReportMetric(c, "cold-ms")
	b.ReportMetric(w, "warm-ms")
	b.ReportMetric(w/c, "warm/cold")
}

// Slots a crash, another build or a bad disk left (warm.json missing,
// unreadable, too large, of another format; a memory file missing, of
// another size, not allocated, not root's alone) are never taken and are
// removed by the next clean with their memory files, as are memory files
// without a slot; a taken slot only at startup.
func TestWarmSlotsSkipUnreadable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tpl")
	memory := "/dev/shm/" + filepath.Base(filepath.Dir(dir)) + "-warm"
	t.Cleanup(func() { os.RemoveAll(memory) })
	store := runtime.WarmStore{Dir: dir, MemoryDir: filepath.Join(memory, "tpl")}
	if err := os.MkdirAll(store.MemoryDir, 0o700); err != nil {
		t.Fatal(err)
	}
	key := runtime.WarmKey{Template: "tpl", TemplateID: "t1", InstallationID: "i1", VCPUs: 1, MemoryMiB: 2}
	good, err := json.Marshal(runtime.WarmMeta{FormatVersion: 3, WarmKey: key, MemoryInFile: true})
	if err != nil {
		t.Fatal(err)
	}
	meta := func(format int) string {
		return strings.Replace(string(good), `"format_version":3`, `"format_version":`+strconv.Itoa(format), 1)
	}
	slots := map[string]string{
		"warm-good":    string(good),
		"warm-old":     meta(2), // no memory file, older build
		"warm-older":   meta(1), // a guest that never mounted its layer
		"warm-corrupt": `{"format_version":3,"template":`,
		"warm-future":  meta(4),
		"warm-large":   `{"format_version":3,"template":"` + strings.Repeat("x", 70<<10) + `"}`,
		"warm-partial": "",
		"other":        string(good),
		"warm-nomem":   string(good),
		"warm-small":   string(good),
		"warm-sparse":  string(good),
		"warm-shared":  string(good),
	}
	for slot, meta := range slots {
		if err := os.MkdirAll(filepath.Join(dir, slot), 0o700); err != nil {
			t.Fatal(err)
		}
		if meta != "" {
			if err := os.WriteFile(filepath.Join(dir, slot, runtime.WarmMetaFile), []byte(meta), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	os.WriteFile(filepath.Join(dir, "warm-partial.qcow2"), nil, 0o600) // a boot's layer
	memoryFile := func(slot string, size int64, allocate bool, mode os.FileMode) {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(store.MemoryDir, slot+runtime.WarmMemorySuffix), os.O_RDWR|os.O_CREATE, mode)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if allocate {
			err = syscall.Fallocate(int(f.Fd()), 0, 0, size)
		} else {
			err = f.Truncate(size)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	memoryFile("warm-good", 2<<20, true, 0o600)
	memoryFile("warm-small", 1<<20, true, 0o600)
	memoryFile("warm-sparse", 2<<20, false, 0o600)
	memoryFile("warm-shared", 2<<20, true, 0o644)
	memoryFile("warm-gone", 2<<20, true, 0o600) // its slot was removed

	got, err := store.Slots()
	if err != nil || len(got) != 1 || got[filepath.Join(dir, "warm-good")].WarmKey != key {
		t.Fatalf("slots %v (%v), want warm-good alone", got, err)
	}
	other := key
	other.MemoryMiB = 1024
	if slot, _, err := store.Take(other); slot != "" || err != nil {
		t.Fatalf("take of another size: %q %v", slot, err)
	}
	taken, m, err := store.Take(key)
	if err != nil || filepath.Base(taken) != ".taken-warm-good" || !m.MemoryInFile {
		t.Fatalf("take: %q %+v %v", taken, m, err)
	}
	// The taken slot's restore runs on its memory file.
	var spec runtime.Spec
	store.Restore(&spec, taken, m, "ws", nil)
	if want := filepath.Join(store.MemoryDir, "warm-good"+runtime.WarmMemorySuffix); spec.MemoryFile != want || spec.Restore.MemoryFile != want {
		t.Errorf("restore of the taken slot: memory file %q, restore's %q; want %s", spec.MemoryFile, spec.Restore.MemoryFile, want)
	}
	if slot, _, err := store.Take(key); slot != "" || err != nil {
		t.Fatalf("second take: %q %v", slot, err)
	}
	keepAll := func(runtime.WarmMeta) bool { return true }
	if n, err := store.Clean(keepAll, false); err != nil || n != 12 {
		t.Fatalf("clean removed %d (%v), want the 12 unreadable, older, newer, foreign or memoryless entries", n, err)
	}
	if got := dirEntries(t, dir); !slices.Equal(got, []string{".taken-warm-good"}) {
		t.Fatalf("after a clean: %v, want the taken slot alone", got)
	}
	if got := dirEntries(t, store.MemoryDir); !slices.Equal(got, []string{"warm-good" + runtime.WarmMemorySuffix}) {
		t.Fatalf("memory files after a clean: %v, want the taken slot's alone", got)
	}
	if n, err := store.Clean(keepAll, true); err != nil || n != 1 || len(dirEntries(t, dir)) != 0 || len(dirEntries(t, store.MemoryDir)) != 0 {
		t.Fatalf("clean at startup removed %d (%v), left %v and memory files %v", n, err, dirEntries(t, dir), dirEntries(t, store.MemoryDir))
	}
	// A store without a memory directory never takes a slot whose RAM
	// is in a memory file.
	os.MkdirAll(filepath.Join(dir, "warm-good"), 0o700)
	os.WriteFile(filepath.Join(dir, "warm-good", runtime.WarmMetaFile), good, 0o600)
	memoryFile("warm-good", 2<<20, true, 0o600)
	if slot, _, err := (runtime.WarmStore{Dir: dir}).Take(key); slot != "" || err != nil {
		t.Fatalf("take without a memory directory: %q %v", slot, err)
	}
}
