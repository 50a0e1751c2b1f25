package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"

	"github.com/kibotos/kibotos/api"
)

// testNetwork: the Workspace's policy through the CLI (none by default,
// changed to public on the running Workspace by the node) and, whatever
// the policy, the dev host's own addresses are out of the guest's reach.
func (d *wsDev) testNetwork(id string) {
	t := d.t
	var w struct {
		Network struct {
			Egress string `json:"egress"`
		} `json:"network"`
	}
	policy := func() string {
		t.Helper()
		if err := clusterlab.DecodeResult(d.must("workspace", "get", id, "--json"), &w); err != nil {
			t.Fatal(err)
		}
		return w.Network.Egress
	}
	if got := policy(); got != "none" {
		t.Errorf("default egress %q, want none", got)
	}
	if r := d.must("workspace", "exec", id, "--", "cat", "/etc/resolv.conf"); r.Stdout != "nameserver 169.254.100.1\n" {
		t.Errorf("Workspace resolv.conf %q; want the namespace's address (DNATed to the deployment resolver)", r.Stdout)
	}
	// A server on the dev host's own (non-loopback) address.
	hostAddr := hostIPv4(t)
	ln, err := net.Listen("tcp", net.JoinHostPort(hostAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the host\n") }))
	url := "http://" + ln.Addr().String() + "/"
	unreachable := func(when string) {
		t.Helper()
		if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "wget", "-T", "3", "-t", "1", "-q", "-O-", url); r.Code == 0 {
			t.Errorf("%s: the guest fetched %s from the host's own address: %q", when, url, r.Stdout)
		}
	}
	unreachable("egress none")
	d.must("workspace", "set-network", id, "--egress", "public")
	if got := policy(); got != "public" {
		t.Errorf("egress after set-network %q, want public", got)
	}
	unreachable("egress public")
	// The dropped connects are counted, and get shows the node's count.
	testenv.WaitFor(t, time.Minute, "denied packets in workspace get", func() (bool, string) {
		var w struct {
			Denied *api.DeniedReport `json:"denied"`
		}
		if err := clusterlab.DecodeResult(d.must("workspace", "get", id, "--json"), &w); err != nil {
			t.Fatal(err)
		}
		return w.Denied != nil && w.Denied.Packets > 0, fmt.Sprintf("denied %+v", w.Denied)
	})
	if out := d.must("workspace", "get", id).Stdout; !regexp.MustCompile(`(?m)^Denied packets: +[1-9][0-9]* \(reported `).MatchString(out) {
		t.Errorf("workspace get does not show the denied packets:\n%s", out)
	}
	d.must("workspace", "set-network", id, "--egress", "none")
}

// hostIPv4 is an IPv4 address of this host that is not loopback.
func hostIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Fatal("this host has no IPv4 address besides loopback")
	return ""
}

// testPortForward forwards a local port to a busybox nc echo server in
// the Workspace.
func (d *wsDev) testPortForward(id string) {
	d.must("workspace", "exec", id, "--", "sh", "-c", "nc -l -p 8000 -e /bin/cat </dev/null >/dev/null 2>&1 &")
	d.portForwardEcho(id, d.env())
}

// portForwardEcho forwards a local port to port 8000 of Workspace id,
// where an echo server listens, with the CLI's environment env, and
// checks 256 KiB come back as sent.
func (d *wsDev) portForwardEcho(id string, env []string) {
	t := d.t
	cmd := exec.Command(filepath.Join(d.bin, "kibo"), "workspace", "port-forward", id, "0:8000")
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.track(cmd)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	fwdRe := regexp.MustCompile(`^Forwarding (127\.0\.0\.1:\d+) -> ` + id + `:8000`)
	var local string
	var seen []string
	timeout := time.After(30 * time.Second)
	for local == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("port-forward ended (%v) before it listened: %q", cmd.ProcessState, seen)
			}
			seen = append(seen, l)
			if m := fwdRe.FindStringSubmatch(l); m != nil {
				local = m[1]
			}
		case <-timeout:
			t.Fatalf("port-forward printed no Forwarding line in 30s: %q", seen)
		}
	}
	go func() {
		for l := range lines {
			t.Logf("port-forward: %s", l)
		}
	}()
	payload := randBytes(t, 256<<10)
	var got []byte
	// The nc in the guest may need a moment to listen: a refused first
	// connection shows as an immediate EOF, so retry on an empty answer.
	testenv.WaitFor(t, 20*time.Second, "an answer through the forwarded port "+local, func() (bool, string) {
		conn, err := net.DialTimeout("tcp", local, 5*time.Second)
		if err != nil {
			t.Fatalf("connect to the forwarded port %s: %v", local, err)
		}
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		werr := make(chan error, 1)
		go func() {
			_, err := conn.Write(payload)
			conn.(*net.TCPConn).CloseWrite()
			werr <- err
		}()
		got, err = io.ReadAll(conn)
		conn.Close()
		<-werr
		if len(got) > 0 && err != nil {
			t.Errorf("read from the forwarded port: %v", err)
		}
		return len(got) > 0, fmt.Sprintf("empty answer (read: %v)", err)
	})
	if !bytes.Equal(got, payload) {
		t.Errorf("port-forward echo: sent %d bytes, got %d back, equal %v", len(payload), len(got), bytes.Equal(got, payload))
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Errorf("port-forward after Ctrl-C: %v (want exit 0)", err)
	}
}
