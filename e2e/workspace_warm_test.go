package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/platform"
)

// warmTemplate is the template dev keeps a warm guest of in TestWorkspace
// (kibotos dev --warm kibotos-coding=1).
const warmTemplate = "kibotos-coding"

// bootMarker is what the guest's init writes to the console as it starts.
const bootMarker = platform.InitStartedLine

// testWarm creates Workspaces of the template dev keeps a warm guest of:
// one of the default size adopts the warm guest (the node's count of
// starts from warm guests goes up, and it says so), is its own Workspace
// (hostname, machine id, boot_id, random bytes differ between two of
// them; the machine id from a booted one's too) and keeps what it writes
// across a stop and start; the node makes the next warm guest; a create of another size boots, and so
// does one whose warm guest's VMM was killed. Its own Workspaces, all
// deleted again.
func (d *wsDev) testWarm(string) {
	t := d.t
	warm := func() api.WarmGuests {
		t.Helper()
		var n struct {
			Report *api.Report `json:"report"`
		}
		if err := clusterlab.DecodeResult(d.must("node", "get", "dev", "--json"), &n); err != nil {
			t.Fatal(err)
		}
		if n.Report != nil {
			for _, w := range n.Report.Warm {
				if w.Template == warmTemplate {
					return w
				}
			}
		}
		return api.WarmGuests{}
	}
	awaitWarm := func(what string, ok func(api.WarmGuests) bool) api.WarmGuests {
		t.Helper()
		var w api.WarmGuests
		testenv.WaitFor(t, 2*time.Minute, what, func() (bool, string) {
			w = warm()
			return ok(w), "node dev reports " + clusterlab.TrimTo(strings.ReplaceAll(d.must("node", "get", "dev").Stdout, "\n", "; "), 3000)
		})
		return w
	}
	create := func(args ...string) string {
		t.Helper()
		r := d.kibo(3*time.Minute, nil, append([]string{"workspace", "create", "-q", "--template", warmTemplate}, args...)...)
		if r.Code != 0 {
			t.Fatalf("%s", r)
		}
		return strings.TrimSpace(r.Stdout)
	}
	console := func(id string) string {
		t.Helper()
		var l machineLogView
		if err := clusterlab.DecodeResult(d.must("workspace", "logs", id, "--json"), &l); err != nil {
			t.Fatal(err)
		}
		return l.Console
	}
	type ident struct{ hostname, machineID, bootID, random string }
	identity := func(id string) ident {
		t.Helper()
		out := d.must("workspace", "exec", id, "--", "sh", "-c",
			"hostname; cat /etc/machine-id; cat /proc/sys/kernel/random/boot_id; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' '").Stdout
		l := strings.Split(strings.TrimSpace(out), "\n")
		if len(l) != 4 {
			t.Fatalf("%s: %q", id, out)
		}
		return ident{l[0], l[1], l[2], l[3]}
	}

	// A ready warm guest's memory is allocated on the node: placement
	// does not count it free.
	allocated := func() (got, want uint64) {
		t.Helper()
		var n struct {
			Report *api.Report `json:"report"`
		}
		var l struct {
			Workspaces []api.Workspace `json:"workspaces"`
		}
		if err := clusterlab.DecodeResult(d.must("node", "get", "dev", "--json"), &n); err != nil || n.Report == nil {
			t.Fatalf("node dev: %+v %v", n, err)
		}
		if err := clusterlab.DecodeResult(d.must("workspace", "list", "--json"), &l); err != nil {
			t.Fatal(err)
		}
		for _, w := range n.Report.Warm {
			want += uint64(w.Ready) * w.MemoryBytes
		}
		for _, w := range l.Workspaces {
			if w.NodeID == "dev" && w.State == api.WorkspaceAvailable {
				want += w.MemoryBytes
			}
		}
		return n.Report.Allocated.MemoryBytes, want
	}
	awaitWarm("a warm guest of "+warmTemplate+" ready on node dev", func(w api.WarmGuests) bool { return w.Ready == 1 })
	testenv.WaitFor(t, 30*time.Second, "node dev's allocated memory to hold its running Workspaces' and its ready warm guest's", func() (bool, string) {
		got, want := allocated()
		return got == want, fmt.Sprintf("allocated %d bytes, want %d", got, want)
	})

	var made []string
	seen := map[string]ident{}
	for i := range 2 {
		before := awaitWarm("a warm guest of "+warmTemplate+" ready on node dev", func(w api.WarmGuests) bool { return w.Ready == 1 && w.Wanted == 1 })
		id := create()
		made = append(made, id)
		awaitWarm("the start of "+id+" counted as one from a warm guest", func(w api.WarmGuests) bool { return w.Starts == before.Starts+1 })
		if !d.devProc().LogContains(`msg="instance started from a warm guest" node_id=dev workspace_id=` + id + ` `) {
			t.Errorf("Workspace %d (%s): the node's log does not say it started from a warm guest", i+1, id)
		}
		seen[id] = identity(id)
		if s := seen[id]; s.hostname != id || len(s.machineID) != 32 {
			t.Errorf("Workspace %s restored from a warm guest: %+v; want its own hostname and a machine id", id, s)
		}
	}
	a, b := seen[made[0]], seen[made[1]]
	if a.machineID == b.machineID || a.bootID == b.bootID || a.random == b.random {
		t.Errorf("two Workspaces restored from warm guests share an identity: %+v and %+v", a, b)
	}
	if out := d.must("node", "get", "dev").Stdout; !strings.Contains(out, "Warm "+warmTemplate+":") {
		t.Errorf("kibo node get dev does not show the warm guests:\n%s", out)
	}

	// Its layer is its own: what it writes stays across a (cold) start.
	d.must("workspace", "exec", made[0], "--", "sh", "-c", "echo kept > /warm.txt && sync")
	d.must("workspace", "stop", made[0])
	d.must("workspace", "start", made[0])
	if got := strings.TrimSpace(d.must("workspace", "exec", made[0], "--", "sh", "-c", "cat /warm.txt; cat /etc/machine-id").Stdout); got != "kept\n"+a.machineID {
		t.Errorf("after stop and start: %q; want the file and machine id it had", got)
	}

	// Another size boots: the warm guest is 512MiB. (dev's two CPUs: one
	// of the two goes first.)
	d.must("workspace", "delete", made[1])
	made = made[:1]
	ready := awaitWarm("the next warm guest ready", func(w api.WarmGuests) bool { return w.Ready == 1 })
	other := create("--memory", "256MiB")
	made = append(made, other)
	if c := console(other); !strings.Contains(c, bootMarker) {
		t.Errorf("a Workspace of 256MiB: its console lacks the guest's init starting (%s):\n%s", bootMarker, clusterlab.TrimTo(c, 1500))
	}
	// A booted Workspace has a machine id of its own too.
	if s := identity(other); len(s.machineID) != 32 || s.machineID == a.machineID || s.machineID == b.machineID {
		t.Errorf("a booted Workspace's identity %+v; want a machine id of its own (the warm ones: %s, %s)", s, a.machineID, b.machineID)
	}
	if w := warm(); w.Starts != ready.Starts || w.Ready != 1 {
		t.Errorf("after a create of another size: %+v; want %d starts and the warm guest still ready", w, ready.Starts)
	}

	// A warm guest whose VMM was killed is not adopted: the start boots instead, and the node ends
	// what is left of it and makes another warm guest.
	d.must("workspace", "delete", other)
	made = made[:1]
	instances := filepath.Join(d.dir, "storage", "runtime", "instances")
	records, _ := filepath.Glob(filepath.Join(instances, "warm-*", runtime.LaunchRecordFile))
	if len(records) != 1 {
		t.Fatalf("warm guests' launch records: %v; want one", records)
	}
	rec, err := runtime.ReadLaunchRecord(records[0])
	if err != nil || rec.Process == nil {
		t.Fatalf("warm guest's launch record: %+v, %v", rec, err)
	}
	if err := syscall.Kill(rec.Process.HostPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	booted := create()
	made = append(made, booted)
	if c := console(booted); !strings.Contains(c, bootMarker) {
		t.Errorf("a Workspace whose warm guest was killed: its console lacks the guest's init starting:\n%s", clusterlab.TrimTo(c, 1500))
	}
	if got := strings.TrimSpace(d.must("workspace", "exec", booted, "--", "hostname").Stdout); got != booted {
		t.Errorf("the Workspace booted instead of a killed warm guest has hostname %q", got)
	}
	// The node's report of its warm guests lags: it may still count the
	// killed one ready. Its directory going is what says it was ended.
	awaitWarm("a new warm guest after the killed one, and its directory alone under "+instances, func(w api.WarmGuests) bool {
		left, _ := filepath.Glob(filepath.Join(instances, "warm-*"))
		return w.Ready == 1 && w.Starts == ready.Starts && len(left) == 1 && left[0] != filepath.Dir(records[0])
	})
	for _, id := range made {
		d.must("workspace", "delete", id)
	}
}
