package e2e

// The Debian package under a booted systemd: two releases are packaged by
// scripts/package.sh, and a throwaway host (internal/testhost: systemd as
// PID 1 in its own namespaces, root an overlay of this machine's /) installs
// the first with dpkg, creates a one-member cluster, starts kibotos.service,
// runs a Workspace, restarts the service, upgrades to the second release
// with the VM running, and has apt-get refuse the removal while the
// Instance runs. dpkg's database and everything the package writes stay in
// the overlay.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/internal/testhost"
)

const (
	pkgOld, pkgNew = "0.9.0", "0.9.1"
	pkgNode        = "pkg"
	pkgAddr        = "10.200.0.2" // the host's uplink address (its own network namespace)
	pkgDebs        = "/srv/kibotos-debs"
	pkgCache       = "/var/cache/kibotos-test-platform"
)

// pkgHost is the booted host and the test driving it.
type pkgHost struct {
	t *testing.T
	h *testhost.Host
}

func TestPackage(t *testing.T) {
	runtimetest.RequireVMHost(t)
	if err := testhost.Available(); err != nil {
		testenv.Skipf(t, "%v", err)
	}
	testenv.LookPath(t, "nsenter", "util-linux")
	testenv.LookPath(t, "dpkg-deb", "dpkg")
	testenv.LookPath(t, "apt-get", "apt")
	testenv.LookPath(t, "ip", "iproute2")
	tmp := t.TempDir()
	onMachine := machineFiles()

	debs := filepath.Join(tmp, "debs")
	t0 := time.Now()
	for _, rel := range []string{pkgOld, pkgNew} {
		cmd := exec.Command("bash", "../scripts/package.sh")
		cmd.Env = append(os.Environ(), "KIBOTOS_RELEASE="+rel, "KIBOTOS_DIST_DIR="+debs)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("scripts/package.sh %s: %v\n%s", rel, err, out)
		}
	}
	t.Logf("TIMING two packages built in %s", time.Since(t0).Round(time.Millisecond))
	cache := platformCache(t, filepath.Join(debs, "kibotos_"+pkgOld+"_amd64.deb"), tmp)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	h, err := testhost.Start(ctx, filepath.Join(tmp, "host"), testhost.Options{Hostname: pkgNode, Shares: []testhost.Share{
		{Host: debs, Guest: pkgDebs, ReadOnly: true},
		{Host: cache, Guest: pkgCache},
	}})
	if err != nil {
		t.Fatal(err)
	}
	p := &pkgHost{t: t, h: h}
	t.Cleanup(p.cleanup)
	// The host's uplink: one end of a veth pair (both in its own network
	// namespace) with a default route.
	for _, args := range [][]string{
		{"link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1"},
		{"addr", "add", pkgAddr + "/24", "dev", "uplink0"},
		{"link", "set", "uplink1", "up"},
		{"link", "set", "uplink0", "up"},
		{"route", "add", "default", "via", "10.200.0.1"},
	} {
		p.must(10*time.Second, "ip", args...)
	}

	// Install as an operator does: dpkg -i, the configuration, init, the
	// node's Platform and a template, then the service.
	tInstall := time.Now()
	p.must(2*time.Minute, "dpkg", "-i", pkgDebs+"/kibotos_"+pkgOld+"_amd64.deb")
	dInstall := time.Since(tInstall)
	p.checkInstalled()
	p.writeConfig()
	step := time.Now()
	p.must(time.Minute, "kibotos", "init", "--advertise", pkgAddr+":7400", "--node-id", pkgNode)
	p.must(3*time.Minute, "kibotos", "platform", "build", "--cache-dir", pkgCache)
	p.must(2*time.Minute, "kibotos", "template", "build", "kibotos-base", "--busybox")
	dPrepare := time.Since(step)
	step = time.Now()
	p.must(time.Minute, "systemctl", "enable", "--now", "kibotos")
	p.waitNodeReady(0)
	dReady := time.Since(step)
	p.must(time.Minute, "kibo", "storage-pool", "set-capacity", pkgNode+":default", "20GiB")
	step = time.Now()
	ws := strings.TrimSpace(p.must(3*time.Minute, "kibo", "workspace", "create", "--template", "kibotos-base", "--cpu", "1", "--memory", "512MiB", "-q").Stdout)
	dCreate := time.Since(step)
	step = time.Now()
	p.exec(ws, "hello")
	dExec := time.Since(step)
	t.Logf("TIMING dpkg -i %s → first Workspace exec answering: %s (dpkg -i %s, init + platform build + template build %s, systemctl enable --now → node READY %s, workspace create %s, exec %s)",
		pkgOld, time.Since(tInstall).Round(time.Millisecond), dInstall.Round(time.Millisecond), dPrepare.Round(time.Millisecond),
		dReady.Round(time.Millisecond), dCreate.Round(time.Millisecond), dExec.Round(time.Millisecond))
	vm := p.vmUnit()
	p.checkNoStopDependency(vm)
	p.checkMainPIDRefused()

	// systemctl restart: the member goes, the VM stays.
	before := p.unitRun(vm)
	inc := p.waitNodeReady(0)
	member := p.unitRun("kibotos.service")
	p.must(time.Minute, "systemctl", "restart", "kibotos")
	inc = p.waitNodeReady(inc)
	if again := p.unitRun("kibotos.service"); again.mainPID == member.mainPID {
		t.Fatalf("systemctl restart kibotos: MainPID still %s", again.mainPID)
	}
	kept := p.keptVMs(map[string]unitRun{vm: before})
	t.Logf("VMs kept across systemctl restart kibotos: %d of 1", kept)
	if kept != 1 {
		t.Fatalf("systemctl restart kibotos restarted the VM: unit %s was %+v, is %+v", vm, before, p.unitRun(vm))
	}
	p.exec(ws, "after restart")

	// dpkg -i of the newer release with the VM running, while the
	// installed build's check-maintenance refuses the upgrade (an Instance
	// directory without a launch record, which the node removes when it
	// starts): the seed's dpkg row, the old pre-removal script fails and
	// dpkg runs the new package's, which only stops the member.
	leftover := "/var/lib/kibotos/storage/runtime/instances/inst-leftover"
	p.must(time.Minute, "mkdir", "-p", leftover)
	r := p.must(3*time.Minute, "dpkg", "-i", pkgDebs+"/kibotos_"+pkgNew+"_amd64.deb")
	if out := r.Stdout + r.Stderr; !strings.Contains(out, "trying script from the new package instead") || !strings.Contains(out, "instance directory without a launch record") {
		t.Errorf("dpkg -i %s with the installed build's check refusing: want the old prerm's refusal and dpkg trying the new package's script:\n%s", pkgNew, clusterlab.TrimTo(out, 3000))
	}
	p.waitNodeReady(inc)
	if r := p.run(time.Minute, "test", "-e", leftover); r.Code == 0 {
		t.Errorf("the new member did not remove the leftover %s", leftover)
	}
	if st := p.status(); st.Release != pkgNew {
		t.Errorf("after dpkg -i %s the member runs release %s\n%s", pkgNew, st.Release, r.Stdout)
	}
	kept = p.keptVMs(map[string]unitRun{vm: before})
	t.Logf("VMs kept across dpkg -i %s → %s: %d of 1", pkgOld, pkgNew, kept)
	if kept != 1 {
		t.Fatalf("the upgrade restarted the VM: unit %s was %+v, is %+v", vm, before, p.unitRun(vm))
	}
	p.exec(ws, "after upgrade")

	// apt-get remove while the Instance runs: refused, nothing removed,
	// the member running again.
	r = p.run(3*time.Minute, "apt-get", "remove", "-y", "kibotos")
	if r.Code == 0 || !strings.Contains(r.Stdout+r.Stderr, "kibotos: removal refused") || !strings.Contains(r.Stdout+r.Stderr, "is active or requires cleanup") {
		t.Fatalf("apt-get remove with an Instance running: want it refused by check-maintenance: %s\n%s", r, r.Stdout)
	}
	for _, line := range strings.Split(r.Stdout+r.Stderr, "\n") {
		if strings.Contains(line, "is active or requires cleanup") || strings.Contains(line, "pre-removal script") {
			t.Logf("apt-get remove (exit %d): %s", r.Code, strings.TrimSpace(line))
		}
	}
	if r := p.must(10*time.Second, "dpkg-query", "-W", "-f", "${Status} ${Version}", "kibotos"); r.Stdout != "install ok installed "+pkgNew {
		t.Errorf("after the refused removal: dpkg-query says %q", r.Stdout)
	}
	p.waitNodeReady(0)
	if kept := p.keptVMs(map[string]unitRun{vm: before}); kept != 1 {
		t.Fatalf("the refused removal touched the VM: %+v, was %+v", p.unitRun(vm), before)
	}
	p.exec(ws, "after the refused removal")

	// Once the Workspace is gone the removal goes through and ends the
	// data-plane processes; the configuration (a conffile) stays.
	p.must(2*time.Minute, "kibo", "workspace", "delete", ws)
	p.must(3*time.Minute, "apt-get", "remove", "-y", "kibotos")
	if r := p.run(10*time.Second, "systemctl", "list-units", "--no-legend", "--plain", "kibotos-dataplane-*", "kibotos-vmm-*", "kibotos.service"); strings.TrimSpace(r.Stdout) != "" {
		t.Errorf("units left after apt-get remove: %s", r.Stdout)
	}
	if _, err := os.Stat(h.Path("/usr/bin/kibotos")); !os.IsNotExist(err) {
		t.Errorf("/usr/bin/kibotos after apt-get remove: %v", err)
	}
	if _, err := os.Stat(h.Path("/etc/kibotos/kibotos.toml")); err != nil {
		t.Errorf("the conffile went with apt-get remove: %v", err)
	}
	if after := machineFiles(); after != onMachine {
		t.Errorf("the machine's own files changed: before the test %q, after %q", onMachine, after)
	}
}

