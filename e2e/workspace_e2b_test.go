package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/hostprobe"
	"github.com/kibotos/kibotos/internal/testenv"
)

// e2bTemplate is the E2B-style template dev builds (--e2b-template) and
// serves as E2B's base: the SDK runs its commands with bash as user.
const e2bTemplate = "e2b-base"

// e2bSDKDir holds the Node suite of the official E2B SDK and the SDK
// itself (scripts/install-deps.sh installs it there).
const e2bSDKDir = "e2bsdk"

// testE2B runs the official E2B SDK's suite (e2bsdk/*.test.mjs) against
// the dev cluster with nothing but the environment kibotos dev wrote for
// it, and a key of another namespace for the isolation checks.
func (d *wsDev) testE2B(string) {
	t := d.t
	node := testenv.LookPath(t, "node", "nodejs")
	if _, err := os.Stat(filepath.Join(e2bSDKDir, "node_modules", "e2b", "package.json")); err != nil {
		t.Fatalf("the E2B SDK is not installed in e2e/%s (scripts/install-deps.sh runs npm ci there): %v", e2bSDKDir, err)
	}
	envFile := filepath.Join(d.dir, "e2b.env")
	st, err := os.Stat(envFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the E2B environment kibotos dev writes, %s: %v (mode %v), want a file only root reads", envFile, err, st.Mode())
	}
	if log, _ := os.ReadFile(d.devProc().Log); !bytes.Contains(log, []byte("set -a; . "+envFile)) {
		t.Errorf("kibotos dev did not say how to load the E2B environment %s", envFile)
	}
	raw, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	env := append(hostprobe.CleanEnv(), strings.Fields(string(raw))...)
	// Two sandboxes beside the Workspaces of the steps before, on a
	// two-core host: overcommitted as on a laptop (as Tenants does).
	d.must("node", "overcommit", "set", "dev", "--cpu", "4")
	d.must("namespace", "create", "e2b-other")
	other := strings.TrimSpace(d.must("api-key", "create", "e2b", "--namespace", "e2b-other", "--role", "sandbox").Stdout)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "control.test.mjs")
	cmd.Dir = e2bSDKDir
	const suite = "e2e-e2b"
	cmd.Env = append(env, "E2B_OTHER_KEY="+other, "E2B_SUITE="+suite)
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the E2B SDK's suite: %v\n%s", err, out)
	}
	t.Logf("the E2B SDK's suite passed in %s:\n%s", time.Since(t0).Round(time.Millisecond), lastLines(string(out), 12))
	// Killed sandboxes are deleted in the background: gone before the
	// next step counts VMs.
	testenv.WaitFor(t, 2*time.Minute, "the killed sandboxes' Workspaces gone", func() (bool, string) {
		r := d.must("workspace", "list", "--label", "suite="+suite, "-q")
		return r.Stdout == "", r.Stdout
	})
}
