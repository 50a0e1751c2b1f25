package generations

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// ControlSocket is the control socket of generation gen in dir. Each
// generation has its own, so a draining one and its successor can both be
// reached, and a generation is found by its number alone.
func ControlSocket(dir string, gen uint64) string {
	return filepath.Join(dir, "control-"+strconv.FormatUint(gen, 10)+".sock")
}

// ListenControl listens on generation gen's control socket in dir, which
// the caller made or checked. The socket file stays when the listener
// closes: the process removes it after its last reply.
func ListenControl(dir string, gen uint64) (*net.UnixListener, error) {
	path := ControlSocket(dir, gen)
	// A socket file of this generation can only be left by a process of
	// this generation that died: generations are never reused.
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
		os.Remove(path)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	return ln, nil
}