// machineFiles says which of the paths the package and the member write
// exist on the machine itself (outside the booted host's overlay).
func machineFiles() string {
	var have []string
	for _, p := range []string{"/usr/bin/kibotos", "/lib/systemd/system/kibotos.service", "/etc/kibotos", "/var/lib/kibotos", "/var/lib/dpkg/info/kibotos.list"} {
		if _, err := os.Lstat(p); err == nil {
			have = append(have, p)
		}
	}
	return strings.Join(have, " ")
}

// platformCache is the kernel package cache the e2e tests share. The
// booted host has no way out to the Debian archive, so when the cache has
// no kernel package yet, the package's own binary fills it here first.
func platformCache(t *testing.T, deb, tmp string) string {
	t.Helper()
	cache := filepath.Join(os.TempDir(), "kibotos-test-platform")
	if debs, _ := filepath.Glob(filepath.Join(cache, "debs", "*.deb")); len(debs) > 0 {
		return cache
	}
	x := filepath.Join(tmp, "unpacked")
	if out, err := exec.Command("dpkg-deb", "-x", deb, x).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x %s: %v\n%s", deb, err, out)
	}
	cmd := exec.Command(filepath.Join(x, "usr/bin/kibotos"), "platform", "build", "--storage-root", filepath.Join(tmp, "fill-cache"), "--cache-dir", cache)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fill the platform cache %s: %v\n%s", cache, err, out)
	}
	return cache
}

