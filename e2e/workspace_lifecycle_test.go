package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
)

// testStopStart: a stop keeps the writable layer; a start is a new Instance.
func (d *wsDev) testStopStart(id string) {
	t := d.t
	before := d.get(id)
	var marker string
	var follow *logFollower
	d.step("LogsLive", func() { marker, follow = d.testLogsLive(id, before.InstanceID) })
	d.must("workspace", "exec", id, "--", "sh", "-c", "echo kept > /root/f; echo on-volume > /data/f; sync")
	t0 := time.Now()
	d.must("workspace", "stop", id)
	// Grown while stopped: the guest grows the filesystem when it mounts it.
	d.must("volume", "resize", "data", "--size", "128MiB")
	t.Logf("TIMING stop: %s", time.Since(t0).Round(time.Millisecond))
	if w := d.get(id); w.State != api.WorkspaceStopped || w.InstanceID != "" {
		t.Errorf("after stop: %+v, want STOPPED without an instance", w)
	}
	if out := d.must("workspace", "list").Stdout; strings.Contains(out, id) {
		t.Errorf("list without --all shows the STOPPED %s:\n%s", id, out)
	}
	if out := d.must("workspace", "list", "--all").Stdout; !regexp.MustCompile(`(?m)^` + id + `\s+STOPPED\s`).MatchString(out) {
		t.Errorf("list --all lacks %s STOPPED:\n%s", id, out)
	}
	if r := d.expect(api.ExitFailedPrecondition, "workspace", "exec", id, "--", "true"); !strings.Contains(r.Stderr, "STOPPED") || !strings.Contains(r.Stderr, "workspace start "+id) {
		t.Errorf("exec on a STOPPED Workspace must say to start it: %s", r)
	}
	t0 = time.Now()
	d.must("workspace", "start", id)
	t.Logf("TIMING start (to AVAILABLE): %s", time.Since(t0).Round(time.Millisecond))
	after := d.get(id)
	if after.State != api.WorkspaceAvailable || after.NodeID != "dev" || after.InstanceID == "" || after.InstanceID == before.InstanceID {
		t.Errorf("after start: %+v; want AVAILABLE on dev with a new instance (was %s)", after, before.InstanceID)
	}
	if r := d.must("workspace", "exec", id, "--", "cat", "/root/f", "/data/f"); r.Stdout != "kept\non-volume\n" {
		t.Errorf("the files written before the stop: %q, want %q", r.Stdout, "kept\non-volume\n")
	}
	if kib := dfKiB(t, d.must("workspace", "exec", id, "--", "df", "-k", "/data").Stdout); kib < 100<<10 {
		t.Errorf("df -k /data after the Volume grew to 128MiB while stopped: %d KiB", kib)
	}
	if marker != "" {
		d.step("LogsEnded", func() { d.testLogsEnded(id, before.InstanceID, marker, follow) })
	}
}

