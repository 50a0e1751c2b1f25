package guest

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

const (
	testPasswd = "root:x:0:0:root:/root:/bin/sh\n# a comment\napp:x:1000:1000:App:/home/app:/bin/sh\nnohome:x:1001:1001::/:/bin/sh\nbroken line\n"
	testGroup  = "root:x:0:\nstaff:x:50:app,other\napp:x:1000:\nwheel:x:10:app\nnogroup:x:65534:\n"
)

// imageRoot is a Workspace root with accounts and, unless cfg is nil, an
// image config.
func imageRoot(t *testing.T, cfg *guestproto.ImageConfig) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range map[string]string{"etc/passwd": testPasswd, "etc/group": testGroup} {
		writeTestFile(t, filepath.Join(root, p), content)
	}
	if cfg != nil {
		b, _ := json.Marshal(cfg)
		writeTestFile(t, filepath.Join(root, guestproto.ImageConfigPath), string(b))
	}
	return root
}

func writeTestFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func quietLog() (*slog.Logger, *bytes.Buffer) {
	var b bytes.Buffer
	return slog.New(slog.NewTextHandler(&b, nil)), &b
}

// Without an image config an exec gets what it always got: the request's
// DefaultEnv then Env as sent (an earlier node sends all of it in Env),
// the guest's defaults for an empty one, the top of the root, root.
func TestSetupExecWithoutImageConfig(t *testing.T) {
	log, _ := quietLog()
	root := imageRoot(t, nil)
	for _, tc := range []struct {
		req  guestproto.ExecRequest
		env  []string
		dir  string
		name string
	}{
		{name: "defaults and env", req: guestproto.ExecRequest{Root: root, DefaultEnv: []string{"PATH=/bin", "HOME=/root"}, Env: []string{"PATH=/mine", "A=1"}},
			env: []string{"PATH=/bin", "HOME=/root", "PATH=/mine", "A=1"}, dir: "/"},
		{name: "earlier node", req: guestproto.ExecRequest{Root: root, Env: []string{"PATH=/bin", "A=1"}, Dir: "/tmp"},
			env: []string{"PATH=/bin", "A=1"}, dir: "/tmp"},
		{name: "empty pty", req: guestproto.ExecRequest{Root: root, PTY: &guestproto.WinSize{}},
			env: []string{"PATH=" + defaultPath, "HOME=/root", "TERM=xterm"}, dir: "/"},
		{name: "no root", req: guestproto.ExecRequest{Env: []string{"A=1"}}, env: []string{"A=1"}, dir: ""},
	} {
		s, err := setupExec(log, tc.req, nil)
		if err != nil || !slices.Equal(s.env, tc.env) || s.dir != tc.dir || s.cred != nil {
			t.Errorf("%s: setup %+v, %v; want env %q dir %q", tc.name, s, err, tc.env, tc.dir)
		}
	}
}

