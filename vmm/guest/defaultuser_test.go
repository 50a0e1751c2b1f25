package guest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/template"
)

// The default user a Debian template build adds (template.AddDefaultUser,
// --user user --sudo) is who every exec runs as: uid 1000 in its own
// group and sudo, in its home, with its environment, as E2B's SDK
// expects of its templates.
func TestExecAsTemplateDefaultUser(t *testing.T) {
	testenv.RequireRoot(t, "to chroot and give the home to uid 1000")
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Skipf(t, "missing /bin/busybox (Debian package busybox-static): %v", err)
	}
	root := t.TempDir()
	os.Chmod(root, 0o755) // the user must reach its home from the top
	for p, content := range map[string]string{
		"etc/passwd":  "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"etc/group":   "root:x:0:\nsudo:x:27:\nnogroup:x:65534:\n",
		"etc/shadow":  "root:*:19500:0:99999:7:::\n",
		"etc/sudoers": "@includedir /etc/sudoers.d\n",
		"bin/busybox": string(bb),
	} {
		writeTestFile(t, filepath.Join(root, p), content)
	}
	os.Chmod(filepath.Join(root, "bin/busybox"), 0o755)
	if err := template.AddDefaultUser(root, template.DefaultUser{Name: "user", Sudo: true}); err != nil {
		t.Fatal(err)
	}

	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	script := `/bin/busybox id; /bin/busybox pwd; echo "$HOME $USER $LANG $PATH"`
	out, errs, exit := runRequest(t, c, guestproto.ExecRequest{Argv: []string{"/bin/busybox", "sh", "-c", script}, Root: root}, nil)
	if exit.ExitCode != 0 {
		t.Fatalf("exit %+v: %s%s", exit, out, errs)
	}
	// busybox's id lists the supplementary groups only; GNU id (Debian's)
	// puts the primary group first: groups=1000(user),27(sudo).
	want := "uid=1000(user) gid=1000(user) groups=27(sudo)\n/home/user\n/home/user user C.UTF-8 /usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games\n"
	if got := out; got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}