// cleanup runs also when the test failed: the member's journal first,
// then the host goes (its VMs, units and namespaces with it).
func (p *pkgHost) cleanup() {
	if p.t.Failed() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, _ := p.h.Command(ctx, "journalctl", "--no-pager", "-n", "80", "-u", "kibotos").CombinedOutput()
		cancel()
		p.t.Logf("---- journal of kibotos.service ----\n%s\n---- console of the host ----\n%s", out, p.h.ConsoleTail(3000))
	}
	if err := p.h.Stop(); err != nil {
		p.t.Errorf("stop the booted host: %v", err)
	}
}

// run runs a command inside the host.
func (p *pkgHost) run(timeout time.Duration, name string, args ...string) clusterlab.Result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return clusterlab.RunResult(ctx, timeout, p.h.Command(ctx, name, args...), append([]string{name}, args...))
}

// must is run that fails the test unless the command exits 0.
func (p *pkgHost) must(timeout time.Duration, name string, args ...string) clusterlab.Result {
	p.t.Helper()
	r := p.run(timeout, name, args...)
	if r.Code != 0 {
		p.t.Fatalf("%s\n%s", r, clusterlab.TrimTo(r.Stdout, 2000))
	}
	return r
}

// checkInstalled: what the package put where Debian hosts look.
func (p *pkgHost) checkInstalled() {
	t := p.t
	t.Helper()
	if l, err := os.Readlink(p.h.Path("/usr/bin/kibo")); err != nil || l != "kibotos" {
		t.Errorf("/usr/bin/kibo → %q, %v; want kibotos", l, err)
	}
	for _, f := range []string{"/lib/systemd/system/kibotos.service", "/etc/kibotos/kibotos.toml", "/usr/share/doc/kibotos/README.md",
		"/usr/share/bash-completion/completions/kibotos", "/usr/share/bash-completion/completions/kibo",
		"/usr/share/zsh/vendor-completions/_kibo", "/usr/share/fish/vendor_completions.d/kibotos.fish", "/usr/share/fish/vendor_completions.d/kibo.fish"} {
		if _, err := os.Stat(p.h.Path(f)); err != nil {
			t.Errorf("the package did not install %s: %v", f, err)
		}
	}
	if r := p.must(10*time.Second, "dpkg-query", "-W", "-f", "${Conffiles}", "kibotos"); !strings.Contains(r.Stdout, "/etc/kibotos/kibotos.toml") {
		t.Errorf("conffiles: %q", r.Stdout)
	}
	if r := p.must(10*time.Second, "id", "-nG", "kibotos-vmm"); !strings.Contains(" "+r.Stdout, " kvm") {
		t.Errorf("kibotos-vmm groups: %q, want kvm among them", r.Stdout)
	}
	p.must(10*time.Second, "id", "kibotos-egress")
	want := map[string]string{"Restart": "on-failure", "RestartUSec": "5s", "KillMode": "control-group", "SendSIGKILL": "yes", "OOMScoreAdjust": "-900",
		"ExecStart": "/usr/bin/kibotos serve --config /etc/kibotos/kibotos.toml"}
	r := p.must(10*time.Second, "systemctl", "show", "kibotos.service", "-p", "Restart,RestartUSec,KillMode,SendSIGKILL,OOMScoreAdjust,ExecStart,LoadState")
	for k, v := range want {
		if !strings.Contains(r.Stdout, k+"="+v) && !(k == "ExecStart" && strings.Contains(r.Stdout, "argv[]="+v+" ")) {
			t.Errorf("kibotos.service: want %s=%s in\n%s", k, v, r.Stdout)
		}
	}
	if !strings.Contains(r.Stdout, "LoadState=loaded") {
		t.Errorf("kibotos.service is not loaded after dpkg -i (no daemon-reload?):\n%s", r.Stdout)
	}
}

