package dataplane

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// An upgrade may move the socket directory (builds before this one kept it
// under the node's state directory; the process-model documentation puts
// it under the node's socket directory). A generation an earlier build
// started listens in the directory it was given and goes on doing so. So
// that every step of adoption and hand-over (Hello, ExportState,
// TakeListener, the successor's lender, Drain, End) reaches it by
// ControlSocket(SocketDir, gen) as it reaches any other, Ensure links that
// name to its socket: connecting through a symbolic link reaches the
// socket it names. The link goes with the generation, and an earlier
// directory goes once no socket is left in it.

// linkEarlier links each running generation's control socket that is not
// in socketDir but in one of earlier.
func linkEarlier(socketDir string, earlier []string, running []*proc, log *slog.Logger) error {
	if len(earlier) == 0 {
		return nil
	}
	if err := os.MkdirAll(socketDir, 0o700); err != nil {
		return fmt.Errorf("dataplane: socket directory %s: %w", socketDir, err)
	}
	// A link whose generation no longer runs is litter a node that
	// stopped before it saw that generation end left behind.
	runs := map[string]bool{}
	for _, p := range running {
		runs[filepath.Base(ControlSocket(socketDir, p.gen))] = true
	}
	if entries, err := os.ReadDir(socketDir); err == nil {
		for _, e := range entries {
			if e.Type() == fs.ModeSymlink && !runs[e.Name()] {
				os.Remove(filepath.Join(socketDir, e.Name()))
			}
		}
	}
	for _, p := range running {
		name := ControlSocket(socketDir, p.gen)
		if _, err := os.Lstat(name); err == nil || !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		for _, dir := range earlier {
			old := ControlSocket(dir, p.gen)
			if st, err := os.Lstat(old); err != nil || st.Mode().Type() != fs.ModeSocket {
				continue
			}
			if err := os.Symlink(old, name); err != nil {
				return fmt.Errorf("dataplane: reach generation %d of an earlier build at %s: %w", p.gen, old, err)
			}
			log.Info("data-plane generation found in an earlier socket directory", "generation", p.gen, "unit", p.unit, "control_socket", old)
			break
		}
	}
	tidyEarlier(earlier)
	return nil
}

// forgetEarlier removes the link to generation gen's control socket, if
// it was one, once the generation ended, and the earlier directories left
// without sockets.
func forgetEarlier(socketDir string, earlier []string, gen uint64) {
	if len(earlier) == 0 {
		return
	}
	name := ControlSocket(socketDir, gen)
	if st, err := os.Lstat(name); err == nil && st.Mode().Type() == fs.ModeSymlink {
		os.Remove(name)
	}
	tidyEarlier(earlier)
}

// tidyEarlier removes each earlier directory that holds no control socket
// any more: its generation counter, then the directory. Anything else in
// it is not this package's, and the directory stays.
func tidyEarlier(earlier []string) {
	for _, dir := range earlier {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		sockets := false
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "control-") && strings.HasSuffix(e.Name(), ".sock") {
				sockets = true
			}
		}
		if !sockets {
			os.Remove(generationFile(dir))
			os.Remove(dir)
		}
	}
}
