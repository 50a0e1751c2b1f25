package e2e

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// testUpgrade replaces the dev member's program the way the upgrade
// procedure of docs/operating/upgrades.md does, with builds of this tree
// stamped 0.3.0, 0.3.1 and 0.4.0, each one's Platform built beside the
// running member first:
//
//   - unreleased → 0.3.0: the Instance runs on the unreleased build's
//     Platform, which 0.3.0 does not drive: FAILED with "compatible
//     runtime installation unavailable", its VMM running; stop --force and
//     start put it on 0.3.0's Platform.
//   - 0.3.0 → 0.3.1 (one release line): the VM is taken over, an exec
//     streaming through the data plane runs on across the replacement,
//     clients connecting in a loop meanwhile are never refused, two
//     data-plane units run while the old one drains, and it exits once the
//     stream ends.
//   - 0.3.1 → 0.4.0 (across MINOR): the VM is taken over, the old data
//     plane is ended (its stream cut), the new one serves.
//   - 0.4.0 → 0.3.1: refused (no rollback) before anything is written.
func (d *wsDev) testUpgrade(id string) {
	t := d.t
	builds := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, r := range []string{"0.3.0", "0.3.1", "0.4.0"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir := clusterlab.BuildRelease(t, filepath.Join(d.tmp, "bin-"+r), r)
			mu.Lock()
			builds[r] = dir
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	storage := datadir.Dir(d.dir).StorageRoot()
	for _, rel := range []string{"0.3.0", "0.3.1", "0.4.0"} {
		// Step 1 of the procedure, beside the live member.
		if r := d.run(builds[rel], 2*time.Minute, "platform", "build", "--storage-root", storage); r.Code != 0 {
			t.Fatalf("platform build with %s: %s", rel, r)
		}
	}

	// unreleased → 0.3.0.
	before := d.get(id)
	inc := d.replace(builds["0.3.0"])
	testenv.WaitFor(t, time.Minute, "the Workspace FAILED for its runtime installation", func() (bool, string) {
		r := d.kibo(10*time.Second, nil, "workspace", "get", id)
		return strings.Contains(r.Stdout, "compatible runtime installation unavailable"), clusterlab.TrimTo(r.Stdout, 600)
	})
	if !d.devProc().LogContains("earlier runtime installation cannot be retained") {
		t.Error("no 'earlier runtime installation cannot be retained' in the member's log")
	}
	d.must("workspace", "stop", id, "--force")
	d.must("workspace", "start", id)
	started := d.get(id)
	if started.State != api.WorkspaceAvailable || started.InstanceID == before.InstanceID {
		t.Fatalf("after stop --force and start on 0.3.0: %+v", started)
	}

	// 0.3.0 → 0.3.1, with a stream open and clients connecting in a loop.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cred, roots := d.credential(ctx, id)
	stream := d.streamExec(ctx, cred, roots, 60) // 60 lines, 0.2 s apart
	loop := d.connectLoop(ctx, cred, roots)
	inc = d.replace(builds["0.3.1"], inc)
	d.waitConnections(loop, 20)
	if units := d.dataPlaneUnits(); len(units) != 2 && !stream.ended() {
		t.Errorf("data-plane units while the old generation drains: %v, want 2", units)
	}
	got, err := stream.wait()
	if err != nil || got != 60 {
		t.Errorf("the exec streaming across the replacement on one release line: %d lines, %v; want all 60", got, err)
	}
	testenv.WaitFor(t, 30*time.Second, "one data-plane unit once the stream ended", func() (bool, string) {
		u := d.dataPlaneUnits()
		return len(u) == 1, fmt.Sprint(u)
	})
	ok, refused := loop.stop()
	t.Logf("TIMING data-plane hand-over: %d connections made while the member was replaced, %d refused", ok, refused)
	if refused != 0 {
		t.Errorf("%d of %d connections refused during the hand-over; want none: %v", refused, ok+refused, loop.errs)
	}
	if w := d.get(id); w.State != api.WorkspaceAvailable || w.InstanceID != started.InstanceID {
		t.Errorf("after 0.3.0 → 0.3.1: %+v; want the same Instance %s, taken over", w, started.InstanceID)
	}

	// 0.3.1 → 0.4.0: another line; the old data plane is ended.
	cred, roots = d.credential(ctx, id)
	stream = d.streamExec(ctx, cred, roots, 150)
	inc = d.replace(builds["0.4.0"], inc)
	if got, err := stream.wait(); err == nil || got >= 150 {
		t.Errorf("a stream across a switch of release line: %d lines, %v; want it cut", got, err)
	}
	if u := d.dataPlaneUnits(); len(u) != 1 {
		t.Errorf("data-plane units after a switch of release line: %v, want 1", u)
	}
	if w := d.get(id); w.State != api.WorkspaceAvailable || w.InstanceID != started.InstanceID {
		t.Errorf("after 0.3.1 → 0.4.0: %+v; want the same Instance %s, taken over", w, started.InstanceID)
	}
	if r := d.must("workspace", "exec", id, "--", "echo", "on 0.4.0"); r.Stdout != "on 0.4.0\n" {
		t.Errorf("exec on 0.4.0: %q", r.Stdout)
	}

	// 0.4.0 → 0.3.1: no rollback, nothing written.
	d.stopDev()
	dir := datadir.Dir(d.dir)
	recorded := func() string {
		h := ""
		for _, p := range []string{dir.IdentityFile(), dir.ReleaseFile(), filepath.Join(dir.NodeDir(), "incarnation"), dir.RaftDir(), filepath.Dir(dir.StateFile()),
			filepath.Join(storage, "installations"), filepath.Join(storage, "runtime", "registry")} {
			if _, err := os.Stat(p); err == nil {
				h += testenv.TreeDigest(t, p)
			}
		}
		return h
	}
	digest := recorded()
	r := d.run(builds["0.3.1"], time.Minute, "dev", "--data-dir", d.dir, "--advertise", d.addr, "--no-demo")
	if r.Code != api.ExitFailedPrecondition || !strings.Contains(r.Stderr, "was run by kibotos 0.4.0; this is 0.3.1 and there is no rollback") {
		t.Errorf("kibotos dev 0.3.1 after 0.4.0: %s", r)
	}
	if recorded() != digest {
		t.Error("the refused downgrade changed the member's records")
	}
	d.bin = builds["0.4.0"]
	d.up()
	d.waitReady(inc)
}

// run runs kibotos from dir (a build) with the dev environment.
func (d *wsDev) run(dir string, timeout time.Duration, args ...string) clusterlab.Result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "kibotos"), args...)
	cmd.Env = d.env()
	return clusterlab.RunResult(ctx, timeout, cmd, args)
}