// writeConfig is the operator's edit of the conffile: the node's network.
func (p *pkgHost) writeConfig() {
	cfg := `data_dir = "/var/lib/kibotos"
log_level = "info"
[network]
ipv4_pool = "10.213.0.0/16"
management_cidrs = ["10.201.0.0/24"]
resolvers = ["10.200.0.1"]
uplink = "uplink0"
`
	if err := os.WriteFile(p.h.Path("/etc/kibotos/kibotos.toml"), []byte(cfg), 0o640); err != nil {
		p.t.Fatal(err)
	}
}

// waitNodeReady waits for node pkg READY with a live session of an
// incarnation after `after` and its overcommit acknowledged; it returns
// the incarnation.
func (p *pkgHost) waitNodeReady(after uint64) uint64 {
	p.t.Helper()
	var inc uint64
	testenv.WaitFor(p.t, 3*time.Minute, "node "+pkgNode+" READY under kibotos.service", func() (bool, string) {
		// Nothing here makes the member fail: a restart by systemd is a failure.
		if r := p.run(10*time.Second, "systemctl", "show", "-p", "NRestarts", "-p", "ActiveState", "kibotos"); strings.Contains(r.Stdout, "ActiveState=failed") || !strings.Contains(r.Stdout, "NRestarts=0") {
			p.t.Fatalf("kibotos.service failed or was restarted by systemd: %s", r.Stdout)
		}
		r := p.run(10*time.Second, "kibo", "node", "get", pkgNode, "--json")
		if r.Code != 0 {
			return false, r.String()
		}
		var n wsNode
		if err := clusterlab.DecodeResult(r, &n); err != nil {
			return false, err.Error()
		}
		if n.Session != nil {
			inc = n.Session.Incarnation
		}
		ok := n.Status == api.NodeReady && n.Session != nil && n.Session.Alive && n.Session.Incarnation > after &&
			n.Report != nil && n.Report.DataPlaneAddress != "" && n.Overcommit != nil && n.Overcommit.Acknowledged
		return ok, clusterlab.TrimTo(r.Stdout, 400)
	})
	return inc
}

