package e2e

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/member"
	"github.com/kibotos/kibotos/vmm/template"
)

// mhEgress: an Egress object with credentials through the CLI; on each
// of nodes (a ctrl member reads the credentials from its own FSM, a
// node-only member asks the ctrl leader) a Workspace whose policy names it,
// its wget reaching a server only through the SOCKS5 server, which wants
// those credentials (the server's log shows the proxy, not the node), the
// credentials root's alone on the node; the Egress that a Workspace uses
// cannot be deleted.
func mhEgress(t *testing.T, l *clusterlab.Lab, admin *clusterlab.Host, nodes ...string) {
	proxy := l.StartProxy(t)
	httpdLog := proxy.ServerLog
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "egress", "create", "corp", "--socks5", proxy.SOCKS, "--username", proxy.Username, "--password-file", proxy.PasswordFile)
	if r := clusterlab.Must(t, admin, clusterlab.CLITimeout, "egress", "get", "corp", "--json"); strings.Contains(r.Stdout, "s3cret") {
		t.Errorf("egress get shows the password: %s", r.Stdout)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(proxy.SOCKSLog)
			t.Logf("microsocks:\n%s", b)
		}
	})
	for _, node := range nodes {
		var h *clusterlab.Host
		for _, x := range l.Hosts {
			if x.NodeID == node {
				h = x
			}
		}
		var ws api.Workspace
		if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, clusterlab.BootTimeout, "workspace", "create", "--template", template.DefaultName, "--cpu", "1", "--memory", "256MiB",
			"--node", node, "--egress", "corp", "--json"), &ws); err != nil {
			t.Fatal(err)
		}
		if ws.State != api.WorkspaceAvailable || ws.Network == nil || ws.Network.Egress != "corp" {
			t.Fatalf("created %s", clusterlab.WorkspaceString(ws))
		}
		before, _ := os.ReadFile(httpdLog)
		r := admin.Kibo("workspace", "exec", ws.WorkspaceID, "--", "wget", "-T", "5", "-t", "1", "-O-", proxy.URL)
		if r.Stdout != proxy.Page {
			out, _ := exec.Command("ip", "netns", "exec", h.NS, "nft", "list", "ruleset").CombinedOutput()
			t.Errorf("on %s, wget through the Egress: %s (stdout %q); ruleset of the node:\n%s", node, r, r.Stdout, out)
		}
		var b []byte
		if !testenv.Poll(t, 10*time.Second, func() bool {
			b, _ = os.ReadFile(httpdLog)
			return strings.Contains(string(b[len(before):]), clusterlab.ProxyAddr)
		}) {
			t.Errorf("on %s: the server's log does not show the SOCKS5 server %s as the client:\n%s", node, clusterlab.ProxyAddr, b)
		}
		// The node's metrics (its loopback listener, port+3) count the
		// connection the egress process carried.
		port, _ := strconv.Atoi(clusterlab.APIPort)
		scrape := func() ([]byte, error) {
			return exec.Command("ip", "netns", "exec", h.NS, "wget", "-q", "-O-", "http://127.0.0.1:"+strconv.Itoa(port+3)+"/metrics").Output()
		}
		out, err := scrape()
		if err != nil {
			t.Errorf("on %s, scrape the metrics listener: %v", node, err)
		} else if !regexp.MustCompile(`(?m)^kibotos_node_egress_connections_total\{outcome="accepted"\} [1-9]`).Match(out) {
			t.Errorf("on %s, the metrics show no egress connection accepted:\n%s", node, grepLines(out, "kibotos_node_egress"))
		}
		// Once the Egress carried a connection, the egress process holds
		// the configured warm connections to its SOCKS5 server.
		if !testenv.Poll(t, 15*time.Second, func() bool {
			out, err = scrape()
			return err == nil && regexp.MustCompile(`(?m)^kibotos_node_egress_warm_connections 3$`).Match(out)
		}) {
			t.Errorf("on %s, the metrics do not show the 3 warm connections of egress_warm_connections (%v):\n%s", node, err, grepLines(out, "kibotos_node_egress"))
		}
		// log_format = "json": the member logs JSON objects, and starts
		// its egress process (whose output has no journal here) with it.
		if !clusterlab.LogHasJSON(h.ServeProc().Log, "member serving") {
			t.Errorf("on %s, no JSON log line \"member serving\" in %s", node, h.ServeProc().Log)
		}
		argvs := egressArgvs(filepath.Join(l.Bin, "kibotos"))
		if len(argvs) == 0 {
			t.Errorf("on %s, no egress process runs while a Workspace uses an Egress", node)
		} else {
			for _, a := range argvs {
				if !strings.Contains(a, "--log-format json") {
					t.Errorf("egress process %q does not log JSON", a)
				}
				// [network] egress_warm_connections = 3 of the config.
				if !strings.Contains(a, "--warm-connections 3") {
					t.Errorf("egress process %q does not keep the configured 3 warm connections", a)
				}
			}
		}
		// Its socket directory is the node's with "-egress" added (under
		// a private systemd, in the shared temporary directory), its
		// own, 0700, and the only one it is given to write.
		sockDir := member.EgressSocketDir(datadir.Dir(h.DataDir), true)
		if filepath.Base(sockDir) != "node-egress" || !slices.ContainsFunc(argvs, func(a string) bool { return strings.Contains(a, "--socket-dir "+sockDir+" ") }) {
			t.Errorf("on %s, egress socket directory %s: not node-egress, or not the running process's (%q)", node, sockDir, argvs)
		}
		if st, err := os.Stat(sockDir); err != nil || st.Mode().Perm() != 0o700 || !ownedBy(st, "kibotos-egress") {
			t.Errorf("on %s, egress socket directory %s: %v %v; want 0700, owned by kibotos-egress", node, sockDir, st, err)
		}
		credDir := filepath.Join(datadir.Dir(h.DataDir).StorageRoot(), "state", "egress-credentials")
		files, _ := filepath.Glob(filepath.Join(credDir, "*"))
		if st, err := os.Stat(credDir); err != nil || st.Mode().Perm() != 0o700 || len(files) != 1 {
			t.Errorf("on %s, credentials directory %s: %v %v, files %v; want 0700 with one file", node, credDir, st, err, files)
		} else if st, err := os.Stat(files[0]); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("on %s, credentials file %s: %v %v; want 0600", node, files[0], st, err)
		}
		r = clusterlab.ExpectExit(t, admin, api.ExitFailedPrecondition, "delete an Egress in use", "egress", "delete", "corp")
		if !strings.Contains(r.Stderr, ws.WorkspaceID) {
			t.Errorf("refused delete names no Workspace: %s", r)
		}
		clusterlab.Must(t, admin, clusterlab.BootTimeout, "workspace", "delete", ws.WorkspaceID)
		if files, _ := filepath.Glob(filepath.Join(credDir, "*")); len(files) != 0 {
			t.Errorf("on %s, credentials no Instance uses are still on the node: %v", node, files)
		}
	}
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "egress", "delete", "corp")
}

// grepLines are the lines of b that contain s.
func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// egressArgvs are the command lines of the egress processes running exe
// (this test's build: other tests' processes are not ours to judge).
func egressArgvs(exe string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 2 && args[0] == exe && args[1] == "egress" && args[2] == "serve" {
			out = append(out, strings.Join(args, " "))
		}
	}
	return out
}

// ownedBy says whether the file st describes belongs to the account name.
func ownedBy(st os.FileInfo, name string) bool {
	u, err := user.Lookup(name)
	if err != nil {
		return false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && strconv.FormatUint(uint64(sys.Uid), 10) == u.Uid
}