func TestSetupExecImageConfig(t *testing.T) {
	log, _ := quietLog()
	root := imageRoot(t, &guestproto.ImageConfig{Env: []string{"FOO=image", "PATH=/img/bin", "BAR=1", "FOO=image2"}, WorkingDir: "/app", User: "app"})
	s, err := setupExec(log, guestproto.ExecRequest{Root: root, DefaultEnv: []string{"PATH=/bin", "HOME=/root", "LANG=C.UTF-8"}, Env: []string{"BAR=user", "TERM=vt100"}, PTY: &guestproto.WinSize{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The image's env replaces the caller's defaults; the user's own
	// variables override the image's; HOME comes from passwd.
	if want := []string{"FOO=image2", "PATH=/img/bin", "BAR=user", "HOME=/home/app", "TERM=vt100"}; !slices.Equal(s.env, want) {
		t.Errorf("env %q, want %q", s.env, want)
	}
	if s.dir != "/app" {
		t.Errorf("dir %q, want /app", s.dir)
	}
	if s.cred == nil || s.cred.Uid != 1000 || s.cred.Gid != 1000 || !slices.Equal(s.cred.Groups, []uint32{50, 10}) {
		t.Errorf("credential %+v, want 1000:1000 groups [50 10]", s.cred)
	}

	s, err = setupExec(log, guestproto.ExecRequest{Root: root, Dir: "/tmp"}, nil)
	if err != nil || s.dir != "/tmp" {
		t.Errorf("an explicit dir: %q, %v", s.dir, err)
	}

	// No Env, WorkingDir or User: PATH and HOME of root, the top, no
	// credential (the agent's root, as without the file).
	root = imageRoot(t, &guestproto.ImageConfig{})
	s, err = setupExec(log, guestproto.ExecRequest{Root: root, DefaultEnv: []string{"LANG=C.UTF-8"}}, nil)
	if want := []string{"PATH=" + defaultPath, "HOME=/root"}; err != nil || !slices.Equal(s.env, want) || s.dir != "/" || s.cred != nil {
		t.Errorf("an empty image config: %+v, %v; want env %q", s, err, want)
	}
}

func TestLookupUser(t *testing.T) {
	root := imageRoot(t, nil)
	for _, tc := range []struct {
		spec     string
		uid, gid uint32
		groups   []uint32
		home     string
		err      string
	}{
		{spec: "app", uid: 1000, gid: 1000, groups: []uint32{50, 10}, home: "/home/app"},
		{spec: "1000", uid: 1000, gid: 1000, groups: []uint32{50, 10}, home: "/home/app"},
		{spec: "0", uid: 0, gid: 0, home: "/root"},
		{spec: "4242", uid: 4242, gid: 0},
		{spec: "4242:7", uid: 4242, gid: 7},
		{spec: "app:staff", uid: 1000, gid: 50, home: "/home/app"},
		{spec: "1000:staff", uid: 1000, gid: 50, home: "/home/app"},
		{spec: "app:60", uid: 1000, gid: 60, home: "/home/app"},
		{spec: "nohome", uid: 1001, gid: 1001, home: "/"},
		{spec: "ghost", err: "no user ghost in the root's /etc/passwd"},
		{spec: "app:ghosts", err: "no group ghosts in the root's /etc/group"},
		{spec: ":50", err: "not a user"},
		{spec: "app:", err: "not a user"},
	} {
		u, err := lookupUser(root, tc.spec)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %+v, %v; want error %q", tc.spec, u, err, tc.err)
			}
			continue
		}
		if err != nil || u.uid != tc.uid || u.gid != tc.gid || !slices.Equal(u.groups, tc.groups) || u.home != tc.home {
			t.Errorf("%s: %+v, %v; want %d:%d groups %v home %q", tc.spec, u, err, tc.uid, tc.gid, tc.groups, tc.home)
		}
	}
}

// An unknown user fails the exec: running it as root instead would be
// worse than not running it.
func TestSetupExecUnknownUser(t *testing.T) {
	log, _ := quietLog()
	root := imageRoot(t, &guestproto.ImageConfig{User: "ghost"})
	if _, err := setupExec(log, guestproto.ExecRequest{Root: root}, nil); err == nil || !strings.Contains(err.Error(), `image user "ghost": no user ghost`) {
		t.Fatalf("unknown user: %v", err)
	}
}

// A damaged image config is logged and ignored: the exec runs as if the
// root had none. A link out of the root resolves inside it.
func TestSetupExecBadImageConfig(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "config.json")
	writeTestFile(t, outside, `{"env":["LEAKED=1"],"user":"app"}`)
	for name, prepare := range map[string]func(p string){
		"not json": func(p string) { writeTestFile(t, p, "{not json") },
		"too large": func(p string) {
			writeTestFile(t, p, `{"env":["A=`+strings.Repeat("x", guestproto.ImageConfigMax)+`"]}`)
		},
		"directory": func(p string) { os.MkdirAll(p, 0o755) },
		"fifo":      func(p string) { os.MkdirAll(filepath.Dir(p), 0o755); syscall.Mkfifo(p, 0o644) },
		"link out":  func(p string) { os.MkdirAll(filepath.Dir(p), 0o755); os.Symlink(outside, p) },
	} {
		root := imageRoot(t, nil)
		prepare(filepath.Join(root, guestproto.ImageConfigPath))
		log, logs := quietLog()
		s, err := setupExec(log, guestproto.ExecRequest{Root: root, Env: []string{"A=1"}}, nil)
		if err != nil || !slices.Equal(s.env, []string{"A=1"}) || s.dir != "/" || s.cred != nil {
			t.Errorf("%s: %+v, %v; want what an exec without an image config gets", name, s, err)
		}
		if logged := strings.Contains(logs.String(), "image config ignored"); logged != (name != "link out") {
			t.Errorf("%s: logged %v: %s", name, logged, logs.String())
		}
	}
}

