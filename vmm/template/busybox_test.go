package template

import (
	"bufio"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/dnstest"
	"github.com/kibotos/kibotos/internal/testenv"
)

// requireBusybox stops the test when the host lacks what BuildBusybox
// copies in (scripts/install-deps.sh installs all of it).
func requireBusybox(t *testing.T) {
	t.Helper()
	for path, pkg := range map[string]string{"/bin/busybox": "busybox-static", hostWget: "wget", hostCABundle: "ca-certificates"} {
		if _, err := os.Stat(path); err != nil {
			testenv.Skipf(t, "missing %s (Debian package %s)", path, pkg)
		}
	}
}

// The image carries what name resolution reads, and resolv.conf is a
// regular file the node can bind-mount the guest agent's over.
func TestBuildBusyboxImage(t *testing.T) {
	requireMkfs(t)
	requireBusybox(t)
	tp, err := BuildBusybox(context.Background(), t.TempDir(), DefaultName, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := debugfsCat(t, tp.Image(), "/etc/hosts"); !strings.Contains(got, "127.0.0.1\tlocalhost\n") {
		t.Errorf("/etc/hosts %q; want localhost", got)
	}
	if got := debugfsCat(t, tp.Image(), "/etc/nsswitch.conf"); !strings.Contains(got, "hosts: files dns\n") {
		t.Errorf("/etc/nsswitch.conf %q; want hosts: files dns", got)
	}
	for path, typ := range map[string]string{"/etc/resolv.conf": "regular", "/usr/bin/wget": "regular", "/bin/wget": "symlink", "/bin/nc": "symlink",
		"/usr/lib/x86_64-linux-gnu/libc.so.6": "regular", "/lib64/ld-linux-x86-64.so.2": "symlink", "/etc/ssl/certs/ca-certificates.crt": "regular"} {
		out, err := exec.Command("debugfs", "-R", "stat "+path, tp.Image()).Output()
		if err != nil || !strings.Contains(string(out), "Type: "+typ) {
			t.Errorf("%s in the image: %v %q; want a %s file", path, err, out, typ)
		}
	}
}

func TestBuildBusyboxRefusesBusyboxWithoutNc(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "busybox")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho sh ls cat wget\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	_, err := BuildBusybox(context.Background(), root, DefaultName, fake)
	if err == nil || !strings.Contains(err.Error(), "no nc applet") {
		t.Fatalf("err %v; want one saying the busybox has no nc", err)
	}
	if left, _ := os.ReadDir(Dir(root)); len(left) != 0 {
		t.Fatalf("failed build left %v", left)
	}
}

// wget and nc of the busybox template, run chrooted in its tree as the
// guest agent runs a Workspace's commands, inside a network namespace of
// the test's own: they fetch from an HTTP server (with -T, which crashes
// Debian 12's busybox wget), reach a TCP listener, resolve localhost from
// /etc/hosts without asking DNS, resolve a name through the nameserver
// resolv.conf names (a DNS responder on that namespace's 127.0.0.1:53),
// and fetch over HTTPS only from a server the CA bundle vouches for.
func TestBusyboxTreeFetchesAndResolves(t *testing.T) {
	tree := rootedBusyboxTree(t)
	// What the guest agent's Configure writes; in a Workspace it is
	// bind-mounted over the template's empty file.
	if err := os.WriteFile(filepath.Join(tree, "etc/resolv.conf"), []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A name of the user's own in /etc/hosts, which DNS also knows
	// (elsewhere): /etc/hosts must win without DNS being asked.
	hosts, err := os.OpenFile(filepath.Join(tree, "etc/hosts"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(hosts, "127.0.0.1\tfiles.kibotos.test\n")
	hosts.Close()
	ns := newNetNS(t)

	const body = "kibotos template fetch\n"
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
	srv.Listener.Close()
	srv.Listener = ns.listen(t, "127.0.0.1:0")
	srv.Start()
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port

	echo := ns.listen(t, "127.0.0.1:0")
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				io.WriteString(c, "pong "+line)
			}()
		}
	}()
	echoPort := echo.Addr().(*net.TCPAddr).Port

	pc := ns.listenPacket(t, "127.0.0.1:53")
	dns := dnstest.Serve(pc, map[string]netip.Addr{"web.kibotos.test.": netip.MustParseAddr("127.0.0.1"), "files.kibotos.test.": netip.MustParseAddr("127.0.0.2")})
	defer dns.Close()

	// From busybox's sh too, which runs an applet before looking at PATH.
	if out, err := ns.inTree(tree, "", "/bin/sh", "-c", "wget -q -T 5 -O- http://localhost:"+fmt.Sprint(port)+"/"); err != nil || out != body {
		t.Errorf("sh -c 'wget -T 5' of localhost: %v, output %q; want %q", err, out, body)
	}
	if out, err := ns.inTree(tree, "", "/bin/sh", "-c", "command -v wget; busybox wget -h"); err == nil || out != "/usr/bin/wget\n" {
		t.Errorf("sh: command -v wget, busybox wget: %v, %q; want /usr/bin/wget and no busybox wget", err, out)
	}
	for _, tc := range []struct{ name, url string }{
		{"address", fmt.Sprintf("http://127.0.0.1:%d/", port)},
		{"localhost from /etc/hosts", fmt.Sprintf("http://localhost:%d/", port)},
		{"a name of /etc/hosts before DNS", fmt.Sprintf("http://files.kibotos.test:%d/", port)},
		{"name through resolv.conf's nameserver", fmt.Sprintf("http://web.kibotos.test:%d/", port)},
	} {
		out, err := ns.inTree(tree, "", "/bin/wget", "-q", "-T", "5", "-O-", tc.url)
		if err != nil || out != body {
			t.Errorf("wget %s (%s): %v, output %q; want %q", tc.url, tc.name, err, out, body)
		}
	}

	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }))
	tlsSrv.Listener.Close()
	tlsSrv.Listener = ns.listen(t, "127.0.0.1:0")
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	if out, err := ns.inTree(tree, "", "/bin/wget", "-q", "-T", "5", "-O-", tlsSrv.URL); err == nil || out != "" {
		t.Errorf("wget %s, a certificate no CA of the bundle signed: %v, output %q; want a refusal", tlsSrv.URL, err, out)
	}
	bundle := filepath.Join(tree, "etc/ssl/certs/ca-certificates.crt")
	f, err := os.OpenFile(bundle, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	pem.Encode(f, &pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw})
	f.Close()
	if out, err := ns.inTree(tree, "", "/bin/wget", "-q", "-T", "5", "-O-", tlsSrv.URL); err != nil || out != body {
		t.Errorf("wget %s with its CA in the bundle: %v, output %q; want %q", tlsSrv.URL, err, out, body)
	}

	for _, host := range []string{"127.0.0.1", "localhost"} {
		out, err := ns.inTree(tree, "ping\n", "/bin/nc", host, fmt.Sprint(echoPort))
		if err != nil || out != "pong ping\n" {
			t.Errorf("nc %s %d: %v, output %q; want the listener's reply", host, echoPort, err, out)
		}
	}
	asked := dns.Questions()
	if !slices.Contains(asked, "web.kibotos.test. TypeA") {
		t.Errorf("DNS questions %v; want web.kibotos.test asked of the nameserver", asked)
	}
	for _, q := range asked {
		if strings.HasPrefix(q, "localhost") || strings.HasPrefix(q, "files.") {
			t.Errorf("DNS questions %v: a name of /etc/hosts was asked of the nameserver; /etc/hosts must come first", asked)
			break
		}
	}
}