// stopDev stops the dev member as stopping its service would: the VMs
// and the data plane run on.
func (d *wsDev) stopDev() {
	d.t.Helper()
	p := d.devProc()
	p.Cmd.Process.Signal(syscall.SIGINT)
	if _, ok := p.WaitExit(30 * time.Second); !ok {
		d.t.Fatalf("kibotos dev (pid %d) did not stop within 30s of SIGINT", p.Cmd.Process.Pid)
	}
}

// replace stops the dev member and starts the build in dir on the same
// data directory; it returns the new node incarnation.
func (d *wsDev) replace(dir string, after ...uint64) uint64 {
	d.t.Helper()
	var n wsNode
	if len(after) == 0 {
		if err := clusterlab.DecodeResult(d.must("node", "get", "dev", "--json"), &n); err != nil || n.Session == nil {
			d.t.Fatalf("node get dev: %v", err)
		}
		after = []uint64{n.Session.Incarnation}
	}
	d.stopDev()
	t0 := time.Now()
	d.bin = dir
	d.up()
	inc := d.waitReady(after[0])
	d.t.Logf("TIMING member replaced by %s: READY after %s", filepath.Base(dir), time.Since(t0).Round(time.Millisecond))
	return inc
}

// dataPlaneUnits lists the data-plane units of the dev member.
func (d *wsDev) dataPlaneUnits() []string {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sd, err := privsd.Attach(ctx, filepath.Join(datadir.Dir(d.dir).NodeDir(), "systemd"))
	if err != nil {
		d.t.Fatal(err)
	}
	defer sd.Release()
	m, err := units.Connect(ctx, sd.Target())
	if err != nil {
		d.t.Fatal(err)
	}
	defer m.Close()
	l, err := m.List(ctx, "kibotos-dataplane-*")
	if err != nil {
		d.t.Fatal(err)
	}
	var names []string
	for _, u := range l {
		if u.Active() {
			names = append(names, u.Name)
		}
	}
	return names
}