// testPauseResume pauses the Workspace with a process counting in it and
// an exec streaming: the exec ends with an error, the node's CPU and
// memory are free, exec is refused while PAUSED; resumed, the same process
// counts on from where it was, its open file and the Volume's mount are
// there, the guest's clock is right.
func (d *wsDev) testPauseResume(id string) {
	t := d.t
	// The count is renamed into place: a read between the shell's
	// truncate and its write would find the file empty.
	d.must("workspace", "exec", id, "--", "sh", "-c", "(i=0; exec 3>/tmp/held; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv -f /tmp/count.new /tmp/count; echo $i >&3; sleep 0.1; done) >/dev/null 2>&1 & echo $! > /tmp/counter.pid")
	pid := strings.TrimSpace(d.must("workspace", "exec", id, "--", "cat", "/tmp/counter.pid").Stdout)
	stream := exec.Command(filepath.Join(d.bin, "kibo"), "workspace", "exec", id, "--", "sh", "-c", "while :; do echo tick; sleep 0.2; done")
	stream.Env = d.env()
	stream.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var streamErr lockedBuf
	stream.Stderr = &streamErr
	out, err := stream.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Start(); err != nil {
		t.Fatal(err)
	}
	d.track(stream)
	bufio.NewReader(out).ReadString('\n') // the stream runs
	go io.Copy(io.Discard, out)

	// Where the counter was just before the pause: under TCG on a busy
	// machine it may have counted only once or twice by now, so "counts
	// on" is measured from here, not from a fixed number.
	before, err := strconv.Atoi(strings.TrimSpace(d.must("workspace", "exec", id, "--", "cat", "/tmp/count").Stdout))
	if err != nil {
		t.Fatalf("the counter before the pause: %v", err)
	}
	t0 := time.Now()
	d.must("workspace", "pause", id)
	t.Logf("TIMING pause (CLI, to PAUSED): %s", time.Since(t0).Round(time.Millisecond))
	w := d.get(id)
	if w.State != api.WorkspacePaused || w.InstanceID != "" {
		t.Fatalf("after pause: %+v", w)
	}
	done := make(chan error, 1)
	go func() { done <- stream.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(streamErr.String(), "was paused while the command ran") {
			t.Errorf("the exec streaming across the pause: exit %v, stderr %q; want it to say the Workspace was paused", err, streamErr.String())
		}
		t.Logf("the exec streaming across the pause ended: %v: %s", err, strings.TrimSpace(streamErr.String()))
	case <-time.After(30 * time.Second):
		t.Errorf("the exec streaming across the pause still runs 30 s after it")
	}
	if got := d.must("workspace", "get", id).Stdout; !strings.Contains(got, "Snapshot:") || !strings.Contains(got, "PAUSED") {
		t.Errorf("workspace get of a paused Workspace:\n%s", got)
	}
	if r := d.expect(api.ExitFailedPrecondition, "workspace", "exec", id, "--", "true"); !strings.Contains(r.Stderr, "is PAUSED") || !strings.Contains(r.Stderr, "kibo workspace resume "+id) {
		t.Errorf("exec on a paused Workspace: %s; want it to say PAUSED and how to resume it", r)
	}
	t0 = time.Now()
	d.must("workspace", "resume", id)
	tResume := time.Since(t0)
	got := d.must("workspace", "exec", id, "--", "sh", "-c", "cat /tmp/count; kill -0 $(cat /tmp/counter.pid) && echo alive; ls /proc/$(cat /tmp/counter.pid)/fd/3 >/dev/null && echo held; cat /data/f; date +%s")
	t.Logf("TIMING resume (CLI, to AVAILABLE): %s, to the first exec answer: %s", tResume.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	lines := strings.Split(strings.TrimSpace(got.Stdout), "\n")
	if len(lines) != 5 || lines[1] != "alive" || lines[2] != "held" || lines[3] != "on-volume" {
		t.Fatalf("after resume: %q; want the count, alive, held, the Volume's file, the date", got.Stdout)
	}
	if count, _ := strconv.Atoi(lines[0]); count < before {
		t.Errorf("the counter after resume is %d, was %d before the pause: it started over", count, before)
	}
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("the counter to count on past %d after resume", before), func() (bool, string) {
		c := strings.TrimSpace(d.must("workspace", "exec", id, "--", "cat", "/tmp/count").Stdout)
		n, _ := strconv.Atoi(c)
		return n > before, "count " + c
	})
	if now, _ := strconv.ParseInt(lines[4], 10, 64); time.Now().Unix()-now > 3 || now-time.Now().Unix() > 3 {
		t.Errorf("the guest's clock after resume: %d, the host's %d", now, time.Now().Unix())
	}
	if again := strings.TrimSpace(d.must("workspace", "exec", id, "--", "cat", "/tmp/counter.pid").Stdout); again != pid {
		t.Errorf("the counting process is %s after resume, was %s", again, pid)
	}
	if w := d.get(id); w.State != api.WorkspaceAvailable || w.Snapshot != nil {
		t.Errorf("after resume: %+v", w)
	}
	d.must("workspace", "exec", id, "--", "sh", "-c", "kill $(cat /tmp/counter.pid)")
}

