package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/template"
)

// Addresses of the lab's switch namespace, beside the hosts on its bridge:
// a SOCKS5 server of the "caller" and a server it reaches.
const (
	labSOCKS  = subnetPrefix + "200"
	labServer = subnetPrefix + "201"
)

// mhEgress: an Egress object through the CLI, a Workspace whose policy
// names it on node, its wget reaching a server only through the SOCKS5
// server (the server's log shows the proxy's address, not the node's),
// and the Egress that a Workspace uses cannot be deleted.
func mhEgress(t *testing.T, l *lab, admin *host, node string) {
	microsocks := testenv.LookPath(t, "microsocks", "microsocks")
	busybox := testenv.LookPath(t, "busybox", "busybox-static")
	sw := l.prefix + "-sw"
	l.ip("-n", sw, "addr", "add", labSOCKS+"/24", "dev", "br0")
	l.ip("-n", sw, "addr", "add", labServer+"/24", "dev", "br0")
	www := t.TempDir()
	os.WriteFile(filepath.Join(www, "index.html"), []byte("through the proxy\n"), 0o644)
	httpdLog := l.startIn(t, sw, "httpd", busybox, "httpd", "-f", "-v", "-p", labServer+":8080", "-h", www)
	l.startIn(t, sw, "microsocks", microsocks, "-i", labSOCKS, "-p", "1080")

	mhMust(t, admin, cliTimeout, "egress", "create", "corp", "--socks5", labSOCKS+":1080")
	var ws api.Workspace
	if err := decodeResult(mhMust(t, admin, mhBootTimeout, "workspace", "create", "--template", template.DefaultName, "--cpu", "1", "--memory", "256MiB",
		"--node", node, "--egress", "corp", "--json"), &ws); err != nil {
		t.Fatal(err)
	}
	if ws.State != api.WorkspaceAvailable || ws.Network == nil || ws.Network.Egress != "corp" {
		t.Fatalf("created %s", mhWSString(ws))
	}
	r := mhMust(t, admin, cliTimeout, "workspace", "exec", ws.WorkspaceID, "--", "wget", "-T", "5", "-t", "1", "-q", "-O-", "http://"+labServer+":8080/")
	if r.stdout != "through the proxy\n" {
		t.Errorf("wget through the Egress: %q", r.stdout)
	}
	waitLog := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(httpdLog)
		if strings.Contains(string(b), labSOCKS) {
			break
		}
		if time.Now().After(waitLog) {
			t.Errorf("the server's log does not show the SOCKS5 server %s as the client:\n%s", labSOCKS, b)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	r = mhExpectExit(t, admin, api.ExitFailedPrecondition, "delete an Egress in use", "egress", "delete", "corp")
	if !strings.Contains(r.stderr, ws.WorkspaceID) {
		t.Errorf("refused delete names no Workspace: %s", r)
	}
	mhMust(t, admin, mhBootTimeout, "workspace", "delete", ws.WorkspaceID)
	mhMust(t, admin, cliTimeout, "egress", "delete", "corp")
}

// startIn runs argv in namespace ns (ip netns exec execs it: the PID is
// its own), output to a log file of the lab, killed by that PID at
// cleanup.
func (l *lab) startIn(t *testing.T, ns, name string, argv ...string) string {
	t.Helper()
	logPath := filepath.Join(l.dir, fmt.Sprintf("%s-%s.log", ns, name))
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s in %s: %v", name, ns, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		f.Close()
	})
	return logPath
}
