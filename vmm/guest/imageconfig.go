package guest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// accountsMax bounds what is read of a root's /etc/passwd and /etc/group.
const accountsMax = 4 << 20

// execSetup is how an exec starts: its environment, working directory
// and, for an image config naming a user, its credential.
type execSetup struct {
	env  []string
	dir  string
	cred *syscall.Credential // nil: the agent's own (root)
}

// setupExec works out req's environment, directory and user. A root
// without an image config (every template not built from an OCI image)
// gets exactly what exec always did: DefaultEnv then Env, else PATH and
// HOME=/root (TERM for a PTY), and the top of the root. With one, the
// image's Env is the base, the caller's explicit Env overrides it by name,
// and the image's WorkingDir and User apply. An image config that cannot
// be read or parsed is logged and ignored, so a damaged file never stops
// a Workspace's commands; a user it names that the root does not know
// fails the exec, as it would in any container runtime.
//
// wsEnv, the Workspace's environment, applies to an exec with a Root
// (the agent's own processes are not the Workspace's): it overrides the
// base (DefaultEnv, the guest's defaults, the image's Env, a User's HOME,
// USER and LOGNAME) by name, and the caller's Env overrides it. Each
// layer replaces a variable in place, never adds a second one of the
// same name: getenv takes the first, shells the last.
func setupExec(log *slog.Logger, req guestproto.ExecRequest, wsEnv []string) (execSetup, error) {
	if req.Root == "" {
		wsEnv = nil
	}
	s, err := setupImageExec(log, req, wsEnv)
	if err != nil || req.User == "" {
		return s, err
	}
	return s.as(req, wsEnv)
}

// as is s run as req.User instead: its credential, HOME, USER and
// LOGNAME, and its home as the directory unless req names one. The
// Workspace's environment and the caller's own Env still win.
func (s execSetup) as(req guestproto.ExecRequest, wsEnv []string) (execSetup, error) {
	if req.Root == "" {
		return execSetup{}, fmt.Errorf("user %q: only an exec into a root (Root) runs as one of its users", req.User)
	}
	u, err := lookupUser(req.Root, req.User)
	if err != nil {
		return execSetup{}, fmt.Errorf("user %q: %w", req.User, err)
	}
	s.cred = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
	home := u.home
	if home == "" {
		home = "/"
	}
	s.env = overrideEnv(s.env, []string{"HOME=" + home, "USER=" + u.name, "LOGNAME=" + u.name})
	s.env = overrideEnv(overrideEnv(s.env, wsEnv), req.Env)
	if req.Dir == "" {
		s.dir = home
	}
	return s, nil
}

// setupImageExec is setupExec without req.User.
func setupImageExec(log *slog.Logger, req guestproto.ExecRequest, wsEnv []string) (execSetup, error) {
	var cfg *guestproto.ImageConfig
	if req.Root != "" {
		c, err := loadImageConfig(req.Root)
		if err != nil {
			log.Warn("image config ignored", "root", req.Root, "err", err)
		}
		cfg = c
	}
	if cfg == nil {
		var env []string
		switch {
		case len(req.DefaultEnv) == 0 && len(req.Env) == 0:
			env = []string{"PATH=" + defaultPath, "HOME=/root"}
			if req.PTY != nil {
				env = append(env, "TERM=xterm")
			}
			env = overrideEnv(env, wsEnv)
		case len(wsEnv) == 0:
			env = append(append([]string(nil), req.DefaultEnv...), req.Env...)
		default:
			env = overrideEnv(overrideEnv(overrideEnv(nil, req.DefaultEnv), wsEnv), req.Env)
		}
		dir := req.Dir
		if req.Root != "" && dir == "" {
			// The agent's own directory means nothing inside the new root
			// (shells complain they cannot find it): start at its top.
			dir = "/"
		}
		return execSetup{env: env, dir: dir}, nil
	}
	s := execSetup{dir: req.Dir}
	home := "/root"
	if cfg.User != "" {
		u, err := lookupUser(req.Root, cfg.User)
		if err != nil {
			return execSetup{}, fmt.Errorf("image user %q: %w", cfg.User, err)
		}
		s.cred = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
		if u.home != "" {
			home = u.home
		}
	} else if u, err := lookupUser(req.Root, "0"); err == nil && u.home != "" {
		home = u.home
	}
	s.env = overrideEnv(overrideEnv(nil, cfg.Env), wsEnv)
	for _, d := range []string{"PATH=" + defaultPath, "HOME=" + home} {
		if envIndex(s.env, envKey(d)) < 0 {
			s.env = append(s.env, d)
		}
	}
	if req.PTY != nil && envIndex(s.env, "TERM") < 0 {
		s.env = append(s.env, "TERM=xterm")
	}
	s.env = overrideEnv(s.env, req.Env)
	if s.dir == "" {
		s.dir = cfg.WorkingDir
	}
	if s.dir == "" {
		s.dir = "/"
	} else if !path.IsAbs(s.dir) {
		s.dir = "/" + s.dir // the OCI spec's WorkingDir is absolute; Docker reads a relative one from /
	}
	return s, nil
}