func (p *pkgHost) status() api.Status {
	p.t.Helper()
	var st api.Status
	if err := clusterlab.DecodeResult(p.must(10*time.Second, "kibo", "status", "--json"), &st); err != nil {
		p.t.Fatal(err)
	}
	return st
}

// exec runs echo in the Workspace through the data plane.
func (p *pkgHost) exec(ws, text string) {
	p.t.Helper()
	if r := p.must(time.Minute, "kibo", "workspace", "exec", ws, "--", "echo", text); r.Stdout != text+"\n" {
		p.t.Fatalf("workspace exec %s -- echo %s: %q", ws, text, r.Stdout)
	}
}

// vmUnit is the one VMM unit running.
func (p *pkgHost) vmUnit() string {
	p.t.Helper()
	r := p.must(10*time.Second, "systemctl", "list-units", "--no-legend", "--plain", "--state=running", "kibotos-vmm-*")
	f := strings.Fields(r.Stdout)
	if len(f) == 0 || strings.Count(r.Stdout, "kibotos-vmm-") != 1 {
		p.t.Fatalf("running VMM units: %q, want one", r.Stdout)
	}
	return f[0]
}

// unitRun names one run of a unit: its MainPID and InvocationID.
type unitRun struct{ mainPID, invocation string }

func (p *pkgHost) unitRun(unit string) unitRun {
	p.t.Helper()
	r := p.must(10*time.Second, "systemctl", "show", unit, "-p", "MainPID", "-p", "InvocationID", "-p", "ActiveState")
	var u unitRun
	active := false
	for _, line := range strings.Split(r.Stdout, "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "MainPID":
			u.mainPID = v
		case "InvocationID":
			u.invocation = v
		case "ActiveState":
			active = v == "active"
		}
	}
	if !active || u.mainPID == "0" || u.mainPID == "" {
		return unitRun{}
	}
	return u
}

// keptVMs counts the VMM units running the same process and invocation as before.
func (p *pkgHost) keptVMs(before map[string]unitRun) int {
	n := 0
	for unit, run := range before {
		if p.unitRun(unit) == run && run.mainPID != "" {
			n++
		}
	}
	return n
}

// checkNoStopDependency: nothing ties the VMM unit to the member's unit,
// so stopping the member never stops the VM (process-model seed).
func (p *pkgHost) checkNoStopDependency(vm string) {
	p.t.Helper()
	r := p.must(10*time.Second, "systemctl", "show", vm, "-p", "PartOf,BindsTo,Requisite,Requires,ConsistsOf,StopPropagatedFrom,Slice")
	if strings.Contains(r.Stdout, "kibotos.service") || !strings.Contains(r.Stdout, "Slice=kibotos-vmm.slice") {
		p.t.Errorf("VMM unit %s depends on kibotos.service or is outside kibotos-vmm.slice:\n%s", vm, r.Stdout)
	}
}

// checkMainPIDRefused: a member that is not its service's main process (a
// wrapper shell stays the MainPID) refuses to start, before it touches
// anything, naming the unit and both PIDs.
func (p *pkgHost) checkMainPIDRefused() {
	p.t.Helper()
	unit := "kibotos-wrapped.service"
	body := "[Service]\nType=exec\nExecStart=/bin/sh -c '/usr/bin/kibotos serve --config /etc/kibotos/kibotos.toml; exit $?'\n"
	if err := os.WriteFile(p.h.Path("/etc/systemd/system/"+unit), []byte(body), 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.must(30*time.Second, "systemctl", "daemon-reload")
	p.must(30*time.Second, "systemctl", "start", unit)
	testenv.WaitFor(p.t, time.Minute, "the wrapped member to refuse its start", func() (bool, string) {
		r := p.run(10*time.Second, "journalctl", "--no-pager", "-o", "cat", "-u", unit)
		for _, line := range strings.Split(r.Stdout, "\n") {
			if strings.Contains(line, "start-up check: "+unit+" has MainPID") && strings.Contains(line, "(/bin/sh -c") {
				p.t.Logf("%s under systemd: %s", unit, line)
				return true, ""
			}
		}
		return false, clusterlab.TrimTo(r.Stdout, 600)
	})
	p.run(30*time.Second, "systemctl", "stop", unit)
	os.Remove(p.h.Path("/etc/systemd/system/" + unit))
	p.must(30*time.Second, "systemctl", "daemon-reload")
}
