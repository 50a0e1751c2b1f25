package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/hostprobe"
	"github.com/kibotos/kibotos/internal/testenv"
)

// testTenants uses the dev cluster as an application would: with only
// the API URL, the CA file and an API key (no data directory, no
// operator credential). The key dev made works; a key of namespace acme
// creates a Workspace there, execs, copies a file in and out, forwards a
// port and deletes it; a key of namespace beta can neither see nor touch
// it.
func (d *wsDev) testTenants(string) {
	t := d.t
	ca := d.caFile()
	devKey, err := os.ReadFile(filepath.Join(d.dir, "api-key"))
	if err != nil {
		t.Fatalf("the API key kibotos dev made: %v", err)
	}
	if log, _ := os.ReadFile(d.devProc().Log); !bytes.Contains(log, []byte("KIBOTOS_TOKEN=$(cat ")) {
		t.Errorf("kibotos dev did not say how to reach its API with its key")
	}
	remote := func(secret string, args ...string) clusterlab.Result {
		return d.remote(secret, ca, args...)
	}
	if r := remote(strings.TrimSpace(string(devKey)), "workspace", "list"); r.Code != 0 {
		t.Fatalf("dev's key on its API: %s", r)
	}

	secrets := map[string]string{}
	for _, ns := range []string{"acme", "beta"} {
		d.must("namespace", "create", ns)
		r := d.must("api-key", "create", "app", "--namespace", ns, "--role", "sandbox")
		secrets[ns] = strings.TrimSpace(r.Stdout)
		if _, _, ok := api.ParseKeySecret(secrets[ns]); !ok {
			t.Fatalf("api-key create printed %q, not a key", r.Stdout)
		}
	}
	acme := func(args ...string) clusterlab.Result { return remote(secrets["acme"], args...) }
	beta := func(args ...string) clusterlab.Result { return remote(secrets["beta"], args...) }

	r := acme("workspace", "create", "--template", "kibotos-base", "--timeout", "30m", "-q")
	if r.Code != 0 || !wsIDRe.MatchString(r.Stdout) {
		t.Fatalf("create with acme's key: %s", r)
	}
	id := strings.TrimSpace(r.Stdout)
	if r := acme("workspace", "exec", id, "--", "echo", "remote-hello"); r.Code != 0 || r.Stdout != "remote-hello\n" {
		t.Fatalf("exec with acme's key: %s", r)
	}
	local, back := filepath.Join(d.tmp, "tenant.in"), filepath.Join(d.tmp, "tenant.out")
	payload := randBytes(t, 1<<20)
	if err := os.WriteFile(local, payload, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := acme("workspace", "cp", local, id+":/root/tenant"); r.Code != 0 {
		t.Fatalf("cp in with acme's key: %s", r)
	}
	if r := acme("workspace", "cp", id+":/root/tenant", back); r.Code != 0 {
		t.Fatalf("cp out with acme's key: %s", r)
	}
	if got, _ := os.ReadFile(back); !bytes.Equal(got, payload) {
		t.Errorf("cp in and out with acme's key: %d bytes back, equal %v", len(got), bytes.Equal(got, payload))
	}
	if r := acme("workspace", "exec", id, "--", "sh", "-c", "nc -l -p 8000 -e /bin/cat </dev/null >/dev/null 2>&1 &"); r.Code != 0 {
		t.Fatalf("echo server with acme's key: %s", r)
	}
	d.portForwardEcho(id, d.remoteEnv(secrets["acme"], ca))

	// beta's key: acme's Workspace does not exist for it.
	for _, args := range [][]string{
		{"workspace", "get", id},
		{"workspace", "exec", id, "--", "true"},
		{"workspace", "stop", id},
		{"workspace", "delete", id},
	} {
		if r := beta(args...); r.Code != api.ExitNotFound {
			t.Errorf("beta's key: %s: want exit %d", r, api.ExitNotFound)
		}
	}
	if r := beta("workspace", "list", "-q"); r.Code != 0 || strings.Contains(r.Stdout, id) {
		t.Errorf("beta's list shows acme's Workspace: %s", r)
	}
	if r := beta("node", "list"); r.Code != api.ExitPermissionDenied {
		t.Errorf("beta's key on nodes: %s: want exit %d", r, api.ExitPermissionDenied)
	}
	if r := acme("workspace", "delete", id); r.Code != 0 {
		t.Fatalf("delete with acme's key: %s", r)
	}
	d.expect(api.ExitNotFound, "workspace", "get", id)
	d.sdkExamples(secrets["acme"], ca)
}

// sdkExamples runs the Go SDK's examples (sdk/kibotos, build tag
// sdkexamples) against the dev cluster with an API key: their Output
// lines are what the SDK's documentation promises.
func (d *wsDev) sdkExamples(secret, ca string) {
	t := d.t
	// The fork example runs a fork and its resumed source at once, beside
	// the warm guest: more vCPUs than this two-core host has unless the
	// operator overcommits them, as one would on a laptop.
	d.must("node", "overcommit", "set", "dev", "--cpu", "4")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-tags", "sdkexamples", "-run", "^Example", "./sdk/kibotos/")
	cmd.Dir = ".."
	env := []string{"KIBOTOS_API_URL=https://" + d.apiAddr, "KIBOTOS_TOKEN=" + secret, "KIBOTOS_CA_FILE=" + ca, "KIBOTOS_TEMPLATE=kibotos-base"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KIBOTOS_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the SDK examples against the dev cluster: %v\n%s", err, out)
	}
	t.Logf("the SDK examples passed against the dev cluster in %s", time.Since(t0).Round(time.Second))
	// Each example deletes what it made.
	testenv.WaitFor(t, time.Minute, "the examples' Workspaces gone", func() (bool, string) {
		r := d.must("workspace", "list", "-n", "acme", "--all", "-q")
		return r.Stdout == "", r.Stdout
	})
}

// caFile is the dev cluster's CA certificate, which applications trust.
func (d *wsDev) caFile() string { return datadir.Dir(d.dir).CACert() }

// remoteEnv is the environment of a CLI on a host with nothing of the
// cluster but the API URL, its CA file and an API key.
func (d *wsDev) remoteEnv(secret, ca string) []string {
	home := filepath.Join(d.tmp, "remote-home")
	os.MkdirAll(home, 0o700)
	return append(hostprobe.CleanEnv(), "HOME="+home, "KIBOTOS_DATA_DIR="+filepath.Join(d.tmp, "no-data-dir"),
		"KIBOTOS_API_URL=https://"+d.apiAddr, "KIBOTOS_TOKEN="+secret, "KIBOTOS_CA_FILE="+ca)
}

// remote runs the CLI as remoteEnv describes.
func (d *wsDev) remote(secret, ca string, args ...string) clusterlab.Result {
	return d.kiboEnv(d.remoteEnv(secret, ca), args...)
}

// testIdleResume: a Workspace with an idle timeout and auto-resume is
// paused by ctrl once nothing used it for that long, and the next exec
// resumes it, with the process it left running in the background still
// there.
func (d *wsDev) testIdleResume(string) {
	t := d.t
	r := d.kibo(3*time.Minute, nil, "workspace", "create", "--template", "kibotos-base", "--idle-timeout", "30s", "--auto-resume", "-q")
	if r.Code != 0 || !wsIDRe.MatchString(r.Stdout) {
		t.Fatalf("create with --idle-timeout: %s", r)
	}
	id := strings.TrimSpace(r.Stdout)
	d.must("workspace", "exec", id, "--", "sh", "-c", "sleep 100000 </dev/null >/dev/null 2>&1 & echo $! > /root/bg.pid")
	t0 := time.Now()
	testenv.WaitFor(t, 3*time.Minute, "the idle Workspace paused", func() (bool, string) {
		w := d.get(id)
		return w.State == api.WorkspacePaused, w.State
	})
	t.Logf("TIMING idle pause: PAUSED %s after the last exec (idle timeout 30s)", time.Since(t0).Round(time.Second))
	r = d.kibo(3*time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "kill -0 $(cat /root/bg.pid) && echo still-running")
	if r.Code != 0 || r.Stdout != "still-running\n" {
		t.Fatalf("exec into the idle-paused Workspace: %s, want it resumed with its background process", r)
	}
	if w := d.get(id); w.State != api.WorkspaceAvailable {
		t.Errorf("after the exec: %s, want AVAILABLE", w.State)
	}
	log, _ := os.ReadFile(d.devProc().Log)
	for _, line := range []string{"workspace idle, pausing", "workspace resumed on connect"} {
		if !bytes.Contains(log, []byte(line)) {
			t.Errorf("the dev log has no %q", line)
		}
	}
	d.must("workspace", "delete", id)
}
