package e2e

// The CA rotation on real members: three ctrl voters and a node-only
// member running a Workspace, each its own process in its own network
// namespace, everything through the CLI. The VM and an exec opened before
// the rotation must outlive it; afterwards a certificate signed with the
// old CA key must get nowhere. Last, the VM's timeout fires across a
// SIGKILL of the ctrl leader.

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/trust"
	"github.com/kibotos/kibotos/vmm/template"
	"github.com/kibotos/kibotos/vmm/units"
)

// TestCARotationAcrossVMAndExec: kibo ca rotate, status and finish on 3
// voters and a node-only member whose VM keeps its QEMU process and whose
// open exec finishes; then a certificate forged with the old key is
// refused by every member, and the same one forged with the new key is
// taken. Then the VM's end fires across a SIGKILL of the leader. One VM
// boot.
func TestCARotationAcrossVMAndExec(t *testing.T) {
	t0 := time.Now()
	clusterlab.Require(t)
	runtimetest.RequireVMHost(t)
	testenv.LookPath(t, "qemu-img", "qemu-utils") // retained layers
	// Registered before the lab's own cleanup, so it runs after it: no
	// namespace of the lab may be left.
	var l *clusterlab.Lab
	t.Cleanup(func() {
		for _, ns := range l.Namespaces() {
			if _, err := os.Stat("/run/netns/" + ns); err == nil {
				t.Errorf("namespace %s left after the lab's cleanup", ns)
			}
		}
	})
	l = clusterlab.New(t, 4)
	t.Logf("lab %s: namespaces %v", l.Prefix, l.Namespaces())
	root := clusterlab.VMRoot(t, l)
	for _, h := range l.Hosts {
		h.DataDir = filepath.Join(root, fmt.Sprint(h.Index))
	}
	artifacts := mhBuildArtifacts(t, root, l.Bin)
	shared := filepath.Join(root, "shared")
	if err := os.MkdirAll(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	// Only the node-only member runs VMs: the ctrl voters serve without
	// a network, so ctrl places nothing on them.
	c := clusterlab.FormServing(t, l, func(h *clusterlab.Host) {
		if strings.Contains(h.Roles, "ctrl") {
			h.StartServe()
			return
		}
		clusterlab.InstallArtifacts(t, artifacts, h)
		clusterlab.StartServeConfig(h, clusterlab.WriteConfig(t, h, shared))
	})
	admin, node := c.Ctrls[0], c.Node
	clusterlab.WaitNodeReport(t, admin, node.NodeID, 30*time.Second, "ready for Workspaces", clusterlab.ReadyForWorkspaces)
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "storage-pool", "set-capacity", "shared", "10GiB")
	t.Logf("cluster ready in %s", time.Since(t0).Round(time.Millisecond))

	var ws api.Workspace
	if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, clusterlab.CLITimeout, "workspace", "create", "--template", template.DefaultName, "--cpu", "1", "--memory", "256MiB",
		"--node", node.NodeID, "--no-wait", "--json"), &ws); err != nil {
		t.Fatal(err)
	}
	ws = clusterlab.WaitWorkspace(t, admin, ws.WorkspaceID, api.WorkspaceAvailable, clusterlab.BootTimeout)
	if ws.NodeID != node.NodeID {
		t.Fatalf("created with --node %s, got %s", node.NodeID, clusterlab.WorkspaceString(ws))
	}
	qemu := vmmHostPID(t, node, ws.InstanceID)
	if !slices.Contains(clusterlab.QemuPIDs(node.DataDir), qemu) {
		t.Fatalf("main PID %d of %s is not a QEMU of %s (QEMUs: %v)", qemu, runtime.UnitName(ws.InstanceID), node.NodeID, clusterlab.QemuPIDs(node.DataDir))
	}

	// What someone who copied a ctrl member's CA key before the rotation
	// holds; their forgery is good now, on every member.
	oldCA, err := trust.LoadCA(datadir.Dir(admin.DataDir).CACert(), datadir.Dir(admin.DataDir).CAKey())
	if err != nil {
		t.Fatal(err)
	}
	forgedOld := forgeCredentials(t, admin, oldCA, filepath.Join(root, "forged-old"))
	for _, h := range l.Hosts {
		if r := forgedCall(h, forgedOld); r.Code != 0 {
			t.Fatalf("before the rotation the old-key forgery must be taken by %s: %s", h.NodeID, r)
		}
	}

	// The exec prints a tick a second until a later exec creates /tmp/go,
	// after the finish, so it stays open across the whole rotation.
	ex := startExec(t, admin, ws.WorkspaceID, `i=0; while [ ! -e /tmp/go ] && [ $i -lt 900 ]; do i=$((i+1)); echo tick $i; sleep 1; done; echo done`)
	testenv.WaitFor(t, 60*time.Second, "the long exec to print its first tick", func() (bool, string) {
		return ex.ticks() > 0, ex.out.String()
	})

	// A read from each ctrl member's CLI that its member forwards to the
	// leader, as an operator looking around before the rotation: the
	// members keep those connections alive, and must not present their
	// old certificates on them after the finish.
	for _, h := range c.Ctrls {
		clusterlab.Must(t, h, clusterlab.CLITimeout, "node", "list", "--consistent")
	}
	t1 := time.Now()
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "ca", "rotate")
	var st api.CAStatus
	testenv.WaitFor(t, 3*time.Minute, "phase signing with every member's certificates new", func() (bool, string) {
		st = api.CAStatus{}
		if err := admin.KiboJSON(&st, "ca", "status"); err != nil {
			return false, err.Error()
		}
		return rotatedMembers(st, l, node), caStatusLine(st)
	})
	// In phase signing the new CA is the active one; the first one is old.
	next, old := "", ""
	for _, ca := range st.CAs {
		switch ca.State {
		case api.CAActive:
			next = ca.Fingerprint
		case api.CAOld:
			old = ca.Fingerprint
		}
	}
	if len(st.CAs) != 2 || next == "" || old != trust.Fingerprint(oldCA.Cert) {
		t.Fatalf("status in phase signing: want the new CA active and %.12s old, got %s", trust.Fingerprint(oldCA.Cert), caStatusLine(st))
	}
	t.Logf("TIMING rotate to phase signing with every certificate new: %s", time.Since(t1).Round(time.Millisecond))
	// The node-only host's CLI holds an operator credential issued to a
	// person: nobody renews it, so it is issued again before the finish.
	if !slices.ContainsFunc(st.Personal, func(p string) bool { return strings.Contains(p, "e2e-"+node.NodeID) }) {
		t.Errorf("status in phase signing: want e2e-%s among the credentials to issue again, got %q", node.NodeID, st.Personal)
	}
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "operator", "issue", "e2e-"+node.NodeID, "--out", node.Creds, "--force")

	clusterlab.Must(t, admin, clusterlab.CLITimeout, "ca", "finish")
	finished, ticksAtFinish := time.Now(), ex.ticks()
	t.Logf("TIMING rotate to finish: %s (the exec at tick %d)", time.Since(t1).Round(time.Millisecond), ticksAtFinish)
	// Read through ctrl1 (forwarded to the leader when ctrl1 does not
	// lead), on the connections of before the rotation.
	st = api.CAStatus{}
	if err := clusterlab.DecodeResult(admin.KiboTimeout(clusterlab.CLITimeout, "ca", "status", "--json"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Phase != "" || len(st.CAs) != 1 || st.CAs[0].State != api.CAActive || st.CAs[0].Fingerprint != next || len(st.Personal) != 0 {
		t.Fatalf("status after the finish: want one CA, %.12s, active, no phase and no credential to issue again, got %s", next, caStatusLine(st))
	}
	newCA, err := trust.LoadCA(datadir.Dir(admin.DataDir).CACert(), datadir.Dir(admin.DataDir).CAKey())
	if err != nil {
		t.Fatal(err)
	}
	if fp := trust.Fingerprint(newCA.Cert); fp != next {
		t.Fatalf("%s's tls/ca.crt after the finish is %.12s, want the new CA %.12s", admin.NodeID, fp, next)
	}

	t.Run("VMAndExecOutliveIt", func(t *testing.T) {
		if again := clusterlab.GetWorkspace(t, admin, ws.WorkspaceID); again.State != api.WorkspaceAvailable || again.NodeID != node.NodeID || again.InstanceID != ws.InstanceID {
			t.Errorf("after the finish: want %s AVAILABLE on %s as Instance %s, got %s", ws.WorkspaceID, node.NodeID, ws.InstanceID, clusterlab.WorkspaceString(again))
		}
		if pid := vmmHostPID(t, node, ws.InstanceID); pid != qemu {
			t.Errorf("QEMU of %s: PID %d before the rotation, %d after", ws.InstanceID, qemu, pid)
		}
		// The stream opened under the old CA still carries output.
		testenv.WaitFor(t, 10*time.Second, "the exec opened before the rotation to print after the finish", func() (bool, string) {
			return ex.ticks() > ticksAtFinish, lastLines(ex.out.String(), 1)
		})
		// New execs from every host's CLI, each with its new credential,
		// at once: the node's data plane has held the new CA's credential
		// key since the begin. The last one lets the long exec end.
		for i, h := range l.Hosts {
			cmd := "true"
			if i == len(l.Hosts)-1 {
				cmd = "touch /tmp/go"
			}
			if r := h.KiboTimeout(60*time.Second, "workspace", "exec", ws.WorkspaceID, "--", "sh", "-c", cmd); r.Code != 0 {
				t.Fatalf("exec through %s after the finish: %s", h.NodeID, r)
			}
		}
		code, out := ex.wait(30 * time.Second)
		if code != 0 || !strings.HasSuffix(out, "\ndone\n") || ex.ticks() <= ticksAtFinish {
			t.Errorf("the exec opened before the rotation: exit %d, %d ticks (%d at the finish), want exit 0 ending in done after more ticks; stderr %q; stdout ends %q",
				code, ex.ticks(), ticksAtFinish, ex.errOut.String(), lastLines(out, 3))
		}
		t.Logf("the exec opened before the rotation printed %d ticks (%d at the finish) and ended with exit 0", ex.ticks(), ticksAtFinish)
	})

	t.Run("OldKeyRefusedEverywhere", func(t *testing.T) {
		// The CLI trusts the new CA (as the members now serve under it),
		// so a failure is the member refusing the client certificate.
		if err := os.WriteFile(filepath.Join(forgedOld, "ca.crt"), trust.PEMOf(newCA.Cert), 0o600); err != nil {
			t.Fatal(err)
		}
		forgedNew := forgeCredentials(t, admin, newCA, filepath.Join(root, "forged-new"))
		for _, h := range l.Hosts {
			// A node-only member drops the old CA at its next trust poll
			// (every 30 s).
			var last clusterlab.Result
			t1 := time.Now()
			testenv.WaitFor(t, 45*time.Second, h.NodeID+" to refuse the old-key forgery", func() (bool, string) {
				// Refused at the handshake (the CA is not trusted) or
				// with 401: either way the CLI exits non-zero itself.
				last = forgedCall(h, forgedOld)
				return last.Code > 0 && (strings.Contains(last.Stderr, "certificate") || strings.Contains(last.Stderr, "unauthenticated")), last.String()
			})
			t.Logf("%s refuses the old-key forgery (%s after the finish, waited %s): %s", h.NodeID, time.Since(finished).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond), strings.TrimSpace(last.Stderr))
			if r := forgedCall(h, forgedNew); r.Code != 0 {
				t.Errorf("the same certificate forged with the new key is refused by %s: %s", h.NodeID, r)
			}
		}
	})
	// Last: it kills a ctrl member and ends the VM.
	t.Run("TimeoutAcrossLeaderKill", func(t *testing.T) { testTimeoutAcrossLeaderKill(t, c, ws.WorkspaceID) })
	t.Logf("whole test %s", time.Since(t0).Round(time.Millisecond))
}