// testReboot reboots the guest from inside, right after a resume (so
// the configuration it is told again came through the snapshot): the VMM
// boots it again, and the node gives the new boot the launch-time
// configuration, its filesystem, pseudo filesystems, DNS, Volume and
// hostname. The Workspace stays AVAILABLE on the same Instance.
func (d *wsDev) testReboot(id string) {
	t := d.t
	before := d.get(id)
	const look = "cat /proc/sys/kernel/random/boot_id; hostname; cat /data/f /root/f; grep -c nameserver /etc/resolv.conf; ls /dev/null /proc/self/status"
	boot := func(r clusterlab.Result) string { b, _, _ := strings.Cut(r.Stdout, "\n"); return b }
	was := d.must("workspace", "exec", id, "--", "sh", "-c", look)
	t0 := time.Now()
	d.must("workspace", "exec", id, "--", "sh", "-c", "sync; (sleep 1; reboot -f) >/dev/null 2>&1 &")
	var after clusterlab.Result
	testenv.WaitFor(t, 3*time.Minute, "an exec on the rebooted guest", func() (bool, string) {
		after = d.kibo(20*time.Second, nil, "workspace", "exec", id, "--", "sh", "-c", look)
		return after.Code == 0 && boot(after) != boot(was), after.String()
	})
	t.Logf("TIMING reboot from inside to an exec on the new boot: %s", time.Since(t0).Round(time.Millisecond))
	if rest := strings.SplitN(after.Stdout, "\n", 2)[1]; rest != strings.SplitN(was.Stdout, "\n", 2)[1] {
		t.Errorf("after the reboot the Workspace shows\n%s\nbefore it\n%s", rest, strings.SplitN(was.Stdout, "\n", 2)[1])
	}
	// ctrl hears of the responding guest with the node's next report.
	testenv.WaitFor(t, 30*time.Second, "get to show the guest responding", func() (bool, string) {
		w := d.get(id)
		return !w.GuestNotResponding, fmt.Sprintf("%+v", w)
	})
	if w := d.get(id); w.State != api.WorkspaceAvailable || w.InstanceID != before.InstanceID {
		t.Errorf("after the reboot: %+v; want AVAILABLE on instance %s", w, before.InstanceID)
	}
	if !d.devProc().LogContains("instance guest restarted; reconfigured with the launch-time configuration") {
		t.Errorf("the node did not log the reconfigured restart")
	}
}

// testNodeKill kills the node process with SIGKILL while an exec streams:
// the exec goes on (the data plane and the VM outlive the node), and a new
// node process takes the VM over.
func (d *wsDev) testNodeKill(id string) {
	t := d.t
	before := d.get(id)
	var n wsNode
	if err := clusterlab.DecodeResult(d.must("node", "get", "dev", "--json"), &n); err != nil || n.Session == nil {
		t.Fatalf("node get dev: %v %+v", err, n)
	}
	cmd := exec.Command(filepath.Join(d.bin, "kibo"), "workspace", "exec", id, "--", "sh", "-c", "for i in $(seq 1 30); do echo $i; sleep 0.2; done")
	cmd.Env = d.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.track(cmd)
	var got []string
	first := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			got = append(got, sc.Text())
			if len(got) == 1 {
				close(first)
			}
		}
	}()
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatalf("the streaming exec printed nothing in 30s; stderr %q", stderr.String())
	}
	p := d.devProc()
	t.Logf("killing kibotos dev (pid %d) with SIGKILL while the exec streams", p.Cmd.Process.Pid)
	p.Cmd.Process.Signal(syscall.SIGKILL)
	if _, ok := p.WaitExit(10 * time.Second); !ok {
		t.Fatalf("kibotos dev (pid %d) did not die after SIGKILL", p.Cmd.Process.Pid)
	}
	<-readDone
	err = cmd.Wait()
	want := make([]string, 30)
	for i := range want {
		want[i] = strconv.Itoa(i + 1)
	}
	if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("exec across kill -9 of the node: err %v, stdout %v, stderr %q; want 1..30 and exit 0", err, got, stderr.String())
	}

	t0 := time.Now()
	d.up()
	d.waitReady(n.Session.Incarnation)
	t.Logf("TIMING node restart to READY: %s", time.Since(t0).Round(time.Millisecond))
	if !d.devProc().LogContains("instance taken over") {
		t.Errorf("the restarted node did not log the takeover of %s", before.InstanceID)
	}
	after := d.get(id)
	if after.State != api.WorkspaceAvailable || after.InstanceID != before.InstanceID {
		t.Errorf("after the node restart: %+v; want AVAILABLE with the same instance %s", after, before.InstanceID)
	}
	if r := d.must("workspace", "exec", id, "--", "cat", "/root/f"); r.Stdout != "kept\n" {
		t.Errorf("the file after the node restart: %q, want %q", r.Stdout, "kept\n")
	}
	if r := d.must("workspace", "exec", id, "--", "sh", "-c", "echo again"); r.Stdout != "again\n" {
		t.Errorf("a new exec after the node restart: %q", r.Stdout)
	}
}

