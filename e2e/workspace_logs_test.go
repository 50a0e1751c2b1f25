package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"

	"github.com/kibotos/kibotos/api"
)

// machineLogView is `kibo workspace logs --json`.
type machineLogView struct {
	InstanceID string `json:"instance_id"`
	NodeID     string `json:"node_id"`
	Live       bool   `json:"live"`
	Console    string `json:"console"`
	VMM        string `json:"vmm"`
}

// logFollower is a `kibo workspace logs --follow` running meanwhile.
type logFollower struct {
	cmd            *exec.Cmd
	stdout, stderr lockedBuf
}

// testLogsLive: `kibo workspace logs` shows the running guest's console,
// from its boot (the guest agent's first session) to a line written to
// /dev/console now, bounded by --tail; --follow prints that line as it
// comes. It returns the line and the follower, still running.
func (d *wsDev) testLogsLive(id, inst string) (string, *logFollower) {
	t := d.t
	marker := "kibotos-logs-marker-" + inst
	f := &logFollower{cmd: exec.Command(filepath.Join(d.bin, "kibo"), "workspace", "logs", id, "--follow", "--tail", "1")}
	f.cmd.Env = d.env()
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	f.cmd.Stdout, f.cmd.Stderr = &f.stdout, &f.stderr
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.track(f.cmd)
	// It has read the console once (printed its last line) before the
	// line is written, so the line comes through the follow reads.
	testenv.WaitFor(t, 30*time.Second, "kibo workspace logs --follow printing the last line", func() (bool, string) {
		return strings.Count(f.stdout.String(), "\n") >= 1, f.stderr.String()
	})
	d.must("workspace", "exec", id, "--", "sh", "-c", "echo "+marker+" > /dev/console")
	var r clusterlab.Result
	testenv.WaitFor(t, 30*time.Second, "the console line in kibo workspace logs", func() (bool, string) {
		r = d.kibo(time.Minute, nil, "workspace", "logs", id)
		return r.Code == 0 && strings.Contains(r.Stdout, marker), clusterlab.TrimTo(r.String(), 600)
	})
	if !strings.Contains(r.Stdout, "guest agent session started") {
		t.Errorf("workspace logs lacks the guest's boot output (guest agent session started):\n%s", clusterlab.TrimTo(r.Stdout, 2000))
	}
	if r := d.must("workspace", "logs", id, "--tail", "1"); strings.Count(r.Stdout, "\n") != 1 || !strings.Contains(r.Stderr, "not shown") {
		t.Errorf("--tail 1: want one line and a note of what was cut: %s", r)
	}
	var l machineLogView
	if err := clusterlab.DecodeResult(d.must("workspace", "logs", id, "--json"), &l); err != nil {
		t.Fatal(err)
	}
	if !l.Live || l.InstanceID != inst || l.NodeID != "dev" || !strings.Contains(l.Console, marker) {
		t.Errorf("--json: live %v instance %s node %s, console with the line %v; want live, %s, dev",
			l.Live, l.InstanceID, l.NodeID, strings.Contains(l.Console, marker), inst)
	}
	if r := d.expect(api.ExitNotFound, "workspace", "logs", id, "--instance", "inst-aaaaaaaaaaaaaaaaaaaaaaaaaa"); !strings.Contains(r.Stderr, "has no instance") {
		t.Errorf("an Instance of no Workspace: %s", r)
	}
	if r := d.expect(api.ExitInvalidArgument, "workspace", "logs", id, "--instance", "../../../etc"); !strings.Contains(r.Stderr, "not an Instance id") {
		t.Errorf("a path as the Instance: %s", r)
	}
	testenv.WaitFor(t, 30*time.Second, "the console line from kibo workspace logs --follow", func() (bool, string) {
		return strings.Contains(f.stdout.String(), marker), clusterlab.TrimTo(f.stdout.String()+f.stderr.String(), 600)
	})
	return marker, f
}

// testLogsEnded: the follower of the stopped Instance ended by itself;
// after a stop and start, --instance shows the ended Instance's console
// tail the node kept, and the default is the new one.
func (d *wsDev) testLogsEnded(id, ended, marker string, f *logFollower) {
	t := d.t
	done := make(chan error, 1)
	go func() { done <- f.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(f.stderr.String(), "instance "+ended+" no longer runs") {
			t.Errorf("kibo workspace logs --follow after the stop: %v, stderr %q; want exit 0 saying the Instance no longer runs", err, f.stderr.String())
		}
	case <-time.After(30 * time.Second):
		f.cmd.Process.Kill()
		<-done
		t.Errorf("kibo workspace logs --follow still runs 30 s after its Instance stopped; stderr %q", f.stderr.String())
	}
	r := d.must("workspace", "logs", id, "--instance", ended)
	if !strings.Contains(r.Stdout, marker) || !strings.Contains(r.Stderr, "instance "+ended+" has ended") {
		t.Errorf("--instance %s (ended): want its console with %q and a note that it ended: %s", ended, marker, clusterlab.TrimTo(r.String(), 2000))
	}
	// The VMM's unit appended how it ended to its log.
	if r := d.must("workspace", "logs", id, "--instance", ended, "--vmm"); !strings.Contains(r.Stdout, "kibotos: vmm exited") {
		t.Errorf("--instance %s --vmm: want the VMM log's last line: %s", ended, clusterlab.TrimTo(r.String(), 2000))
	}
	testenv.WaitFor(t, 30*time.Second, "the new Instance's boot in kibo workspace logs", func() (bool, string) {
		r = d.kibo(time.Minute, nil, "workspace", "logs", id)
		return r.Code == 0 && strings.Contains(r.Stdout, "guest agent session started"), clusterlab.TrimTo(r.String(), 600)
	})
	if strings.Contains(r.Stdout, marker) || r.Stderr != "" {
		t.Errorf("the new Instance's log shows the ended one's line, or a note: %s", clusterlab.TrimTo(r.String(), 2000))
	}
}
