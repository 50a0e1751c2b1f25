package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// WorkspaceCpCmd is `workspace cp SRC DST`: one side is WS:PATH.
type WorkspaceCpCmd struct {
	Src      string `arg:"" name:"src" help:"Local path, - (stdin) or WS:PATH."`
	Dst      string `arg:"" name:"dst" help:"Local path, - (stdout) or WS:PATH."`
	Mode     string `name:"mode" default:"0644" help:"File mode of a file copied into the Workspace."`
	Progress bool   `name:"progress" negatable:"" default:"true" help:"Show a progress bar when stderr is a terminal."`
}

// splitRemote parses WS:PATH; a local path has no colon before its first slash.
func splitRemote(s string) (ws, p string, ok bool) {
	i := strings.IndexByte(s, ':')
	if i <= 0 || strings.Contains(s[:i], "/") {
		return "", s, false
	}
	return s[:i], s[i+1:], true
}

// inWorkspace is p as an absolute path in the Workspace (relative to
// /root, as a shell there would take it).
func inWorkspace(p string) string {
	if !path.IsAbs(p) {
		p = "/root/" + p
	}
	return path.Clean(p)
}

// guestPath is a Workspace path as the guest agent sees it.
func guestPath(p string) string {
	return path.Join(agent.WorkspaceRoot, inWorkspace(p))
}

// guestNotFound says whether err is the guest's "no such file".
func guestNotFound(err error) bool {
	var ge *guestproto.Error
	return errors.As(err, &ge) && ge.Code == guestproto.CodeNotFound
}

func (c *WorkspaceCpCmd) Run(g *Globals) error {
	sws, sp, sRemote := splitRemote(c.Src)
	dws, dp, dRemote := splitRemote(c.Dst)
	switch {
	case sRemote == dRemote:
		return usagef("workspace cp: exactly one of SRC and DST must be WS:PATH")
	case sRemote:
		return c.download(g, sws, sp, dp)
	default:
		return c.upload(g, sp, dws, dp)
	}
}

func (c *WorkspaceCpCmd) upload(g *Globals, local, ws, remote string) error {
	mode, err := strconv.ParseUint(c.Mode, 8, 32)
	if err != nil {
		return usagef("--mode %q is not an octal file mode", c.Mode)
	}
	var r io.Reader = g.stdin
	var size int64 = -1
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return api.Errorf(api.CodeNotFound, "%v", err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil {
			size = st.Size()
			if st.IsDir() {
				return usagef("workspace cp: %s is a directory; copy files one at a time (or tar them: tar c DIR | kibo workspace cp - %s:/tmp/dir.tar)", local, ws)
			}
		}
		r = f
	}
	client, err := g.dataPlane(ws)
	if err != nil {
		return err
	}
	defer client.Close()
	if strings.HasSuffix(remote, "/") && local != "-" {
		remote += path.Base(local)
	}
	// Where it goes, told before a byte is sent and in the Workspace's
	// terms: into a directory as cp(1) does, and never under a directory
	// that is not there.
	fi, err := client.Stat(g.ctx, guestPath(remote))
	switch {
	case err == nil && fi.Mode.IsDir() && local == "-":
		return usagef("workspace cp: %s:%s is a directory; name the file to write in it", ws, inWorkspace(remote))
	case err == nil && fi.Mode.IsDir():
		remote = path.Join(inWorkspace(remote), path.Base(local))
	case guestNotFound(err):
		dir := path.Dir(inWorkspace(remote))
		if _, err := client.Stat(g.ctx, guestPath(dir)); guestNotFound(err) {
			return api.Errorf(api.CodeNotFound, "workspace %s: directory %s does not exist: make it first (kibo workspace exec %s -- mkdir -p %s)", ws, dir, ws, dir)
		}
	}
	pb := g.progress(c.Progress, "upload "+path.Base(local), size)
	fi, err = client.WriteFile(g.ctx, guestPath(remote), os.FileMode(mode), pb.reader(r))
	pb.done()
	if err != nil {
		return fmt.Errorf("workspace %s: write %s: %w", ws, remote, err)
	}
	if !g.JSON {
		g.note("%s: %d bytes written to %s:%s\n", path.Base(local), fi.Size, ws, inWorkspace(remote))
	}
	return nil
}

func (c *WorkspaceCpCmd) download(g *Globals, ws, remote, local string) error {
	client, err := g.dataPlane(ws)
	if err != nil {
		return err
	}
	defer client.Close()
	gp := guestPath(remote)
	var size int64 = -1
	fi, err := client.Stat(g.ctx, gp)
	switch {
	case err == nil && fi.Mode.IsDir():
		dir := inWorkspace(remote)
		return usagef("workspace cp: %s:%s is a directory; copy files one at a time (or tar them: kibo workspace exec %s -- tar c -C %s . > dir.tar)", ws, dir, ws, dir)
	case err == nil:
		size = fi.Size
	case guestNotFound(err):
		// Said before a local file is created, and without the guest's
		// mount point in the path.
		return api.Errorf(api.CodeNotFound, "workspace %s: %s: no such file or directory", ws, remote)
	}
	var w io.Writer = g.stdout
	var f *os.File
	tmp := ""
	if local != "-" {
		if st, err := os.Stat(local); err == nil && st.IsDir() {
			local = local + "/" + path.Base(remote)
		}
		// Written beside the target and renamed: an interrupted copy
		// leaves no half file under the target's name.
		f, err = os.CreateTemp(path.Dir(local), "."+path.Base(local)+".kibo-cp-*")
		if err != nil {
			return err
		}
		tmp = f.Name()
		defer os.Remove(tmp)
		w = f
	}
	pb := g.progress(c.Progress && local != "-", "download "+path.Base(remote), size)
	_, err = client.ReadFile(g.ctx, gp, pb.writer(w))
	pb.done()
	if err != nil {
		if f != nil {
			f.Close()
		}
		return fmt.Errorf("workspace %s: read %s: %w", ws, remote, err)
	}
	if f != nil {
		if err := f.Close(); err != nil {
			return err
		}
		if err := os.Rename(tmp, local); err != nil {
			return err
		}
		// Said as an upload says it; not for stdout, which is the data.
		if st, err := os.Stat(local); err == nil {
			g.note("%s:%s: %d bytes written to %s\n", ws, inWorkspace(remote), st.Size(), local)
		}
	}
	return nil
}