// netns is a network namespace of the test's own with lo up, held by one
// locked OS thread: sockets opened and processes started through do live
// in it, so the test may listen on 127.0.0.1:53 without touching the
// host's.
type netns struct{ fns chan func() }

func newNetNS(t *testing.T) *netns {
	t.Helper()
	ns := &netns{fns: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, in its own namespace, ends with
		// this goroutine instead of going back to the scheduler.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare the network namespace: %w", err)
			return
		}
		if err := loopbackUp(); err != nil {
			errc <- err
			return
		}
		errc <- nil
		for f := range ns.fns {
			f()
		}
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(ns.fns) })
	return ns
}

func (ns *netns) do(f func()) {
	done := make(chan struct{})
	ns.fns <- func() { defer close(done); f() }
	<-done
}

func (ns *netns) listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	var err error
	ns.do(func() { l, err = net.Listen("tcp", addr) })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (ns *netns) listenPacket(t *testing.T, addr string) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	var err error
	ns.do(func() { pc, err = net.ListenPacket("udp", addr) })
	if err != nil {
		t.Fatal(err)
	}
	return pc
}

// inTree runs argv chrooted in tree, in the namespace, with /proc mounted
// as in a Workspace (in a mount namespace of the command's own), and
// returns its standard output (standard error goes into the error).
func (ns *netns) inTree(tree, stdin string, argv ...string) (string, error) {
	var stdout, stderr strings.Builder
	var err error
	ns.do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// busybox's sh runs its applets through /proc/self/exe: without
		// /proc it would fall back to PATH and hide what a Workspace does.
		wrapped := append([]string{"/bin/busybox", "sh", "-c", `mount -t proc proc /proc && exec "$@"`, "sh"}, argv...)
		cmd := exec.CommandContext(ctx, wrapped[0], wrapped[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: tree, Unshareflags: syscall.CLONE_NEWNS}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err = cmd.Run(); err != nil {
			err = fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
		}
	})
	return stdout.String(), err
}

// loopbackUp sets lo of the calling thread's namespace up.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// rootedBusyboxTree is the template's tree in a temporary directory, for
// tests that run it chrooted in a network namespace of their own (root).
func rootedBusyboxTree(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "chroot and a network namespace need root")
	}
	requireBusybox(t)
	tree := t.TempDir()
	if err := busyboxTree(context.Background(), tree, ""); err != nil {
		t.Fatal(err)
	}
	return tree
}

// The template has a nohup that leaves its command immune to SIGHUP, as
// users start servers that outlive their exec (`nohup CMD &`), and that
// fails as nohup does when there is nothing to run.
func TestBusyboxTreeNohup(t *testing.T) {
	tree := rootedBusyboxTree(t)
	ns := newNetNS(t)
	out, err := ns.inTree(tree, "", "/bin/sh", "-c", `nohup sh -c 'kill -HUP $$; echo survived SIGHUP'`)
	if err != nil || out != "survived SIGHUP\n" {
		t.Errorf("nohup sh -c 'kill -HUP $$; ...': %v, output %q; want it to survive", err, out)
	}
	out, err = ns.inTree(tree, "", "/bin/sh", "-c", `sh -c 'kill -HUP $$; echo survived SIGHUP'; echo "without nohup: $?"`)
	if err != nil || out != "without nohup: 129\n" {
		t.Errorf("without nohup: %v, output %q; want the shell ended by SIGHUP (129)", err, out)
	}
	out, err = ns.inTree(tree, "", "/bin/sh", "-c", `nohup -- echo args kept; nohup; echo "no command: $?"; nohup /no/such/program 2>/dev/null; echo "missing: $?"`)
	if err != nil || out != "args kept\nno command: 125\nmissing: 127\n" {
		t.Errorf("nohup's exits: %v, output %q", err, out)
	}
}