// stream is an exec printing numbered lines through the data plane.
type stream struct {
	lines atomic.Int64
	done  chan struct{}
	err   error
}

func (s *stream) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// wait returns how many lines arrived and how the exec ended.
func (s *stream) wait() (int, error) {
	<-s.done
	return int(s.lines.Load()), s.err
}

// streamExec starts an exec printing n lines 0.2 s apart, over one
// data-plane connection, and returns once the first line arrived.
func (d *wsDev) streamExec(ctx context.Context, cred api.DataPlaneCredential, roots *x509.CertPool, n int) *stream {
	t := d.t
	t.Helper()
	c, err := dataplane.Connect(ctx, cred, roots)
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("for i in $(seq 1 %d); do echo $i; sleep 0.2; done", n)},
		Root: agent.WorkspaceRoot, Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	s := &stream{done: make(chan struct{})}
	first := make(chan struct{})
	go func() {
		defer close(s.done)
		defer c.Close()
		buf := make([]byte, 4096)
		var text strings.Builder
		for {
			k, rerr := p.Stdout.Read(buf)
			text.Write(buf[:k])
			lines := strings.Count(text.String(), "\n")
			if lines > 0 && s.lines.Swap(int64(lines)) == 0 {
				close(first)
			}
			if rerr != nil {
				if !errors.Is(rerr, io.EOF) {
					s.err = rerr
				}
				break
			}
		}
		if ex, err := p.Wait(); err != nil {
			s.err = errors.Join(s.err, err)
		} else if ex.ExitCode != 0 {
			s.err = errors.Join(s.err, fmt.Errorf("exit %d", ex.ExitCode))
		}
		if got := strings.Fields(text.String()); len(got) > 0 && got[len(got)-1] != strconv.Itoa(len(got)) {
			s.err = errors.Join(s.err, fmt.Errorf("lines out of order: %v", got))
		}
	}()
	select {
	case <-first:
	case <-s.done:
		t.Fatalf("the streaming exec ended before its first line: %v", s.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the streaming exec printed nothing in 30s")
	}
	return s
}

// loop is clients connecting to the data plane over and over.
type loop struct {
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	ok, refused atomic.Int64
	mu          sync.Mutex
	errs        []string
}

func (l *loop) stop() (int64, int64) {
	l.cancel()
	l.wg.Wait()
	return l.ok.Load(), l.refused.Load()
}

// connectLoop starts two clients that each connect, run `true` and close,
// in a loop, counting successes and refusals; a refusal's error is kept.
func (d *wsDev) connectLoop(ctx context.Context, cred api.DataPlaneCredential, roots *x509.CertPool) *loop {
	ctx, cancel := context.WithCancel(ctx)
	l := &loop{cancel: cancel}
	for i := 0; i < 2; i++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				err := func() error {
					cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
					defer ccancel()
					c, err := dataplane.Connect(cctx, cred, roots)
					if err != nil {
						return err
					}
					defer c.Close()
					p, err := c.Exec(cctx, guestproto.ExecRequest{Argv: []string{"true"}, Root: agent.WorkspaceRoot, Env: []string{"PATH=/usr/bin:/bin"}})
					if err != nil {
						return err
					}
					io.Copy(io.Discard, p.Stdout)
					ex, err := p.Wait()
					if err == nil && ex.ExitCode != 0 {
						err = fmt.Errorf("true exited %d", ex.ExitCode)
					}
					return err
				}()
				switch {
				case ctx.Err() != nil:
				case err != nil:
					l.refused.Add(1)
					l.mu.Lock()
					l.errs = append(l.errs, err.Error())
					l.mu.Unlock()
				default:
					l.ok.Add(1)
				}
			}
		}()
	}
	return l
}

// waitConnections waits until the loop made n more connections.
func (d *wsDev) waitConnections(l *loop, n int64) {
	d.t.Helper()
	from := l.ok.Load() + l.refused.Load()
	testenv.WaitFor(d.t, time.Minute, fmt.Sprintf("%d connections after the replacement", n), func() (bool, string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.ok.Load()+l.refused.Load()-from >= n, fmt.Sprintf("ok %d refused %d %v", l.ok.Load(), l.refused.Load(), l.errs)
	})
}
