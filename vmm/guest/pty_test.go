package guest

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A terminal in a Workspace root has a name there: the pair comes from
// the root's own devpts, as a Workspace mounts one (agent.TemplateMounts),
// so tty(1) answers and the name is a terminal in the root. From the
// agent's devpts it was "not a tty" (a devpts mount is an instance of its
// own). A root without a devpts still gets a terminal.
func TestExecPTYChrooted(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "chroot and a devpts mount need root")
	}
	root, bare := busyboxRoot(t), busyboxRoot(t)

	pts := filepath.Join(root, "dev", "pts")
	os.MkdirAll(pts, 0o755)
	if err := unix.Mount("devpts", pts, "devpts", 0, "gid=5,mode=620,ptmxmode=666"); err != nil {
		t.Fatalf("mount devpts on %s: %v", pts, err)
	}
	t.Cleanup(func() { unix.Unmount(pts, unix.MNT_DETACH) })

	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	term := func(root string) string {
		t.Helper()
		p, err := c.Exec(ctxT(t), guestproto.ExecRequest{Root: root, PTY: &guestproto.WinSize{Rows: 24, Cols: 80},
			Argv: []string{"/bin/busybox", "sh", "-c", `t=$(/bin/busybox tty); echo "tty=$t"; /bin/busybox test -c "$t" && echo named; /bin/busybox stty size`}})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		out, _ := io.ReadAll(p.Stdout)
		if _, err := p.Wait(); err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(out), "\r", "")
	}
	if got := term(root); !strings.Contains(got, "tty=/dev/pts/0\nnamed\n24 80\n") {
		t.Errorf("a terminal in a root with its own devpts: %q; want tty=/dev/pts/0, a terminal of that name, 24 80", got)
	}
	// The root's devpts holds the pair while it is open, and is empty
	// once the process ended and the agent closed its side.
	if names, _ := os.ReadDir(pts); len(names) != 1 || names[0].Name() != "ptmx" {
		t.Errorf("%s after the exec: %v; want only ptmx", pts, names)
	}
	if got := term(bare); !strings.Contains(got, "24 80\n") {
		t.Errorf("a terminal in a root without a devpts: %q; want one of 24 80", got)
	}

	// An image's user owns its terminal and can open it by name.
	writeTestFile(t, filepath.Join(root, guestproto.ImageConfigPath), `{"user":"app"}`)
	p, err := c.Exec(ctxT(t), guestproto.ExecRequest{Root: root, PTY: &guestproto.WinSize{Rows: 24, Cols: 80},
		Argv: []string{"/bin/busybox", "sh", "-c", `t=$(/bin/busybox tty); /bin/busybox stat -c %u "$t"; echo hi > "$t"`}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	out, _ := io.ReadAll(p.Stdout)
	if exit, err := p.Wait(); err != nil || exit.ExitCode != 0 || strings.ReplaceAll(string(out), "\r", "") != "1000\nhi\n" {
		t.Errorf("the image user's terminal: %q, exit %+v, %v; want owner 1000 and a write by name", out, exit, err)
	}
}

// busyboxRoot is an image root (imageRoot) holding the host's static
// busybox as /bin/busybox.
func busyboxRoot(t *testing.T) string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Skipf(t, "no /bin/busybox (Debian package busybox-static)")
	}
	root := imageRoot(t, nil)
	writeTestFile(t, filepath.Join(root, "bin/busybox"), string(bb))
	if err := os.Chmod(filepath.Join(root, "bin/busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}