// testTimeoutAcrossLeaderKill gives the running Workspace id an end 15 s
// away and kills the ctrl leader's process with SIGKILL 2 s before it:
// the member elected next fires it from the replicated end, never before
// it and at most a few seconds after it.
func testTimeoutAcrossLeaderKill(t *testing.T, c *clusterlab.Cluster, id string) {
	victim := c.Leader(t)
	var via *clusterlab.Host // a ctrl member that survives, to watch through
	for _, h := range c.Ctrls {
		if h != victim {
			via = h
			break
		}
	}
	clusterlab.Must(t, via, clusterlab.CLITimeout, "workspace", "set-timeout", id, "15s", "--on-timeout", "stop")
	ws := clusterlab.GetWorkspace(t, via, id)
	if ws.EndsAt == nil || ws.OnTimeout != api.TimeoutStop || ws.State != api.WorkspaceAvailable {
		t.Fatalf("after set-timeout 15s --on-timeout stop: want AVAILABLE with an end and stop, got %s ends %v on_timeout %q", clusterlab.WorkspaceString(ws), ws.EndsAt, ws.OnTimeout)
	}
	end := *ws.EndsAt
	time.Sleep(time.Until(end.Add(-2 * time.Second))) // the kill's moment; scheduling, not an assertion
	if time.Now().After(end) {
		t.Fatalf("the kill came after the end %s: the test's own calls took too long", end)
	}
	victim.Crash()
	t.Logf("killed leader %s %s before the end", victim.NodeID, time.Until(end).Round(time.Millisecond))

	// The replica of a surviving member shows the decision once it is
	// applied; the first state other than AVAILABLE is when it fired.
	var changed time.Time
	var early string
	testenv.WaitFor(t, 60*time.Second, "the Workspace STOPPED by its timeout", func() (bool, string) {
		var cur api.Workspace
		if err := via.KiboJSON(&cur, "workspace", "get", id); err != nil {
			return false, err.Error()
		}
		if cur.State != api.WorkspaceAvailable && changed.IsZero() {
			if changed = time.Now(); changed.Before(end) {
				early = cur.State
			}
		}
		return cur.State == api.WorkspaceStopped, clusterlab.WorkspaceString(cur)
	})
	if early != "" {
		t.Fatalf("%s before its end %s (seen at %s): fired early", early, end.Format(time.RFC3339Nano), changed.Format(time.RFC3339Nano))
	}
	// The leader that fired it logged when, and the state machine took it
	// at no log time before the end.
	var fired time.Time
	for _, h := range c.Ctrls {
		if h == victim {
			continue
		}
		clusterlab.AnyLine(h.ServeProc().Log, func(line string) bool {
			// time=2026-12-06T14:13:07.702Z level=INFO msg="workspace timed out" ... workspace_id=ws-...
			stamp, rest, _ := strings.Cut(line, " ")
			if !strings.Contains(rest, `msg="workspace timed out"`) || !strings.Contains(rest, " workspace_id="+id+" ") {
				return false
			}
			t, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(stamp, "time="))
			fired = t
			return err == nil
		})
	}
	if fired.IsZero() || fired.Before(end.Truncate(time.Millisecond)) { // the log shows milliseconds
		t.Fatalf("the surviving members' logs: want a line \"workspace timed out\" for %s at or after %s, got %v", id, end.Format(time.RFC3339Nano), fired)
	}
	if late := changed.Sub(end); late > 5*time.Second {
		t.Errorf("stopped %s after its end across the leader kill, want at most 5s", late.Round(time.Millisecond))
	}
	t.Logf("the new leader fired the end %s after it (seen on %s %s after it), across a SIGKILL of leader %s",
		fired.Sub(end).Round(time.Millisecond), via.NodeID, changed.Sub(end).Round(time.Millisecond), victim.NodeID)
}