// testForceStopDelete: cleanup-status, stop --force, delete and the layer.
func (d *wsDev) testForceStopDelete(id string) {
	t := d.t
	out := d.must("workspace", "cleanup-status", id).Stdout
	for _, item := range []string{"RUNTIME", "VOLUME_ATTACHMENT", "RESIDUAL"} {
		if !regexp.MustCompile(`(?m)^` + item + `\s+(HELD|RELEASED|PENDING|UNKNOWN)\s`).MatchString(out) {
			t.Errorf("cleanup-status lacks a %s row:\n%s", item, out)
		}
	}
	d.must("workspace", "stop", "--force", id)
	if w := d.get(id); w.State != api.WorkspaceStopped || !w.StopUnconfirmed {
		t.Errorf("after stop --force: %+v; want STOPPED with stop_unconfirmed", w)
	}
	layer := filepath.Join(datadir.Dir(d.dir).StorageRoot(), "pools", "default", "layers", id+".qcow2")
	if _, err := os.Stat(layer); err != nil {
		t.Errorf("the writable layer of a STOPPED Workspace: %v", err)
	}
	// The node's own observation of the release replaces ctrl's view once
	// ctrl stored it; the node then deletes its ended-Instance record.
	// ctrl checks a node's records once a minute.
	registry := filepath.Join(datadir.Dir(d.dir).StorageRoot(), "runtime", "registry")
	var st api.CleanupStatus
	testenv.WaitFor(t, fsm.EndedRoundInterval+30*time.Second, "cleanup-status from the node and its ended-Instance records deleted", func() (bool, string) {
		if err := clusterlab.DecodeResult(d.must("workspace", "cleanup-status", id, "--json"), &st); err != nil {
			t.Fatal(err)
		}
		left, _ := filepath.Glob(filepath.Join(registry, "inst-*.json"))
		return len(st.Items) == 3 && st.Items[0].Source == "node" && len(left) == 0, fmt.Sprintf("records %v, status %+v", left, st)
	})
	// The records concluded and deleted: none is counted as destroyed.
	if v := metricValue(t, d.scrape(), "kibotos_node_instances", "state", "destroyed"); v != 0 {
		t.Errorf("kibotos_node_instances{state=destroyed} = %v after the node deleted its records, want 0", v)
	}
	for _, it := range st.Items {
		if it.State != api.CleanupReleased || it.ObservedAt == nil || it.Source != "node" {
			t.Errorf("after stop --force, cleanup item %+v: want RELEASED as observed by the node", it)
		}
	}
	d.must("workspace", "delete", id)
	if r := d.expect(api.ExitNotFound, "workspace", "get", id); !strings.Contains(r.Stderr, id) {
		t.Errorf("get after delete: %s", r)
	}
	if _, err := os.Stat(layer); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the writable layer %s after delete: %v, want it gone", layer, err)
	}
	// The Volume outlived its Workspace; deleted, its file goes.
	var v api.Volume
	if err := clusterlab.DecodeResult(d.must("volume", "get", "data", "--json"), &v); err != nil || v.WorkspaceID != "" || v.State != api.VolumeAvailable {
		t.Fatalf("the Volume after its Workspace was deleted: %+v %v", v, err)
	}
	d.must("volume", "delete", "data")
	if _, err := os.Stat(api.VolumeFilePath(filepath.Join(datadir.Dir(d.dir).StorageRoot(), "pools", "default"), v.VolumeID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the Volume's file after volume delete: %v, want it gone", err)
	}
}
