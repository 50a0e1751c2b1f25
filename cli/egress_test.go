package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

const cliPassword = "s3cret-from-a-file"

// runStdin runs the CLI with stdin reading input.
func (e *cliEnv) runStdin(input string, args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	path := filepath.Join(e.t.TempDir(), "stdin")
	if err := os.WriteFile(path, []byte(input), 0o600); err != nil {
		e.t.Fatal(err)
	}
	in, err := os.Open(path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer in.Close()
	var out, errb bytes.Buffer
	code = Main(context.Background(), "kibo", append([]string{"--data-dir", e.dataDir}, args...), in, &out, &errb)
	return out.String(), errb.String(), code
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// squash collapses table padding.
func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

// Egress objects through the CLI: the password only from a file or
// stdin, never shown again; refusals with their exit codes change
// nothing; a Workspace's policy records the revision it uses, and an
// Egress in use cannot be deleted.
func TestEgressCommands(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding") // placed here; the start fails: no VMs
	}})
	pw := writeFile(t, "pw", cliPassword+"\n")
	noSecret := func(what, out string) {
		t.Helper()
		if strings.Contains(out, cliPassword) || strings.Contains(out, `"password":`) {
			t.Fatalf("%s shows the password:\n%s", what, out)
		}
	}
	create := []string{"egress", "create", "corp", "--socks5", "Proxy.Corp.Example:1080", "--username", "kibo", "--password-file", pw, "--command-id", "eg-1"}
	out := e.mustRun(create...)
	if want := "egress corp created: socks5 proxy.corp.example:1080, credentials set (revision 1, version 1)\n"; out != want {
		t.Fatalf("create: %q, want %q", out, want)
	}
	if again := e.mustRun(create...); again != out {
		t.Fatalf("replayed create: %q", again)
	}
	e.expectExit(api.ExitFailedPrecondition, "egress corp already exists (revision 1): change it with kibo egress update corp", "egress", "create", "corp", "--socks5", "p:1")
	e.expectExit(api.ExitInvalidArgument, `egress corp2: socks5 address "p" has no port`, "egress", "create", "corp2", "--socks5", "p")
	e.expectExit(api.ExitInvalidArgument, `egress name "public" is reserved`, "egress", "create", "public", "--socks5", "p:1")
	e.expectExit(api.ExitUsage, "--username and --password-file go together", "egress", "create", "corp2", "--socks5", "p:1", "--username", "u")
	e.expectExit(api.ExitUsage, "unknown flag --password", "egress", "create", "corp2", "--socks5", "p:1", "--username", "u", "--password", "x")
	e.expectExit(api.ExitUsage, "--password-file /nonexistent/pw", "egress", "create", "corp2", "--socks5", "p:1", "--username", "u", "--password-file", "/nonexistent/pw")
	e.expectExit(api.ExitUsage, "holds no password", "egress", "create", "corp2", "--socks5", "p:1", "--username", "u", "--password-file", writeFile(t, "empty", "\n"))
	e.expectExit(api.ExitInvalidArgument, "the password is 300 bytes: SOCKS5 (RFC 1929) allows at most 255", "egress", "create", "corp2", "--socks5", "p:1", "--username", "u", "--password-file", writeFile(t, "long", strings.Repeat("p", 300)))
	e.expectExit(api.ExitInvalidArgument, "is not UTF-8 text", "egress", "create", "corp2", "--socks5", "p:1", "--username", "u", "--password-file", writeFile(t, "bin", "\xff\xfe"))
	e.expectExit(api.ExitUsage, "expected", "egress", "create", "--socks5", "p:1")
	if out, errs, code := e.runStdin("from-stdin\r\n", "egress", "create", "stdin-proxy", "--socks5", "[2001:db8::1]:1080", "--username", "u", "--password-file", "-"); code != 0 ||
		!strings.Contains(out, "egress stdin-proxy created: socks5 [2001:db8::1]:1080, credentials set") {
		t.Fatalf("create with the password on stdin: exit %d %q %q", code, out, errs)
	}
	e.mustRun("egress", "create", "open", "--socks5", "192.0.2.10:1080")

	out = e.mustRun("egress", "list")
	noSecret("list", out)
	for _, want := range []string{"NAME SOCKS5 REVISION CREDENTIALS WORKSPACES", "corp proxy.corp.example:1080 1 set 0", "open 192.0.2.10:1080 1 none 0", "stdin-proxy [2001:db8::1]:1080 1 set 0"} {
		if !strings.Contains(squash(out), want) {
			t.Errorf("list has no %q:\n%s", want, out)
		}
	}
	if out := e.mustRun("egress", "list", "-q"); out != "corp\nopen\nstdin-proxy\n" {
		t.Errorf("list -q: %q", out)
	}
	if out, errs, code := e.run("egress", "list", "--page-size", "2"); code != 0 || strings.Contains(out, "stdin-proxy") || !strings.Contains(errs, "--page-token open") {
		t.Errorf("page 1: exit %d %q %q", code, out, errs)
	}
	if out := e.mustRun("egress", "list", "--page-token", "open", "-q"); out != "stdin-proxy\n" {
		t.Errorf("page 2: %q", out)
	}
	noSecret("list --json", e.mustRun("egress", "list", "--json"))
	out = e.mustRun("egress", "get", "corp")
	noSecret("get", out)
	for label, want := range map[string]string{"SOCKS5": "SOCKS5: proxy.corp.example:1080", "Username": "Username: kibo", "Password": "Password: set", "Revision": "Revision: 1", "Workspaces": "Workspaces: 0"} {
		if got := lineOf(t, out, label); got != want {
			t.Errorf("get: %q, want %q", got, want)
		}
	}
	if raw := e.mustRun("egress", "get", "corp", "--json"); !strings.Contains(raw, `"password_set": true`) {
		t.Errorf("get --json:\n%s", raw)
	} else {
		noSecret("get --json", raw)
	}
	e.expectExit(api.ExitNotFound, "egress nope does not exist: check the name with kibo egress list", "egress", "get", "nope")

	// Updates.
	e.expectExit(api.ExitUsage, "give what to change", "egress", "update", "corp")
	e.expectExit(api.ExitUsage, "--clear-credentials and --username/--password-file are exclusive", "egress", "update", "corp", "--clear-credentials", "--username", "x")
	e.expectExit(api.ExitVersionMismatch, "egress corp is at version 1, not the expected 7", "egress", "update", "corp", "--socks5", "p:1", "--expected-version", "7")
	e.expectExit(api.ExitNotFound, "egress nope does not exist", "egress", "update", "nope", "--socks5", "p:1")
	out = e.mustRun("egress", "update", "corp", "--socks5", "proxy2.corp.example:1080", "--expected-version", "1")
	if want := "egress corp is at revision 2: socks5 proxy2.corp.example:1080, credentials set (version 2)\n"; out != want {
		t.Fatalf("update: %q, want %q", out, want)
	}
	if out := e.mustRun("egress", "update", "corp", "--socks5", "proxy2.corp.example:1080"); !strings.Contains(out, "at revision 2") {
		t.Fatalf("an update that changes nothing: %q", out)
	}
	if out := e.mustRun("egress", "update", "open", "--username", "u", "--password-file", pw); !strings.Contains(out, "egress open is at revision 2: socks5 192.0.2.10:1080, credentials set") {
		t.Fatalf("credentials for open: %q", out)
	}
	if out := e.mustRun("egress", "update", "open", "--clear-credentials"); !strings.Contains(out, "revision 3") || !strings.Contains(out, "credentials none") {
		t.Fatalf("--clear-credentials: %q", out)
	}

	// A Workspace names it: its policy records the revision; the Egress
	// cannot be deleted while named.
	id := strings.TrimSpace(e.mustRun("workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--egress", "corp", "--no-wait", "-q"))
	if got := lineOf(t, e.mustRun("workspace", "get", id), "Egress"); got != "Egress: corp (revision 2)" {
		t.Fatalf("workspace get: %q", got)
	}
	if !strings.Contains(squash(e.mustRun("egress", "list")), "corp proxy2.corp.example:1080 2 set 1") {
		t.Errorf("list does not count the Workspace:\n%s", e.mustRun("egress", "list"))
	}
	e.expectExit(api.ExitFailedPrecondition, "egress corp is used by workspaces "+id+": change their network policy first (kibo workspace set-network WS --egress none", "egress", "delete", "corp")
	e.mustRun("egress", "get", "corp")
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		st := e.wsJSON(id).State
		return st == api.WorkspaceFailed, "state " + st
	})
	e.mustRun("workspace", "stop", id)
	e.mustRun("workspace", "set-network", id, "--egress", "none")
	e.expectExit(api.ExitVersionMismatch, "not the expected", "egress", "delete", "corp", "--expected-version", "1")
	if out := e.mustRun("egress", "delete", "corp", "--expected-version", "2"); out != "egress corp deleted\n" {
		t.Fatalf("delete: %q", out)
	}
	e.expectExit(api.ExitNotFound, "egress corp does not exist", "egress", "delete", "corp")
}

