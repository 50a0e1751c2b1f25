package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/netpol/netlab"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/template"
)

// A Workspace of the default template, in a real guest, configured as the
// node configures one: its /etc/resolv.conf is the guest agent's (DNS
// servers configured before the root was mounted, then new ones); its wget
// and nc fetch from the guest's own localhost and, through public egress,
// from a server of a test "internet" by a name the deployment resolver (a
// dnsmasq there) answers.
// internetAddr is the test internet's server and resolver.
const internetAddr = "198.51.100.2"

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
	lab := netlab.New(t, filepath.Join(scratch, "ns"))
	nodeNS := lab.Namespace("node")
	lab.Namespace("inet")
	lab.Wire("node", "up0", "198.51.100.1/24", "inet", "eth0", internetAddr+"/24")
	lab.HTTP("inet", internetAddr+":8080", "from the internet\n")
	lab.DNS("inet", netip.MustParseAddr(internetAddr), map[string]netip.Addr{"web.kibotos.test": netip.MustParseAddr(internetAddr)})
	network, err := netpol.ParseConfig("10.213.0.0/24", "", nil, []string{internetAddr}, "up0")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := runtime.Open(ctx, runtime.Config{StorageRoot: filepath.Join(scratch, "s"), NodeID: "node-1", Units: units, Accel: qemu.AccelAuto,
		Network: &network, HostNetNS: nodeNS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	tpl, err := template.BuildBusybox(ctx, filepath.Join(scratch, "s"), template.DefaultName, "")
	if err != nil {
		t.Fatal(err)
	}
	const id = "ws-net-1"
	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true, Policy: runtime.NetworkPolicy{Egress: "public"},
		RootImage: tpl.Image(), LayerPath: filepath.Join(scratch, "layers", id+".qcow2")}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), id) })
	c, err := rt.Guest(id)
	if err != nil {
		t.Fatal(err)
	}
	// The network's DNS servers come before the Workspace root is mounted
	// (the runtime configures the network at start).
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
	if out, _, _ := inRoot("cat /etc/resolv.conf"); out != "nameserver "+netpol.TapAddr+"\n" {
		t.Fatalf("Workspace resolv.conf %q; want the DNS servers configured before the root was mounted", out)
	}
	if err := c.Configure(ctx, guestproto.ConfigureRequest{DNS: []string{"192.0.2.53"}}); err != nil {
		t.Fatal(err)
	}
	if out, _, _ := inRoot("cat /etc/resolv.conf"); out != "nameserver 192.0.2.53\n" {
		t.Fatalf("Workspace resolv.conf %q; want the DNS servers configured last", out)
	}
	if err := c.Configure(ctx, guestproto.ConfigureRequest{DNS: []string{netpol.TapAddr}}); err != nil {
		t.Fatal(err)
	}

	if out, errs, code := inRoot("mkdir -p /tmp/www && echo local > /tmp/www/index.html && httpd -p 127.0.0.1:8080 -h /tmp/www"); code != 0 {
		t.Fatalf("httpd in the Workspace: exit %d: %s%s", code, out, errs)
	}
	for url, want := range map[string]string{
		"http://127.0.0.1:8080/":            "local\n",
		"http://localhost:8080/":            "local\n",
		"http://" + internetAddr + ":8080/": "from the internet\n",
		"http://web.kibotos.test:8080/":     "from the internet\n",
	} {
		if out, errs, code := inRoot("wget -T 10 -q -O- " + url); code != 0 || out != want {
			t.Errorf("wget -T 10 %s in the Workspace: exit %d, %q %s; want %q", url, code, out, strings.TrimSpace(errs), want)
		}
	}
	for _, host := range []string{"localhost 8080", "web.kibotos.test 8080"} {
		if out, errs, code := inRoot("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 10 " + host); code != 0 || !strings.Contains(out, "200 OK") {
			t.Errorf("nc %s in the Workspace: exit %d, %q %s", host, code, out, strings.TrimSpace(errs))
		}
	}
}
