package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/internal/dnstest"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/template"
)

// A Workspace of the default template, in a real guest, configured as the
// node configures one: its /etc/resolv.conf is the guest agent's (DNS
// servers configured before the root was mounted, then new ones); its wget
// and nc fetch from the guest's own localhost and, over virtio-net, from a
// server at the node end of its tap by a name the nameserver there (a DNS
// responder of the test at 169.254.100.1:53) answers.
func TestWorkspaceRootFetchesAndResolves(t *testing.T) {
	runtimetest.RequireVMHost(t)
	inst := runtimetest.Platform(t)
	scratch, err := os.MkdirTemp("/tmp", "kbw-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratch) })
	_, units := runtimetest.Systemd(t, filepath.Join(scratch, "sd"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rt, err := runtime.Open(ctx, runtime.Config{StorageRoot: filepath.Join(scratch, "s"), NodeID: "node-1", Units: units, Accel: qemu.AccelAuto})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	tpl, err := template.BuildBusybox(ctx, filepath.Join(scratch, "s"), template.DefaultName, "")
	if err != nil {
		t.Fatal(err)
	}
	const id = "ws-net-1"
	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true,
		RootImage: tpl.Image(), LayerPath: filepath.Join(scratch, "layers", id+".qcow2")}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), id) })
	c, err := rt.Guest(id)
	if err != nil {
		t.Fatal(err)
	}
	// The network's DNS servers may come before the Workspace root is
	// mounted (the runtime configures the network at start).
	if err := c.Configure(ctx, guestproto.ConfigureRequest{DNS: []string{"192.0.2.53"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Configure(ctx, agent.WorkspaceConfigure("ws-net", c.Info())); err != nil {
		t.Fatalf("configure the Workspace root: %v", err)
	}
	inRoot := func(script string) (string, string, int) {
		t.Helper()
		p, err := rt.Exec(ctx, id, guestproto.ExecRequest{Root: agent.WorkspaceRoot, Argv: []string{"/bin/sh", "-c", script},
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		defer p.Close()
		var out, errOut bytes.Buffer
		done := make(chan struct{})
		go func() { io.Copy(&out, p.Stdout); close(done) }()
		io.Copy(&errOut, p.Stderr)
		<-done
		exit, err := p.Wait()
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		if exit.Signal != 0 || exit.Error != "" {
			return out.String(), fmt.Sprintf("%s(signal %d %s)", errOut.String(), exit.Signal, exit.Error), -1
		}
		return out.String(), errOut.String(), exit.ExitCode
	}
	if out, _, _ := inRoot("cat /etc/resolv.conf"); out != "nameserver 192.0.2.53\n" {
		t.Fatalf("Workspace resolv.conf %q; want the DNS servers configured before the root was mounted", out)
	}

	// The node end of the tap, in the Instance's network namespace: an
	// HTTP server and the nameserver the guest is told about.
	nsPath := filepath.Join("/proc", strconv.Itoa(units.Target().ManagerPID), "root", "run", "netns", runtime.NetNSName(id))
	var l net.Listener
	var pc net.PacketConn
	inNetNS(t, nsPath, func() (err error) {
		if l, err = net.Listen("tcp", runtime.GuestGateway+":0"); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", runtime.GuestGateway+":53")
		return err
	})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from the node\n") }))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	defer srv.Close()
	defer pc.Close()
	dns := dnstest.Serve(pc, map[string]netip.Addr{"web.kibotos.test.": netip.MustParseAddr(runtime.GuestGateway)})
	port := l.Addr().(*net.TCPAddr).Port

	if err := c.Configure(ctx, guestproto.ConfigureRequest{DNS: []string{runtime.GuestGateway}}); err != nil {
		t.Fatal(err)
	}
	if out, _, _ := inRoot("cat /etc/resolv.conf"); out != "nameserver "+runtime.GuestGateway+"\n" {
		t.Fatalf("Workspace resolv.conf %q; want the DNS servers configured last", out)
	}
	if out, errs, code := inRoot("mkdir -p /tmp/www && echo local > /tmp/www/index.html && httpd -p 127.0.0.1:8080 -h /tmp/www"); code != 0 {
		t.Fatalf("httpd in the Workspace: exit %d: %s%s", code, out, errs)
	}
	for url, want := range map[string]string{
		"http://127.0.0.1:8080/":                                 "local\n",
		"http://localhost:8080/":                                 "local\n",
		fmt.Sprintf("http://%s:%d/", runtime.GuestGateway, port): "from the node\n",
		fmt.Sprintf("http://web.kibotos.test:%d/", port):         "from the node\n",
	} {
		if out, errs, code := inRoot("wget -T 10 -q -O- " + url); code != 0 || out != want {
			t.Errorf("wget -T 10 %s in the Workspace: exit %d, %q %s; want %q", url, code, out, strings.TrimSpace(errs), want)
		}
	}
	if !slices.Contains(dns.Questions(), "web.kibotos.test. TypeA") {
		t.Errorf("DNS questions at the node end: %v; want web.kibotos.test", dns.Questions())
	}
	for _, host := range []string{"localhost 8080", fmt.Sprintf("web.kibotos.test %d", port)} {
		if out, errs, code := inRoot("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 10 " + host); code != 0 || !strings.Contains(out, "200 OK") {
			t.Errorf("nc %s in the Workspace: exit %d, %q %s", host, code, out, strings.TrimSpace(errs))
		}
	}
}

// inNetNS runs f on a thread that joined the network namespace at path;
// sockets f opens stay in that namespace.
func inNetNS(t *testing.T, path string, f func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, in another namespace, ends with this
		// goroutine instead of going back to the scheduler.
		goruntime.LockOSThread()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("join %s: %w", path, err)
			return
		}
		errc <- f()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
