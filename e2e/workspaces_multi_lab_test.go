package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/member"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/template"
)

// mhBuildArtifacts builds, once per run, what a node needs to boot
// Workspaces: a Platform whose guest agent is a static kibotos (the kernel
// package comes from the cache runtimetest shares, so nothing is
// downloaded twice) and the busybox template. It returns their storage
// root; mhInstallArtifacts hard-links them into each node's.
func mhBuildArtifacts(t *testing.T, dir, binDir string) string {
	t.Helper()
	t0 := time.Now()
	// The nodes' own executable is the guest agent: a node starts new
	// Instances only on the Platform its own executable is the agent of.
	bin := filepath.Join(binDir, "kibotos")
	root := filepath.Join(dir, "artifacts")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	in, err := platform.Build(ctx, platform.Options{StorageRoot: root, CacheDir: filepath.Join(os.TempDir(), "kibotos-test-platform"), AgentBinary: bin})
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := template.BuildBusybox(ctx, root, template.DefaultName, "")
	if err != nil {
		t.Fatal(err)
	}
	mhProbeTemplate(t, root)
	t.Logf("platform %s (kernel %s) and template %s built in %s", in.ID[:19], in.KernelVersion, tpl.Name, time.Since(t0).Round(time.Millisecond))
	return root
}

