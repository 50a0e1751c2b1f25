package e2e

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// testExec: exit codes, separate stdout and stderr, signals, binary
// stdio; fetching with wget and nc.
func (d *wsDev) testExec(id string) {
	t := d.t
	t0 := time.Now()
	r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	t.Logf("TIMING first exec: %s", time.Since(t0).Round(time.Millisecond))
	if r.Code != 7 || r.Stdout != "out\n" || r.Stderr != "err\n" {
		t.Errorf("exec exit 7: want code 7, stdout %q, stderr %q; got %s (stdout %q stderr %q)", "out\n", "err\n", r, r.Stdout, r.Stderr)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "kill -TERM $$"); r.Code != 128+int(syscall.SIGTERM) {
		t.Errorf("exec of a process killed by SIGTERM: want exit 143, got %s", r)
	}
	// A command that does not start exits as a shell says: 127 not
	// found, 126 cannot run (here: its working directory is missing).
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "no-such-command"); r.Code != 127 || !strings.Contains(r.Stderr, "workspace "+id+": no-such-command: command not found in PATH ") {
		t.Errorf("exec of a missing command: want exit 127 and the PATH searched: %s", r)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", "-w", "/no-such-dir", id, "--", "pwd"); r.Code != 126 || !strings.Contains(r.Stderr, "workspace "+id+": working directory /no-such-dir: no such directory") {
		t.Errorf("exec in a missing working directory: want exit 126 naming it: %s", r)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", "-e", "KIBOTOS_E2E_UNSET", id, "--", "true"); r.Code != 2 || !strings.Contains(r.Stderr, "-e KIBOTOS_E2E_UNSET: KIBOTOS_E2E_UNSET is not set here") {
		t.Errorf("exec -e of a variable not set: want exit 2: %s", r)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", "-e", "KIBOTOS_DATA_DIR", id, "--", "sh", "-c", `echo "$KIBOTOS_DATA_DIR"`); r.Code != 0 || r.Stdout != d.dir+"\n" {
		t.Errorf("exec -e KEY passes kibo's value: %s (stdout %q)", r, r.Stdout)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "test -c /dev/null && test -r /proc/self/stat"); r.Code != 0 {
		t.Errorf("the Workspace lacks /dev or /proc: %s", r)
	}
	// A template without an image config (not built from an OCI image):
	// the node's defaults, root, the top of the root.
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", `echo "$LANG $HOME $(id -u) $(pwd)"`); r.Code != 0 || r.Stdout != "C.UTF-8 /root 0 /\n" {
		t.Errorf("exec defaults without an image config: %s (stdout %q), want \"C.UTF-8 /root 0 /\"", r, r.Stdout)
	}
	in := randBytes(t, 1<<20)
	t0 = time.Now()
	r = d.kibo(time.Minute, in, "workspace", "exec", id, "--", "cat")
	if r.Code != 0 || r.Stdout != string(in) {
		t.Errorf("1 MiB of random bytes through cat: exit %d, %d bytes back, equal %v: %s", r.Code, len(r.Stdout), r.Stdout == string(in), clusterlab.TrimTo(r.Stderr, 300))
	}
	t.Logf("TIMING 1 MiB through exec cat: %s", time.Since(t0).Round(time.Millisecond))

	// A server started with nohup in the background outlives its exec,
	// as under docker exec or ssh (the busybox template has a nohup of
	// its own): the loop still writes once the exec that started it
	// ended.
	d.must("workspace", "exec", id, "--", "sh", "-c", `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/alive.new; mv -f /tmp/alive.new /tmp/alive; sleep 0.2; done' >/dev/null 2>&1 & echo $! > /tmp/alive.pid`)
	var seen string
	testenv.WaitFor(t, 30*time.Second, "the nohup loop to go on after its exec ended", func() (bool, string) {
		now := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "cat", "/tmp/alive").Stdout
		if seen == "" || now == seen {
			seen = now
			return false, "count " + strings.TrimSpace(now)
		}
		return true, ""
	})
	d.must("workspace", "exec", id, "--", "sh", "-c", "kill $(cat /tmp/alive.pid)")

	// A new user's first move is to fetch something: wget -T (which
	// crashes busybox's wget), run directly and from sh, and nc; and
	// /etc/resolv.conf is the guest agent's.
	d.must("workspace", "exec", id, "--", "sh", "-c", "mkdir -p /tmp/www && echo fetched > /tmp/www/index.html && httpd -p 127.0.0.1:8081 -h /tmp/www")
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "wget", "-T", "5", "-q", "-O-", "http://127.0.0.1:8081/"); r.Code != 0 || r.Stdout != "fetched\n" {
		t.Errorf("exec wget -T 5 of the Workspace's own server: %s (stdout %q)", r, r.Stdout)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "wget -T 5 -q -O- http://localhost:8081/"); r.Code != 0 || r.Stdout != "fetched\n" {
		t.Errorf("sh -c 'wget -T 5' of localhost: %s (stdout %q)", r, r.Stdout)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 localhost 8081"); r.Code != 0 || !strings.Contains(r.Stdout, "fetched") {
		t.Errorf("nc localhost 8081: %s (stdout %q)", r, r.Stdout)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "grep", "-c", " /etc/resolv.conf ", "/proc/self/mounts"); r.Code != 0 || r.Stdout != "1\n" {
		t.Errorf("/etc/resolv.conf of the Workspace is not the guest agent's bind mount: %s (stdout %q)", r, r.Stdout)
	}
}

