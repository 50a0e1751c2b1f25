package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
)

// testFork forks a paused Workspace twice (kibo workspace create --from):
// each fork restores the source's guest (its file, its counting process)
// with its own hostname, machine id, boot_id and random bytes; what a fork
// writes never reaches the source, which resumes once they are deleted;
// the frozen layer they shared goes with the last of them. Its own Workspaces, all
// deleted again (after the steps that count Instances).
func (d *wsDev) testFork(string) {
	t := d.t
	// A create waits for AVAILABLE: a boot under TCG.
	create := func(args ...string) string {
		t.Helper()
		r := d.kibo(3*time.Minute, nil, append([]string{"workspace", "create", "-q"}, args...)...)
		if r.Code != 0 {
			t.Fatalf("%s", r)
		}
		return strings.TrimSpace(r.Stdout)
	}
	src := create("--template", "kibotos-base")
	if r := d.expect(api.ExitFailedPrecondition, "workspace", "create", "--from", src); !strings.Contains(r.Stderr, "workspace "+src+" is AVAILABLE: a fork needs it PAUSED") {
		t.Errorf("fork of a running Workspace: %s", r)
	}
	if r := d.expect(api.ExitUsage, "workspace", "create", "--from", src, "--memory", "1GiB"); !strings.Contains(r.Stderr, "--cpu or --memory with --from") {
		t.Errorf("fork with --memory: %s", r)
	}
	d.must("workspace", "exec", src, "--", "sh", "-c", "echo source > /fork.txt && sync; (i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv -f /tmp/count.new /tmp/count; sleep 0.1; done) >/dev/null 2>&1 &")
	d.must("workspace", "pause", src)

	type ident struct{ file, count, machineID, bootID, random, hostname string }
	var forks []string
	seen := map[string]ident{}
	for i := range 2 {
		f := create("--from", src, "--label", "fork=yes")
		forks = append(forks, f)
		if got := d.must("workspace", "get", f).Stdout; !strings.Contains(got, "Forked from:") || !strings.Contains(got, src) {
			t.Errorf("workspace get of fork %d:\n%s", i+1, got)
		}
		out := d.must("workspace", "exec", f, "--", "sh", "-c",
			"cat /fork.txt; sleep 0.3; cat /tmp/count; cat /etc/machine-id; cat /proc/sys/kernel/random/boot_id; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' '; hostname").Stdout
		l := strings.Split(strings.TrimSpace(out), "\n")
		if len(l) != 6 {
			t.Fatalf("fork %s: %q", f, out)
		}
		seen[f] = ident{l[0], l[1], l[2], l[3], l[4], l[5]}
		d.must("workspace", "exec", f, "--", "sh", "-c", "echo "+f+" > /fork.txt && sync")
	}
	a, b := seen[forks[0]], seen[forks[1]]
	t.Logf("forks of %s: %+v", src, seen)
	for _, f := range forks {
		if s := seen[f]; s.file != "source" || s.count == "" || s.count == "0" || s.hostname != f {
			t.Errorf("fork %s: %+v; want the source's file and counter, its own hostname", f, s)
		}
	}
	if len(a.machineID) != 32 || a.machineID == b.machineID || a.bootID == b.bootID || a.random == b.random {
		t.Errorf("two forks share an identity: %+v and %+v", a, b)
	}
	if w := d.get(src); w.State != api.WorkspacePaused {
		t.Errorf("the source after its forks: %+v", w)
	}
	// The forks go first (dev has CPU for two guests at once): their
	// deletes leave the source's layer and snapshot alone.
	for _, f := range forks {
		d.must("workspace", "delete", f)
	}
	d.must("workspace", "resume", src)
	if got := strings.TrimSpace(d.must("workspace", "exec", src, "--", "cat", "/fork.txt").Stdout); got != "source" {
		t.Errorf("the source after its forks wrote: %q", got)
	}
	d.must("workspace", "delete", src)
	bases := filepath.Join(datadir.Dir(d.dir).StorageRoot(), "pools", "default", "bases")
	if es, err := os.ReadDir(bases); err != nil || len(es) != 0 {
		t.Errorf("%s after every fork and the source went: %v %v", bases, es, err)
	}
}