// Resolver objects through the CLI.
func TestResolverCommands(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding")
	}})
	out := e.mustRun("resolver", "create", "corp-dns", "--upstream", "192.0.2.53", "--upstream", "dns.corp.example:5353, [2001:db8::53]")
	if want := "resolver corp-dns created: upstreams 192.0.2.53:53,dns.corp.example:5353,[2001:db8::53]:53 (version 1)\n"; out != want {
		t.Fatalf("create: %q, want %q", out, want)
	}
	e.expectExit(api.ExitUsage, "missing flags: --upstream", "resolver", "create", "dns2")
	e.expectExit(api.ExitInvalidArgument, `resolver dns2: upstream "10.0.0.300" has host "10.0.0.300", which is neither an IP address nor a DNS name`, "resolver", "create", "dns2", "--upstream", "10.0.0.300")
	e.expectExit(api.ExitInvalidArgument, "9 upstreams given: give 1-8", "resolver", "create", "dns2", "--upstream", "1.1.1.1,1.1.1.2,1.1.1.3,1.1.1.4,1.1.1.5,1.1.1.6,1.1.1.7,1.1.1.8,1.1.1.9")
	e.expectExit(api.ExitFailedPrecondition, "resolver corp-dns already exists", "resolver", "create", "corp-dns", "--upstream", "192.0.2.1")
	e.expectExit(api.ExitInvalidArgument, `resolver name "default" is reserved`, "resolver", "create", "default", "--upstream", "192.0.2.1")
	if got := squash(e.mustRun("resolver", "list")); got != "NAME UPSTREAMS WORKSPACES VERSION corp-dns 192.0.2.53:53,dns.corp.example:5353,[2001:db8::53]:53 0 1" {
		t.Errorf("list: %q", got)
	}
	if got := lineOf(t, e.mustRun("resolver", "get", "corp-dns"), "Upstreams"); got != "Upstreams: 192.0.2.53:53,dns.corp.example:5353,[2001:db8::53]:53" {
		t.Errorf("get: %q", got)
	}
	if raw := e.mustRun("resolver", "get", "corp-dns", "--json"); !strings.Contains(raw, `"upstreams": [`) {
		t.Errorf("get --json:\n%s", raw)
	}

	id := strings.TrimSpace(e.mustRun("workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--resolver", "corp-dns", "--no-wait", "-q"))
	if got := lineOf(t, e.mustRun("workspace", "get", id), "Resolver"); got != "Resolver: corp-dns" {
		t.Errorf("workspace get: %q", got)
	}
	e.expectExit(api.ExitFailedPrecondition, "resolver corp-dns is used by workspaces "+id+": change their network policy first (kibo workspace set-network WS --resolver default", "resolver", "delete", "corp-dns")
	e.mustRun("workspace", "delete", id)
	if out := e.mustRun("resolver", "delete", "corp-dns", "--command-id", "rd-1"); out != "resolver corp-dns deleted\n" {
		t.Fatalf("delete: %q", out)
	}
	e.mustRun("resolver", "delete", "corp-dns", "--command-id", "rd-1") // a retry: its first result
	e.expectExit(api.ExitNotFound, "resolver corp-dns does not exist: check the name with kibo resolver list", "resolver", "get", "corp-dns")
	if out := e.mustRun("resolver", "list", "-q"); out != "" {
		t.Errorf("list after delete: %q", out)
	}
}

