package clusterlab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/member"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/template"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// BuildArtifacts builds, once per run, what a node needs to boot
// Workspaces: a Platform whose guest agent is a static kibotos (the kernel
// package comes from the cache runtimetest shares, so nothing is
// downloaded twice) and the busybox template. It returns their storage
// root; mhInstallArtifacts hard-links them into each node's.
func BuildArtifacts(t *testing.T, dir, binDir string) string {
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
	t.Logf("platform %s (kernel %s) and template %s built in %s", in.ID[:19], in.KernelVersion, tpl.Name, time.Since(t0).Round(time.Millisecond))
	return root
}

// InstallArtifacts hard-links the Platform and templates under src into
// the storage root of h (same file system: the lab directory).
func InstallArtifacts(t *testing.T, src string, h *Host) {
	t.Helper()
	dst := datadir.Dir(h.DataDir).StorageRoot()
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

// WriteConfig writes the serve configuration of h: small resources, the
// shared pool as the default one, and standalone pools (id → path).
func WriteConfig(t *testing.T, h *Host, sharedPool string, standalone ...[2]string) string {
	t.Helper()
	path := filepath.Join(h.Lab.Dir, h.NodeID+".toml")
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
`, GuestPool(h), SubnetPrefix, SubnetPrefix, sharedPool)
	for _, p := range standalone {
		body += fmt.Sprintf("\n[[storage.pools]]\nid = %q\npath = %q\n", p[0], p[1])
	}
	if strings.Contains(h.Roles, "ctrl") {
		// The API for applications, on the host's address (RemoteClient).
		body += fmt.Sprintf("\n[api]\nlisten = %q\n", h.IP+":"+AppAPIPort)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// GuestPool is a guest range of its own for each host of the lab.
func GuestPool(h *Host) string {
	return fmt.Sprintf("10.213.%d.0/24", h.Index)
}

// StartServeConfig starts the member of h with a private systemd for its VMs
// and the configuration file.
func StartServeConfig(h *Host, config string) *Proc {
	h.mu.Lock()
	h.runs++
	name := fmt.Sprintf("%s-serve-%d.log", h.NodeID, h.runs)
	h.mu.Unlock()
	args := []string{"serve", "--data-dir", h.DataDir, "--test-timings", "--systemd", "private", "--config", config,
		"--test-clock-skew-file", h.clockSkewFile()}
	if h.SystemdOutlives {
		args = append(args, "--test-systemd-outlives")
	}
	p := h.Start(name, args...)
	h.mu.Lock()
	h.serve = p
	h.mu.Unlock()
	return p
}

// clockSkewFile is where StepClock tells the member its clock's skew.
func (h *Host) clockSkewFile() string { return h.DataDir + ".clock-skew" }

// StepClock steps the host's clock by skew, as its member sees it (its
// timestamps to ctrl, the entries it stamps as leader); 0 steps it back.
// The member reads it within a second.
func (h *Host) StepClock(skew time.Duration) error {
	return os.WriteFile(h.clockSkewFile(), []byte(skew.String()+"\n"), 0o600)
}

// QemuPIDs lists the QEMU processes whose command line mentions dir.
func QemuPIDs(dir string) []int {
	return PIDs(func(args []string) bool {
		return strings.Contains(filepath.Base(args[0]), "qemu-system") && strings.Contains(strings.Join(args, " "), dir)
	})
}

// PIDs lists the processes whose command line match accepts.
func PIDs(match func(args []string) bool) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if args := Cmdline(pid); args != nil && match(args) {
			out = append(out, pid)
		}
	}
	return out
}

// Cmdline is the command line of process pid; nil once it is gone (or a
// zombie).
func Cmdline(pid int) []string {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || len(raw) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
}

// WaitNoQemu waits until no QEMU of dir runs and returns those still
// running after d.
func WaitNoQemu(t *testing.T, dir string, d time.Duration) []int {
	var pids []int
	testenv.Poll(t, d, func() bool { pids = QemuPIDs(dir); return len(pids) == 0 })
	return pids
}

// VMRoot is a short directory for the hosts' data directories, removed
// at the end with what the members left in /tmp; before that, the members
// are stopped (their private systemd ends their VMs) and no QEMU may be
// left.
func VMRoot(t *testing.T, l *Lab) string {
	t.Helper()
	// Short data directories: a VM's unix sockets live under the storage
	// root, and t.TempDir() paths would make them longer than the 107
	// bytes a unix socket path may have (the runtime refuses such a start).
	root, err := os.MkdirTemp("", "kbmh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A member killed and not started again leaves what it pinned
		// mounted (its private systemd's /run/netns, the VMs' network
		// namespaces): a later start would unmount them, so here the lab
		// does.
		if left := unmountUnder(root); len(left) > 0 {
			t.Logf("unmounted what members left mounted under %s: %s", root, strings.Join(left, ", "))
		}
		os.RemoveAll(root)
		// The members' egress socket directories (their private systemd
		// has its own /run, so these are in the shared /tmp).
		for _, h := range l.Hosts {
			member.RemoveEgressSocketDirs(datadir.Dir(h.DataDir))
		}
	})

	// Runs before the lab's cleanup (registered first) and the removal of
	// root: stop both members (their private systemd ends their VMs) and
	// check no QEMU is left.
	t.Cleanup(func() {
		for _, h := range l.Hosts {
			if p := h.ServeProc(); p != nil && !p.Exited() {
				p.Cmd.Process.Signal(syscall.SIGTERM)
				if _, ok := p.WaitExit(20 * time.Second); !ok {
					p.Cmd.Process.Kill()
					p.WaitExit(10 * time.Second)
				}
			}
		}
		// A private systemd that outlives its member is ended here; a
		// member killed and not started again may have left its own
		// running (privsd ends it at the next start).
		for _, h := range l.Hosts {
			if h.SystemdOutlives {
				if err := endOutliving(h); err != nil {
					t.Errorf("host %d: %v", h.Index, err)
				}
				continue
			}
			if pid, err := privsd.EndLeftover(filepath.Join(datadir.Dir(h.DataDir).NodeDir(), "systemd")); err != nil {
				t.Errorf("host %d: %v", h.Index, err)
			} else if pid != 0 {
				t.Logf("host %d: ended the private systemd (pid %d) its killed member left running", h.Index, pid)
			}
		}
		if t.Failed() {
			for _, h := range l.Hosts {
				DumpHostLogs(t, h)
			}
		}
		if left := WaitNoQemu(t, root, 15*time.Second); len(left) > 0 {
			t.Errorf("QEMU processes of this test left after its members ended: %v", left)
			for _, pid := range left {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return root
}

// endOutliving stops the private systemd a host's members shared
// (SystemdOutlives), and with it what still runs there.
func endOutliving(h *Host) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sd, err := privsd.Attach(ctx, member.DevSystemdDir(datadir.Dir(h.DataDir)))
	if errors.Is(err, privsd.ErrNotRunning) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("attach to the private systemd its members shared: %w", err)
	}
	return sd.Stop()
}

// DumpHostLogs shows, for a failed test, what the member's own log
// does not: its data-plane and egress processes' logs, and each VM's
// console and VMM log.
func DumpHostLogs(t *testing.T, h *Host) {
	d := datadir.Dir(h.DataDir)
	machines, _ := filepath.Glob(filepath.Join(d.StorageRoot(), "machine-logs", "*", "*.log"))
	for _, log := range append(UnitLogs(d), machines...) {
		rel, _ := filepath.Rel(h.DataDir, log)
		t.Logf("---- last lines of %s of host %d ----\n%s", rel, h.Index, Tail(log, 25))
	}
}

// RecentConsoleLogs are the guest console logs (the guest agent's log among
// them) of the n machines that ended last on a member.
func RecentConsoleLogs(d datadir.Dir, n int) []string {
	logs, _ := filepath.Glob(filepath.Join(d.StorageRoot(), "machine-logs", "*", "console.log"))
	mtime := map[string]time.Time{}
	for _, p := range logs {
		if st, err := os.Stat(p); err == nil {
			mtime[p] = st.ModTime()
		}
	}
	sort.Slice(logs, func(i, j int) bool { return mtime[logs[i]].After(mtime[logs[j]]) })
	return logs[:min(n, len(logs))]
}

// UnitLogs are the logs of a member's data-plane and egress processes:
// their units' files, since the private systemd has no journal.
func UnitLogs(d datadir.Dir) []string {
	logs, _ := filepath.Glob(filepath.Join(d.NodeDir(), "systemd", "logs", "kibotos-[de]*.log"))
	return logs
}

// AppAPIPort is the port of the ctrl hosts' API for applications.
const AppAPIPort = "7443"

// unmountUnder detaches every mount at or below dir, deepest first, and
// returns their mount points.
func unmountUnder(dir string) []string {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var points []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	for _, p := range points {
		syscall.Unmount(p, syscall.MNT_DETACH)
	}
	return points
}