// loadImageConfig reads root's image config: nil and no error when there
// is none.
func loadImageConfig(root string) (*guestproto.ImageConfig, error) {
	b, err := readInRoot(root, guestproto.ImageConfigPath, guestproto.ImageConfigMax)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var c guestproto.ImageConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", guestproto.ImageConfigPath, err)
	}
	return &c, nil
}

// readInRoot reads the regular file name as the root sees it: every
// symbolic link on the way resolves inside root, never to the agent's own
// files. It reads at most max bytes and says so when there are more.
func readInRoot(root, name string, max int64) ([]byte, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(rfd)
	// O_NONBLOCK: a FIFO left there must not hang the exec.
	fd, err := unix.Openat2(rfd, strings.TrimPrefix(name, "/"), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is a %v, not a regular file", name, fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, max)
	}
	return b, nil
}

// execUser is an image's User resolved against its root.
type execUser struct {
	uid, gid uint32
	groups   []uint32 // supplementary
	home     string
	name     string // the passwd name, else the uid given
}

// lookupUser resolves an OCI image config's User (uid, name, and either
// with :gid or :group) as runc does: a name must be in /etc/passwd, a uid
// need not be; the primary group is the explicit group, else the passwd
// entry's, else 0; the supplementary groups are those /etc/group lists
// the user's name in, unless a group was given.
func lookupUser(root, spec string) (execUser, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return execUser{}, errors.New("not a user such as 1000, app, 1000:1000 or app:staff")
	}
	var u execUser
	uid, numeric := parseID(userPart)
	name := ""
	passwd, perr := readInRoot(root, "/etc/passwd", accountsMax)
	found := false
	if perr == nil {
		for _, f := range accountLines(passwd, 7) {
			id, ok := parseID(f[2])
			if !ok || (numeric && id != uid) || (!numeric && f[0] != userPart) {
				continue
			}
			gid, _ := parseID(f[3])
			u, name, found = execUser{uid: id, gid: gid, home: f[5]}, f[0], true
			break
		}
	}
	switch {
	case found:
		u.name = name
	case numeric:
		u.uid, u.name = uid, userPart
	case perr != nil:
		return execUser{}, fmt.Errorf("no user %s: the root's /etc/passwd cannot be read (%v)", userPart, perr)
	default:
		return execUser{}, fmt.Errorf("no user %s in the root's /etc/passwd: give a uid or add the user to the image", userPart)
	}
	if hasGroup {
		if gid, ok := parseID(groupPart); ok {
			u.gid = gid
			return u, nil
		}
	}
	if !hasGroup && name == "" {
		return u, nil // a uid without a passwd entry is in no group but its primary one
	}
	group, gerr := readInRoot(root, "/etc/group", accountsMax)
	if gerr != nil {
		if hasGroup {
			return execUser{}, fmt.Errorf("no group %s: the root's /etc/group cannot be read (%v)", groupPart, gerr)
		}
		return u, nil
	}
	for _, f := range accountLines(group, 4) {
		gid, ok := parseID(f[2])
		if !ok {
			continue
		}
		if hasGroup {
			if f[0] == groupPart {
				u.gid = gid
				return u, nil
			}
			continue
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == name {
				u.groups = append(u.groups, gid)
			}
		}
	}
	if hasGroup {
		return execUser{}, fmt.Errorf("no group %s in the root's /etc/group: give a gid or add the group to the image", groupPart)
	}
	return u, nil
}

// parseID reads a uid or gid.
func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

// accountLines splits the lines of a passwd-like file into n fields,
// skipping comments and lines that are not such entries.
func accountLines(b []byte, n int) [][]string {
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), accountsMax)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if f := strings.Split(line, ":"); len(f) == n {
			out = append(out, f)
		}
	}
	return out
}

// envKey is the name of a KEY=VALUE entry.
func envKey(e string) string {
	k, _, _ := strings.Cut(e, "=")
	return k
}

func envIndex(env []string, key string) int {
	for i, e := range env {
		if envKey(e) == key {
			return i
		}
	}
	return -1
}

// overrideEnv sets each entry of over in env, replacing an entry of the
// same name in place: one entry per name, the last given winning.
func overrideEnv(env, over []string) []string {
	for _, e := range over {
		if i := envIndex(env, envKey(e)); i >= 0 {
			env[i] = e
		} else {
			env = append(env, e)
		}
	}
	return env
}
