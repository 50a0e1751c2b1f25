package storagepool

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// maxSweepDepth bounds how deep a sweep walks below its root: a pool's
// layout is a few levels (volumes/data/<file>), and a sweep must not
// wander into whatever a mistaken path points at.
const maxSweepDepth = 4

// SweepLocal deletes every temporary file in the node's own directories
// (and their subdirectories): nobody else writes there, so whatever an
// interrupted write left is dead. Missing directories are fine. It
// returns how many it deleted.
func SweepLocal(dirs ...string) (int, error) {
	n := 0
	var errs []error
	for _, dir := range dirs {
		k, err := sweep(dir, func(string) bool { return true })
		n += k
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// SweepPool deletes the temporary files of interrupted writes in a pool
// at root: in a standalone pool all of them (only this node writes
// there), in a shared pool only those node wrote (another member may be
// in the middle of its own write). Temporary files without a node id in
// a shared pool are left for the operator (written by an older release:
// stop every node that declares the pool first).
func SweepPool(root string, shared bool, node string) (int, error) {
	if shared && node == "" {
		return 0, errors.New("storagepool: sweep of a shared pool needs the node id")
	}
	return sweep(root, func(name string) bool { return !shared || WrittenBy(name, node) })
}

// sweep deletes the temporary files under root that mine accepts,
// without reading them or following symbolic links.
func sweep(root string, mine func(name string) bool) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			if p != root && strings.Count(strings.TrimPrefix(p, root), string(filepath.Separator)) >= maxSweepDepth {
				return fs.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() && IsTemp(d.Name()) && mine(d.Name()) {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}
