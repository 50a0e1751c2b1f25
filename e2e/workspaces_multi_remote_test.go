package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/hostprobe"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/template"
)

// mhRemoteClient works from a host of its own (a namespace with its own
// address, no member, no data directory) with what an operator hands an
// application: the API URL of ctrl host, the cluster CA file and an API
// key of namespace acme. It creates a Workspace, execs, copies a file in
// and out, forwards a port and deletes it, all over the lab's network.
func mhRemoteClient(t *testing.T, l *clusterlab.Lab, ctrl *clusterlab.Host) {
	client := l.AddHost()
	// Room for one more Workspace whatever the steps before left running.
	clusterlab.Must(t, ctrl, clusterlab.CLITimeout, "node", "overcommit", "set", ctrl.NodeID, "--cpu", "4")
	clusterlab.Must(t, ctrl, clusterlab.CLITimeout, "namespace", "create", "acme")
	key := strings.TrimSpace(clusterlab.Must(t, ctrl, clusterlab.CLITimeout, "api-key", "create", "app", "--namespace", "acme", "--role", "sandbox").Stdout)
	ca := filepath.Join(l.Dir, "app-ca.crt")
	raw, err := os.ReadFile(datadir.Dir(ctrl.DataDir).CACert())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(l.Dir, "app-home")
	os.MkdirAll(home, 0o700)
	env := append(hostprobe.CleanEnv(), "HOME="+home, "KIBOTOS_DATA_DIR="+filepath.Join(l.Dir, "no-data-dir"),
		"KIBOTOS_API_URL=https://"+ctrl.IP+":"+clusterlab.AppAPIPort, "KIBOTOS_TOKEN="+key, "KIBOTOS_CA_FILE="+ca)
	app := func(timeout time.Duration, args ...string) clusterlab.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", client.NS, filepath.Join(l.Bin, "kibo")}, args...)...)
		cmd.Env = env
		r := clusterlab.RunResult(ctx, timeout, cmd, args)
		if r.Code != 0 {
			t.Fatalf("from host %s with acme's key: %s", client.IP, r)
		}
		return r
	}

	id := strings.TrimSpace(app(clusterlab.BootTimeout, "workspace", "create", "--template", template.DefaultName, "--memory", "256MiB", "--timeout", "30m", "-q").Stdout)
	if r := app(time.Minute, "workspace", "exec", id, "--", "echo", "from-another-host"); r.Stdout != "from-another-host\n" {
		t.Fatalf("exec from host %s: %q", client.IP, r.Stdout)
	}
	local, back := filepath.Join(l.Dir, "app.in"), filepath.Join(l.Dir, "app.out")
	payload := randBytes(t, 256<<10)
	if err := os.WriteFile(local, payload, 0o644); err != nil {
		t.Fatal(err)
	}
	app(time.Minute, "workspace", "cp", local, id+":/root/app")
	app(time.Minute, "workspace", "cp", id+":/root/app", back)
	if got, _ := os.ReadFile(back); !bytes.Equal(got, payload) {
		t.Errorf("cp in and out from host %s: %d bytes back, equal %v", client.IP, len(got), bytes.Equal(got, payload))
	}

	// port-forward: an echo server in the guest, the forwarded port on
	// the application's host.
	app(time.Minute, "workspace", "exec", id, "--", "sh", "-c", "nc -l -p 8000 -e /bin/cat </dev/null >/dev/null 2>&1 &")
	cmd := exec.Command("ip", "netns", "exec", client.NS, filepath.Join(l.Bin, "kibo"), "workspace", "port-forward", id, "0:8000")
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr := &testenv.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	fwd := regexp.MustCompile(`Forwarding (127\.0\.0\.1:\d+) -> `)
	var local8000 string
	testenv.WaitFor(t, 30*time.Second, "port-forward listening", func() (bool, string) {
		m := fwd.FindStringSubmatch(stderr.String())
		if m != nil {
			local8000 = m[1]
		}
		return m != nil, stderr.String()
	})
	msg := []byte("echo through the data plane to another host")
	testenv.WaitFor(t, 20*time.Second, "an answer through "+local8000, func() (bool, string) {
		got, err := dialIn(client.NS, local8000, msg)
		return bytes.Equal(got, msg), fmt.Sprintf("%q %v", got, err)
	})

	app(clusterlab.BootTimeout, "workspace", "delete", id)
	if r := ctrl.Kibo("workspace", "get", id); r.Code != api.ExitNotFound {
		t.Errorf("the Workspace after its delete from host %s: %s", client.IP, r)
	}
}

// dialIn connects to addr from inside namespace ns, sends msg, closes its
// side and returns the answer.
func dialIn(ns, addr string, msg []byte) (answer []byte, err error) {
	err = clusterlab.InNetns(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(msg); err != nil {
			return err
		}
		c.(*net.TCPConn).CloseWrite()
		answer, err = io.ReadAll(c)
		return err
	})
	return answer, err
}