// rotatedMembers: phase signing, and every host's member, operator and
// (on the node-only member) data-plane certificates under the new CA.
func rotatedMembers(st api.CAStatus, l *clusterlab.Lab, node *clusterlab.Host) bool {
	if st.Phase != "signing" || len(st.Members) != len(l.Hosts) {
		return false
	}
	for _, m := range st.Members {
		if m.TrustsNew != api.TrustYes || m.MemberCert != api.CertNew || m.DataPlane == api.CertOld {
			return false
		}
		if m.NodeID == node.NodeID && m.DataPlane != api.CertNew {
			return false
		}
	}
	return true
}

// caStatusLine is the status as it came, for a failure message.
func caStatusLine(st api.CAStatus) string {
	raw, _ := json.Marshal(st)
	return string(raw)
}

// vmmHostPID is the host PID of the main process of the Instance's VMM
// unit, read from the private systemd of h's member: never found by name.
func vmmHostPID(t *testing.T, h *clusterlab.Host, instanceID string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := units.Connect(ctx, memberSystemd(t, h))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	u, err := m.Get(ctx, runtime.UnitName(instanceID))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := m.MainHostPID(u)
	if err != nil || pid <= 1 {
		t.Fatalf("host PID of %s on %s: %d, %v", u.Name, h.NodeID, pid, err)
	}
	return pid
}

