package runtime_test

import (
	"context"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/units"
)

// adoptResident is what a node does for the first start of a Workspace
// that finds a resident warm guest (agent.startWorkspace).
func adoptResident(ctx context.Context, rt *runtime.Runtime, r runtime.Resident, spec runtime.Spec, ws string) error {
	spec.Configure = workspaceConfigure(ws)
	_, err := rt.Adopt(ctx, r, spec, ws, []string{agent.WorkspaceRoot})
	return err
}

// vcpusRunning asks the VMM of the Instance in dir whether its vCPUs run.
func vcpusRunning(ctx context.Context, t *testing.T, dir string) bool {
	t.Helper()
	q, err := qemu.DialQMP(ctx, filepath.Join(dir, "qmp.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var st struct {
		Running bool `json:"running"`
	}
	if err := q.Execute(ctx, "query-status", nil, &st); err != nil {
		t.Fatal(err)
	}
	return st.Running
}

// A resident warm guest: booted as background work with egress none, its
// template's filesystem mounted, then kept with its vCPUs stopped; only a
// start of the same Platform and size, over a new layer on the same file
// system, adopts it, and only once. The Instance that adopts it is that
// Workspace's: its policy (public egress reaches the lab's internet), its
// layer, hostname and a machine id of its own, its filesystem mounted
// once, the priority of any VMM; a new node process takes it over; it
// pauses and resumes as any, and its layer boots cold. A resident ended
// unadopted leaves nothing.
func TestResidentWarmGuest(t *testing.T) {
	h := newHarness(t)
	h.wireInternet()
	h.lab.HTTP("inet", labInternet+":8080", "from the internet")
	inst := platformFixture(t)
	rt := h.mustOpen(t)
	ctx := testCtx(t, 5*time.Minute)
	tpl := busyboxTemplate(ctx, t, h, "sh", "cat", "echo", "sync", "hostname", "sleep", "kill")
	ws := warmSpec(tpl, inst, 256)
	instances := filepath.Join(h.root, "runtime", "instances")
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
	r, err := rt.BootResident(ctx, ws)
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
	if got := rt.Residents(); len(got) != 1 || got[0].ID != r.ID {
		t.Fatalf("residents after a boot: %+v; want %s", got, r.ID)
	}
	if len(r.Mounts) != 6 || r.Mounts[0].Target != agent.WorkspaceRoot || r.Mounts[5].Target != agent.WorkspaceRoot+guestproto.ResolvConf {
		t.Errorf("the warm guest mounted %+v; want the template's filesystem, the pseudo filesystems and resolv.conf in it", r.Mounts)
	}
	if vcpusRunning(ctx, t, filepath.Join(instances, r.ID)) {
		t.Error("a resident warm guest's vCPUs run")
	}

	pool := filepath.Join(h.root, "pools", "default", "layers")
	os.MkdirAll(pool, 0o700)
	spec := runtime.Spec{InstanceID: "w-1", Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true, RootImage: tpl.Image(),
		LayerPath: filepath.Join(pool, "ws-a.qcow2"), Policy: runtime.NetworkPolicy{Egress: "public"}}
	bigger := spec
	bigger.MemoryMiB = 512
	if _, err := rt.Adopt(ctx, r, bigger, "ws-a", nil); !errors.Is(err, runtime.ErrNotAdoptable) {
		t.Errorf("adopt at another size: %v; want ErrNotAdoptable", err)
	}
	if out, err := osexec.Command("qemu-img", "create", "-q", "-f", "qcow2", spec.LayerPath, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	if _, err := rt.Adopt(ctx, r, spec, "ws-a", nil); !errors.Is(err, runtime.ErrNotAdoptable) || !strings.Contains(err.Error(), "exists already") {
		t.Errorf("adopt over an existing layer: %v; want ErrNotAdoptable", err)
	}
	os.Remove(spec.LayerPath)
	if got := rt.Residents(); len(got) != 1 {
		t.Fatalf("residents after refused adoptions: %+v; want it kept", got)
	}

	if err := adoptResident(ctx, rt, r, spec, "ws-a"); err != nil {
		t.Fatal(err)
	}
	if got := rt.Residents(); len(got) != 0 {
		t.Errorf("residents after the adoption: %+v", got)
	}
	if _, err := rt.Adopt(ctx, r, spec, "ws-b", nil); !errors.Is(err, runtime.ErrNotAdoptable) {
		t.Errorf("a second adoption of one resident: %v; want ErrNotAdoptable", err)
	}
	if !sameFile(r.Layer, spec.LayerPath) {
		t.Errorf("the Workspace's layer %s is not the resident's %s", spec.LayerPath, r.Layer)
	}
	rec, err := runtime.ReadLaunchRecord(filepath.Join(instances, r.ID, runtime.LaunchRecordFile))
	if err != nil || rec.InstanceID != "w-1" || rec.Host != r.ID || rec.LayerPath != spec.LayerPath || rec.Network.Policy.Egress != "public" {
		t.Fatalf("launch record of the adopted Instance: %+v, %v", rec, err)
	}
	st, err := rt.Status("w-1")
	if err != nil || st.State != runtime.StateRunning || st.LayerPath != spec.LayerPath || testenv.ProcStatField(st.HostPID, 19) != "0" {
		t.Errorf("the adopted Instance: %+v, %v, nice %s; want RUNNING on its layer at nice 0", st, err, testenv.ProcStatField(st.HostPID, 19))
	}
	sh := func(id, script string) string {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Root: agent.WorkspaceRoot, Argv: []string{"/bin/sh", "-c", script}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			t.Fatalf("%s: %s: %+v, %v", id, script, r, err)
		}
		return strings.TrimSpace(r.stdout)
	}
	if got := sh("w-1", "hostname; cat /etc/kibotos-template; cat /etc/machine-id"); !strings.HasPrefix(got, "ws-a\ncoding\n") || len(got) != len("ws-a\ncoding\n")+32 {
		t.Errorf("adopted warm guest: hostname, template marker, machine id %q", got)
	}
	if got := sh("w-1", "grep -c ' / ext4 ' /proc/mounts; grep -c ' /proc proc ' /proc/mounts; grep -c ' /etc/resolv.conf ' /proc/mounts"); got != "1\n1\n1" {
		t.Errorf("mounts of the Workspace's root, its /proc and resolv.conf: %q, want each once", got)
	}
	fetch := `printf 'GET / HTTP/1.0\r\nHost: x\r\n\r\n' | nc -w 3 ` + labInternet + ` 8080`
	if out, err := run(ctx, rt, "w-1", guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", fetch}}, nil); err != nil || !strings.Contains(out.stdout, "from the internet") {
		t.Errorf("the adopted Instance's public egress: %+v, %v; want the lab's internet reached", out, err)
	}
	sh("w-1", "echo kept > /data.txt && sync && sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > /sleeper.pid")

	// A new node process takes it over from its record.
	rt.Close()
	rt = h.mustOpen(t)
	if got := sh("w-1", "kill -0 $(cat /sleeper.pid) && hostname"); got != "ws-a" {
		t.Errorf("after a takeover: %q", got)
	}
	paused := filepath.Join(h.scratch, "paused-w-1")
	if _, err := rt.Pause(ctx, "w-1", paused); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, "w-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(instances, r.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the adopted Instance's directory after its delete: %v", err)
	}
	resumed := spec
	resumed.InstanceID, resumed.Restore = "w-1r", &runtime.RestoreSpec{Dir: paused}
	if _, err := rt.Start(ctx, resumed); err != nil {
		t.Fatalf("resume of a Workspace made from a resident: %v", err)
	}
	if got := sh("w-1r", "kill -0 $(cat /sleeper.pid) && hostname && cat /data.txt"); got != "ws-a\nkept" {
		t.Errorf("after the resume: %q; want its process, hostname and file", got)
	}
	if err := rt.Delete(ctx, "w-1r"); err != nil {
		t.Fatal(err)
	}

	// Unadopted, a resident leaves nothing.
	r2, err := rt.BootResident(ctx, ws)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.EndResident(ctx, r2); err != nil {
		t.Fatal(err)
	}
	if l := rt.List(); len(l) != 0 {
		t.Errorf("instances after a resident ended: %+v", l)
	}
	ended, _ := rt.Ended(0)
	for _, e := range ended {
		if runtime.IsWarm(e.InstanceID) {
			t.Errorf("ended record of a warm guest: %+v", e)
		}
	}
	if got := dirEntries(t, instances); len(got) != 0 {
		t.Errorf("instance directories left: %v", got)
	}
}

func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}