// mhProbeTemplate adds template mh-probe, listed by every node (so ctrl
// places by capacity alone) but unusable: its image is a directory, so a
// node fails the start before booting a VM. Placement probes use it.
func mhProbeTemplate(t *testing.T, root string) {
	t.Helper()
	dir := filepath.Join(template.Dir(root), "sha256-mhprobe")
	if err := os.MkdirAll(filepath.Join(dir, template.ImageFile), 0o755); err != nil {
		t.Fatal(err)
	}
	rec := fmt.Sprintf(`{"format_version": %d, "id": "sha256-mhprobe", "name": "mh-probe", "source": "e2e probe"}`, template.FormatVersion)
	if err := os.WriteFile(filepath.Join(dir, "template.json"), []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mhInstallArtifacts hard-links the Platform and templates under src into
// the storage root of h (same file system: the lab directory).
func mhInstallArtifacts(t *testing.T, src string, h *host) {
	t.Helper()
	dst := datadir.Dir(h.dataDir).StorageRoot()
	for _, sub := range []string{"installations", "templates"} {
		if err := os.MkdirAll(filepath.Join(dst, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("cp", "-a", "--link", filepath.Join(src, sub)+"/.", filepath.Join(dst, sub)+"/").CombinedOutput()
		if err != nil {
			t.Fatalf("install %s into %s: %v\n%s", sub, dst, err, out)
		}
	}
}

// mhWriteConfig writes the serve configuration of h: small resources, the
// shared pool as the default one, and standalone pools (id → path).
func mhWriteConfig(t *testing.T, h *host, sharedPool string, standalone ...[2]string) string {
	t.Helper()
	path := filepath.Join(h.lab.dir, h.nodeID+".toml")
	body := fmt.Sprintf(`log_level = "info"
log_format = "json"          # the member and its egress/data-plane processes (checked in Egress)

[resources]
cpu = "2"
memory = "2GiB"

[network]
# Guests of each host get their own range. The lab's hosts have one
# interface, which is also the uplink, so the management range may not
# cover their addresses (a node refuses that): the low end stands for it.
ipv4_pool = %q
management_cidrs = ["%s0/29"]
resolvers = ["%s250"]
uplink = "eth0"
egress_warm_connections = 3  # checked in Egress (the default is 2)

[storage]
default_pool = "shared"

[[storage.pools]]
id = "shared"
path = %q
shared = true
`, guestPool(h), subnetPrefix, subnetPrefix, sharedPool)
	for _, p := range standalone {
		body += fmt.Sprintf("\n[[storage.pools]]\nid = %q\npath = %q\n", p[0], p[1])
	}
	if strings.Contains(h.roles, "ctrl") {
		// The API for applications, on the host's address (RemoteClient).
		body += fmt.Sprintf("\n[api]\nlisten = %q\n", h.ip+":"+appAPIPort)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// guestPool is a guest range of its own for each host of the lab.
func guestPool(h *host) string {
	return fmt.Sprintf("10.213.%d.0/24", h.index)
}

// mhStartServe starts the member of h with a private systemd for its VMs
// and the configuration file.
func mhStartServe(h *host, config string) *proc {
	h.mu.Lock()
	h.runs++
	name := fmt.Sprintf("%s-serve-%d.log", h.nodeID, h.runs)
	h.mu.Unlock()
	p := h.start(name, "serve", "--data-dir", h.dataDir, "--test-timings", "--systemd", "private", "--config", config)
	h.mu.Lock()
	h.serve = p
	h.mu.Unlock()
	return p
}

// mhQemuPIDs lists the QEMU processes whose command line mentions dir.
func mhQemuPIDs(dir string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if strings.Contains(filepath.Base(args[0]), "qemu-system") && strings.Contains(string(raw), dir) {
			out = append(out, pid)
		}
	}
	return out
}

// mhWaitNoQemu waits until no QEMU of dir runs and returns those still
// running after d.
func mhWaitNoQemu(t *testing.T, dir string, d time.Duration) []int {
	var pids []int
	testenv.Poll(t, d, func() bool { pids = mhQemuPIDs(dir); return len(pids) == 0 })
	return pids
}

// mhTwoHosts is a lab of two hosts that boot VMs: node-a (ctrl,node) and
// node-b (node only), their data directories under root (mhRoot).
func mhTwoHosts(t *testing.T) (l *lab, a, b *host, root string) {
	t.Helper()
	requireLab(t)
	runtimetest.RequireVMHost(t)
	testenv.LookPath(t, "qemu-img", "qemu-utils") // retained layers
	l = newLab(t, 2)
	a, b = l.hosts[0], l.hosts[1]
	a.nodeID, a.roles = "node-a", "ctrl,node"
	b.nodeID, b.roles = "node-b", "node"
	root = mhRoot(t, l)
	a.dataDir, b.dataDir = filepath.Join(root, "a"), filepath.Join(root, "b")
	return l, a, b, root
}

// mhRoot is a short directory for the hosts' data directories, removed
// at the end with what the members left in /tmp; before that, the members
// are stopped (their private systemd ends their VMs) and no QEMU may be
// left.
func mhRoot(t *testing.T, l *lab) string {
	t.Helper()
	// Short data directories: a VM's unix sockets live under the storage
	// root, and t.TempDir() paths would make them longer than the 107
	// bytes a unix socket path may have (the runtime refuses such a start).
	root, err := os.MkdirTemp("", "kbmh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(root)
		// The members' egress socket directories (their private systemd
		// has its own /run, so these are in the shared /tmp).
		for _, h := range l.hosts {
			member.RemoveEgressSocketDirs(datadir.Dir(h.dataDir))
		}
	})

	// Runs before the lab's cleanup (registered first) and the removal of
	// root: stop both members (their private systemd ends their VMs) and
	// check no QEMU is left.
	t.Cleanup(func() {
		for _, h := range l.hosts {
			if p := h.serveProc(); p != nil && !p.exited() {
				p.cmd.Process.Signal(syscall.SIGTERM)
				if _, ok := p.waitExit(20 * time.Second); !ok {
					p.cmd.Process.Kill()
					p.waitExit(10 * time.Second)
				}
			}
		}
		if t.Failed() {
			for _, h := range l.hosts {
				mhDumpHostLogs(t, h)
			}
		}
		if left := mhWaitNoQemu(t, root, 15*time.Second); len(left) > 0 {
			t.Errorf("QEMU processes of this test left after its members ended: %v", left)
			for _, pid := range left {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return root
}

// mhDumpHostLogs shows, for a failed test, what the member's own log
// does not: its data-plane and egress processes' logs, and each VM's
// console and VMM log.
func mhDumpHostLogs(t *testing.T, h *host) {
	d := datadir.Dir(h.dataDir)
	machines, _ := filepath.Glob(filepath.Join(d.StorageRoot(), "machine-logs", "*", "*.log"))
	for _, log := range append(unitLogs(d), machines...) {
		rel, _ := filepath.Rel(h.dataDir, log)
		t.Logf("---- last lines of %s of host %d ----\n%s", rel, h.index, tail(log, 25))
	}
}