// memberSystemd is the private systemd the member of h started with
// --systemd private (privsd.Attach finds only detached ones): the
// member's child that is PID 1 of its own PID namespace, its bus socket
// under the node directory and its cgroup root the parent of the cgroup
// its PID 1 runs in (init.scope).
func memberSystemd(t *testing.T, h *clusterlab.Host) units.Target {
	t.Helper()
	member := h.ServeProc().Cmd.Process.Pid
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil || !strings.Contains(string(status), fmt.Sprintf("\nPPid:\t%d\n", member)) || !strings.Contains(string(status), "\nNSpid:\t"+e.Name()+"\t1\n") {
			continue
		}
		mount, err := units.Cgroup2Mount()
		if err != nil {
			t.Fatal(err)
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(e.Name())
		return units.Target{
			Socket:     filepath.Join(datadir.Dir(h.DataDir).NodeDir(), "systemd", "run", "kibotos-bus.sock"),
			CgroupRoot: filepath.Join(mount, filepath.Dir(units.Cgroup2Path(string(cg)))),
			ManagerPID: pid,
		}
	}
	t.Fatalf("member %s (PID %d) runs no private systemd", h.NodeID, member)
	return units.Target{}
}

// forgeCredentials writes into dir a credentials directory (as kibo
// operator issue --out does) whose certificate asserts what h's operator
// certificate asserts, signed with ca's key as someone holding a copy of
// it would, valid for three hours; ca.crt is ca's certificate.
func forgeCredentials(t *testing.T, h *clusterlab.Host, ca *trust.CA, dir string) string {
	t.Helper()
	like, err := datadir.Dir(h.DataDir).AdminCertificate()
	if err != nil {
		t.Fatal(err)
	}
	key, err := trust.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: like.Leaf.Subject.CommonName},
		NotBefore: now.Add(-trust.Backdate), NotAfter: now.Add(3 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, URIs: like.Leaf.URIs}
	der, err := x509.CreateCertificate(nil, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := trust.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"ca.crt": trust.PEMOf(ca.Cert), "operator.crt": trust.PEMOf(leaf), "operator.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// forgedCall is kibo node list on h's member with the credentials in dir.
func forgedCall(h *clusterlab.Host, dir string) clusterlab.Result {
	return h.Run(clusterlab.CLITimeout, "kibo", "--data-dir", h.DataDir, "--credentials", dir, "node", "list")
}

// longExec is a kibo workspace exec running in the background.
type longExec struct {
	out, errOut lockedBuf
	done        chan struct{} // closed once the CLI exited
	code        int           // valid after done
}

// startExec runs sh -c script in the Workspace through h's CLI; the test
// waits for it in its cleanup at the latest.
func startExec(t *testing.T, h *clusterlab.Host, id, script string) *longExec {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	cmd := h.Command(ctx, "kibo", h.KiboArgs([]string{"workspace", "exec", id, "--", "sh", "-c", script})...)
	e := &longExec{done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &e.out, &e.errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		e.code = cmd.ProcessState.ExitCode()
		close(e.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-e.done
	})
	return e
}

// ticks counts the tick lines printed so far.
func (e *longExec) ticks() int { return strings.Count(e.out.String(), "tick ") }

// wait waits up to d for the exec to end and returns its exit code and
// output; -1 when it did not end.
func (e *longExec) wait(d time.Duration) (int, string) {
	select {
	case <-e.done:
		return e.code, e.out.String()
	case <-time.After(d):
		return -1, e.out.String()
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