// testPTY opens the data plane as the CLI does (a credential from ctrl,
// the cluster CA) and runs a shell in a PTY: its size at start and after
// a resize.
func (d *wsDev) testPTY(id string) {
	t := d.t
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cred, roots := d.credential(ctx, id)
	c, err := dataplane.Connect(ctx, cred, roots)
	if err != nil {
		t.Fatalf("dataplane.Connect: %v", err)
	}
	defer c.Close()

	// One command with a PTY of a given size.
	p, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"stty", "size"}, Root: agent.WorkspaceRoot,
		Env: []string{"PATH=/usr/bin:/bin", "TERM=xterm"}, PTY: &guestproto.WinSize{Rows: 33, Cols: 101}})
	if err != nil {
		t.Fatalf("exec stty size: %v", err)
	}
	out, _ := io.ReadAll(p.Stdout)
	if ex, err := p.Wait(); err != nil || ex.ExitCode != 0 || strings.TrimSpace(string(out)) != "33 101" {
		t.Errorf("stty size in a 33x101 PTY: %q, exit %+v, err %v", out, ex, err)
	}

	// A shell: its size, a resize, its size again.
	sh, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sh"}, Root: agent.WorkspaceRoot, Stdin: true,
		Env: []string{"PATH=/usr/bin:/bin", "TERM=xterm"}, PTY: &guestproto.WinSize{Rows: 33, Cols: 101}})
	if err != nil {
		t.Fatalf("exec sh: %v", err)
	}
	var buf lockedBuf
	copied := make(chan struct{})
	go func() { io.Copy(&buf, sh.Stdout); close(copied) }()
	sizeRe := func(rows, cols int) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`(?m)^%d %d\r?$`, rows, cols))
	}
	io.WriteString(sh.Stdin, "stty size\n")
	testenv.WaitFor(t, 20*time.Second, "33 101 from stty size in the shell", func() (bool, string) {
		return sizeRe(33, 101).MatchString(buf.String()), fmt.Sprintf("%q", buf.String())
	})
	if err := sh.Resize(40, 120); err != nil {
		t.Fatalf("resize: %v", err)
	}
	// The resize travels beside stdin, not in it: ask until the shell's
	// terminal has the new size.
	asked := time.Time{}
	testenv.WaitFor(t, 20*time.Second, "40 120 from stty size after the resize", func() (bool, string) {
		if time.Since(asked) > 2*time.Second {
			io.WriteString(sh.Stdin, "stty size\n")
			asked = time.Now()
		}
		return sizeRe(40, 120).MatchString(buf.String()), fmt.Sprintf("%q", buf.String())
	})
	io.WriteString(sh.Stdin, "exit 3\n")
	ex, err := sh.Wait()
	<-copied
	if err != nil || ex.ExitCode != 3 {
		t.Errorf("shell in a PTY: exit %+v, err %v; output %q", ex, err, buf.String())
	}
}
