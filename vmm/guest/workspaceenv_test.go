package guest

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// The Workspace's environment sits between the base of an exec (its
// DefaultEnv, the guest's defaults or the image's Env) and the caller's
// own Env; an exec without a Root, the agent's own, never gets it.
func TestSetupExecWorkspaceEnv(t *testing.T) {
	log, _ := quietLog()
	plain, image := imageRoot(t, nil), imageRoot(t, &guestproto.ImageConfig{Env: []string{"PATH=/img", "FOO=image", "KEEP=image"}})
	ws := []string{"FOO=ws", "PATH=/ws", "SECRET=s3"}
	for _, tc := range []struct {
		name string
		req  guestproto.ExecRequest
		env  []string
	}{
		{name: "defaults below it, the caller's env above", req: guestproto.ExecRequest{Root: plain, DefaultEnv: []string{"PATH=/bin", "HOME=/root"}, Env: []string{"FOO=mine", "A=1"}},
			env: []string{"PATH=/ws", "HOME=/root", "FOO=mine", "SECRET=s3", "A=1"}},
		{name: "the guest's defaults below it", req: guestproto.ExecRequest{Root: plain},
			env: []string{"PATH=/ws", "HOME=/root", "FOO=ws", "SECRET=s3"}},
		{name: "an earlier node's env in Env only", req: guestproto.ExecRequest{Root: plain, Env: []string{"PATH=/bin", "SECRET=mine"}},
			env: []string{"FOO=ws", "PATH=/bin", "SECRET=mine"}},
		{name: "the image's env below it", req: guestproto.ExecRequest{Root: image, DefaultEnv: []string{"LANG=C.UTF-8"}, Env: []string{"SECRET=mine"}},
			env: []string{"PATH=/ws", "FOO=ws", "KEEP=image", "SECRET=mine", "HOME=/root"}},
		{name: "as a user: its HOME, USER and LOGNAME below it", req: guestproto.ExecRequest{Root: plain, User: "app", DefaultEnv: []string{"PATH=/bin"}, Env: []string{"FOO=mine"}},
			env: []string{"PATH=/ws", "FOO=mine", "SECRET=s3", "HOME=/home/app", "USER=app", "LOGNAME=app"}},
		{name: "no root: the agent's own exec", req: guestproto.ExecRequest{Env: []string{"A=1"}}, env: []string{"A=1"}},
	} {
		s, err := setupExec(log, tc.req, ws)
		if err != nil || !slices.Equal(s.env, tc.env) {
			t.Errorf("%s: env %q, %v; want %q", tc.name, s.env, err, tc.env)
		}
	}
}

// Through the agent: configure's Env reaches every chrooted exec, a
// later configure without Env keeps it, one with Env replaces it, and a
// malformed one is refused without its text and leaves it as it was.
func TestExecWorkspaceEnv(t *testing.T) {
	testenv.RequireRoot(t, "to chroot")
	root := busyboxRoot(t)
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	if !c.Info().Has(guestproto.CapWorkspaceEnv) {
		t.Fatalf("capabilities %q lack %s", c.Info().Capabilities, guestproto.CapWorkspaceEnv)
	}
	ctx := ctxT(t)
	if err := c.Configure(ctx, guestproto.ConfigureRequest{Env: []string{"GREETING=hello world", "TOKEN=s3cret"}}); err != nil {
		t.Fatal(err)
	}
	show := `echo "$GREETING|$TOKEN|$PATH"`
	run := func(req guestproto.ExecRequest) string {
		t.Helper()
		out, errs, exit := runRequest(t, c, req, nil)
		if exit.ExitCode != 0 {
			t.Fatalf("exit %+v: %s", exit, errs)
		}
		return strings.TrimSpace(out)
	}
	inRoot := guestproto.ExecRequest{Argv: []string{"/bin/busybox", "sh", "-c", show}, Root: root, DefaultEnv: []string{"PATH=/bin"}}
	if got, want := run(inRoot), "hello world|s3cret|/bin"; got != want {
		t.Errorf("chrooted exec: %q, want %q", got, want)
	}
	mine := inRoot
	mine.Env = []string{"TOKEN=mine"}
	if got, want := run(mine), "hello world|mine|/bin"; got != want {
		t.Errorf("the caller's TOKEN: %q, want %q", got, want)
	}
	bb := filepath.Join(root, "bin/busybox")
	own := guestproto.ExecRequest{Argv: []string{bb, "sh", "-c", show}, Env: []string{"PATH=/none"}}
	if got, want := run(own), "||/none"; got != want {
		t.Errorf("the agent's own exec: %q, want %q", got, want)
	}

	if err := c.Configure(ctx, guestproto.ConfigureRequest{Hostname: ""}); err != nil {
		t.Fatal(err)
	}
	if got, want := run(inRoot), "hello world|s3cret|/bin"; got != want {
		t.Errorf("after a configure without Env: %q, want %q", got, want)
	}
	err := c.Configure(ctx, guestproto.ConfigureRequest{Env: []string{"GOOD=1", "=hidden-value"}})
	if err == nil || !strings.Contains(err.Error(), "environment entry 1") || strings.Contains(err.Error(), "hidden-value") {
		t.Fatalf("a malformed entry: %v, want it refused by position only", err)
	}
	if got, want := run(inRoot), "hello world|s3cret|/bin"; got != want {
		t.Errorf("after a refused Env: %q, want %q", got, want)
	}
	if err := c.Configure(ctx, guestproto.ConfigureRequest{Env: []string{"GREETING=bye"}}); err != nil {
		t.Fatal(err)
	}
	if got, want := run(inRoot), "bye||/bin"; got != want {
		t.Errorf("after a new Env: %q, want %q", got, want)
	}
	if strings.Contains(h.logs.String(), "s3cret") {
		t.Errorf("the agent logged a value:\n%s", h.logs.String())
	}
}