// egress and resolver list -A show every namespace's objects, the same
// name in two of them told apart by a NAMESPACE column; without -A only
// the namespace asked for.
func TestNetworkObjectsOfEveryNamespace(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1})
	e.mustRun("namespace", "create", "acme")
	for _, ns := range []string{"default", "acme"} {
		e.mustRun("-n", ns, "egress", "create", "corp", "--socks5", "192.0.2.10:1080")
		e.mustRun("-n", ns, "resolver", "create", "corp-dns", "--upstream", "192.0.2.53")
	}
	for _, c := range []struct{ kind, name, row string }{
		{"egress", "corp", "corp 192.0.2.10:1080"},
		{"resolver", "corp-dns", "corp-dns 192.0.2.53"},
	} {
		out := e.mustRun(c.kind, "list", "-A")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 3 || !strings.HasPrefix(squash(lines[0]), "NAMESPACE NAME ") ||
			!strings.HasPrefix(squash(lines[1]), "acme "+c.row) || !strings.HasPrefix(squash(lines[2]), "default "+c.row) {
			t.Errorf("%s list -A: want a NAMESPACE column and %s in acme and default:\n%s", c.kind, c.name, out)
		}
		if out := e.mustRun("-n", "acme", c.kind, "list"); strings.Contains(out, "NAMESPACE") || strings.Count(out, c.name+" ") != 1 {
			t.Errorf("%s list -n acme: want acme's %s alone, no NAMESPACE column:\n%s", c.kind, c.name, out)
		}
	}
}
