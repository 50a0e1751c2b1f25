package guest

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A file written as a user of a root is the user's, in directories made
// as the user's; the user's permissions decide (root's /etc is refused);
// the user's symbolic links resolve inside the root, never to the agent's
// own files.
func TestWriteFileAsUser(t *testing.T) {
	testenv.RequireRoot(t, "to write as another user")
	root := imageRoot(t, nil)
	home := filepath.Join(root, "home/app")
	os.MkdirAll(home, 0o755)
	os.Chown(home, 1000, 1000)
	os.MkdirAll(filepath.Join(root, "tmp"), 0o777)
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	os.Symlink("/", filepath.Join(home, "top"))
	os.Symlink("../../../../../../../../..", filepath.Join(home, "up"))

	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dialOn(h.plugData())
	ctx := ctxT(t)
	write := func(p string, mkdirs bool) (guestproto.FileInfo, error) {
		return c.WriteFileAs(ctx, guestproto.FileWriteRequest{Path: p, Root: root, User: "app", MakeDirs: mkdirs}, strings.NewReader("data of "+p))
	}
	fi, err := write("/home/app/new/dir/f.txt", true)
	if err != nil || fi.UID != 1000 || fi.Size != int64(len("data of /home/app/new/dir/f.txt")) {
		t.Fatalf("write as app: %+v, %v", fi, err)
	}
	for _, p := range []string{"home/app/new", "home/app/new/dir", "home/app/new/dir/f.txt"} {
		st, err := os.Stat(filepath.Join(root, p))
		if err != nil || st.Sys().(*syscall.Stat_t).Uid != 1000 {
			t.Errorf("%s: %v, not app's", p, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(home, "new/dir/f.txt")); string(b) != "data of /home/app/new/dir/f.txt" {
		t.Errorf("content %q", b)
	}
	if _, err := write("/etc/app-was-here", false); guestErr(err) == nil || guestErr(err).Code != guestproto.CodePermissionDenied {
		t.Errorf("write into root's /etc as app: %v, want %s", err, guestproto.CodePermissionDenied)
	}
	name := filepath.Base(t.TempDir()) + "-escape"
	for _, via := range []string{"/home/app/top/tmp/", "/home/app/up/tmp/"} {
		if _, err := write(via+name, false); err != nil {
			t.Fatalf("write through %s: %v", via, err)
		}
		if _, err := os.Stat(filepath.Join(root, "tmp", name)); err != nil {
			t.Errorf("through %s: not in the root's /tmp: %v", via, err)
		}
		if _, err := os.Stat(filepath.Join("/tmp", name)); err == nil {
			os.Remove(filepath.Join("/tmp", name))
			t.Fatalf("through %s: written to the agent's own /tmp", via)
		}
		os.Remove(filepath.Join(root, "tmp", name))
	}
	if _, err := c.WriteFileAs(ctx, guestproto.FileWriteRequest{Path: "/home/app/x", Root: root, User: "ghost"}, strings.NewReader("x")); err == nil || !strings.Contains(err.Error(), "no user ghost") {
		t.Errorf("as an unknown user: %v", err)
	}
}

// Without a user the image config's writes, and a relative path is from
// its home.
func TestWriteFileAsImageUser(t *testing.T) {
	testenv.RequireRoot(t, "to write as another user")
	root := imageRoot(t, &guestproto.ImageConfig{User: "app"})
	home := filepath.Join(root, "home/app")
	os.MkdirAll(home, 0o755)
	os.Chown(home, 1000, 1000)
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dialOn(h.plugData())
	fi, err := c.WriteFileAs(ctxT(t), guestproto.FileWriteRequest{Path: "notes.txt", Root: root}, strings.NewReader("mine"))
	if err != nil || fi.Path != "/home/app/notes.txt" || fi.UID != 1000 {
		t.Fatalf("a relative path as the image's user: %+v, %v", fi, err)
	}
}

// A file read as a user of a root is opened with the user's permissions,
// inside the root.
func TestReadFileAsUser(t *testing.T) {
	testenv.RequireRoot(t, "to read as another user")
	root := imageRoot(t, &guestproto.ImageConfig{User: "app"})
	home := filepath.Join(root, "home/app")
	os.MkdirAll(home, 0o755)
	writeTestFile(t, filepath.Join(home, "notes.txt"), "mine")
	writeTestFile(t, filepath.Join(root, "etc/secret"), "root's")
	os.Chmod(filepath.Join(root, "etc/secret"), 0o600)
	os.Symlink("../../../../../../../../../etc/secret", filepath.Join(home, "up"))
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dialOn(h.plugData())
	read := func(p string) (string, guestproto.FileInfo, error) {
		var b strings.Builder
		fi, err := c.ReadFileAs(ctxT(t), guestproto.FileReadRequest{Path: p, Root: root}, &b)
		return b.String(), fi, err
	}
	if got, fi, err := read("notes.txt"); err != nil || got != "mine" || fi.Path != "/home/app/notes.txt" {
		t.Fatalf("a relative path as the image's user: %q %+v %v", got, fi, err)
	}
	for _, p := range []string{"/etc/secret", "/home/app/up"} {
		if got, _, err := read(p); guestErr(err) == nil || guestErr(err).Code != guestproto.CodePermissionDenied {
			t.Errorf("%s as app: %q, %v; want %s", p, got, err, guestproto.CodePermissionDenied)
		}
	}
}