// The defaults reach the process: a chrooted exec of the host's static
// busybox runs as the image's user, in its directory, with its env.
func TestExecImageConfigChrooted(t *testing.T) {
	testenv.RequireRoot(t, "to chroot")
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Skipf(t, "missing /bin/busybox (Debian package busybox-static): %v", err)
	}
	root := imageRoot(t, &guestproto.ImageConfig{Env: []string{"FOO=from-image"}, WorkingDir: "/app", User: "app"})
	writeTestFile(t, filepath.Join(root, "bin/busybox"), string(bb))
	os.Chmod(filepath.Join(root, "bin/busybox"), 0o755)
	os.MkdirAll(filepath.Join(root, "app"), 0o755)
	os.Chmod(root, 0o755) // the user must reach its directory from the top

	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	script := `echo "$(/bin/busybox id -u) $(/bin/busybox id -G) $(pwd) $FOO $HOME"`
	p, err := c.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"/bin/busybox", "sh", "-c", script}, Root: root, DefaultEnv: []string{"PATH=/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	out, _ := io.ReadAll(p.Stdout)
	exit, err := p.Wait()
	if err != nil || exit.ExitCode != 0 {
		t.Fatalf("exit %+v, %v", exit, err)
	}
	if got, want := strings.TrimSpace(string(out)), "1000 1000 10 50 /app from-image /home/app"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}

	writeTestFile(t, filepath.Join(root, guestproto.ImageConfigPath), `{"user":"ghost"}`)
	_, err = c.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"/bin/busybox", "true"}, Root: root})
	if err == nil || !strings.Contains(err.Error(), "no user ghost") {
		t.Fatalf("exec as an unknown user: %v", err)
	}
}

// User replaces the image's user: its credential, home as HOME and
// directory, its name as USER and LOGNAME; the caller's Env and Dir
// still win, and an exec outside a root or as an unknown user fails.
func TestSetupExecAsUser(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	root := imageRoot(t, &guestproto.ImageConfig{Env: []string{"HOME=/home/app", "USER=app", "FOO=1"}, WorkingDir: "/app", User: "app"})
	s, err := setupExec(log, guestproto.ExecRequest{Root: root, User: "root"}, nil)
	want := []string{"HOME=/root", "USER=root", "FOO=1", "PATH=" + defaultPath, "LOGNAME=root"}
	if err != nil || s.cred == nil || s.cred.Uid != 0 || s.cred.Gid != 0 || s.dir != "/root" || !slices.Equal(s.env, want) {
		t.Errorf("as root: %+v (cred %+v), %v; want env %q in /root", s, s.cred, err, want)
	}
	s, err = setupExec(log, guestproto.ExecRequest{Root: root, User: "nohome", Dir: "/tmp", Env: []string{"USER=me"}}, nil)
	if err != nil || s.cred.Uid != 1001 || s.dir != "/tmp" || !slices.Contains(s.env, "USER=me") || !slices.Contains(s.env, "HOME=/") {
		t.Errorf("as nohome with Dir and USER: %+v, %v", s, err)
	}
	// Without an image config the user applies as well.
	plain := imageRoot(t, nil)
	s, err = setupExec(log, guestproto.ExecRequest{Root: plain, User: "app", DefaultEnv: []string{"PATH=/bin"}}, nil)
	if err != nil || s.cred.Uid != 1000 || s.dir != "/home/app" || !slices.Contains(s.env, "HOME=/home/app") || !slices.Contains(s.env, "PATH=/bin") {
		t.Errorf("as app without an image config: %+v, %v", s, err)
	}
	if _, err := setupExec(log, guestproto.ExecRequest{Root: root, User: "ghost"}, nil); err == nil || !strings.Contains(err.Error(), `user "ghost": no user ghost`) {
		t.Errorf("an unknown user: %v", err)
	}
	if _, err := setupExec(log, guestproto.ExecRequest{User: "root"}, nil); err == nil || !strings.Contains(err.Error(), "only an exec into a root") {
		t.Errorf("a user without a root: %v", err)
	}
}
