package e2e

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/kibotos/kibotos/datadir"
)

// testDataDirModes walks the whole data directory of the dev member while
// a Workspace runs (Instance directories, layers, logs, sockets and
// records included) and holds it to the security model: nothing is
// writable by others, and the member's secrets and replicated records
// (tls/, raft/, state/, identity.json) are root-only files in 0700
// directories.
func (d *wsDev) testDataDirModes(string) {
	dir := datadir.Dir(d.dir)
	private := []string{filepath.Dir(dir.CACert()), dir.RaftDir(), filepath.Dir(dir.StateFile()), dir.IdentityFile()}
	var files, dirs, secret int
	err := filepath.WalkDir(d.dir, func(p string, e fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // gone meanwhile (a temporary file, a rotated log)
		}
		if err != nil {
			return err
		}
		if e.Type()&(fs.ModeSymlink|fs.ModeSocket|fs.ModeNamedPipe) != 0 {
			return nil
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		perm, rel := info.Mode().Perm(), strings.TrimPrefix(p, d.dir+"/")
		if e.IsDir() {
			dirs++
		} else {
			files++
		}
		if perm&0o002 != 0 {
			d.t.Errorf("%s is %v: writable by others", rel, info.Mode())
		}
		for _, top := range private {
			if p != top && !strings.HasPrefix(p, top+"/") {
				continue
			}
			secret++
			if e.IsDir() && perm != 0o700 || !e.IsDir() && perm&0o077 != 0 {
				d.t.Errorf("%s is %v; the security model has it root-only (0600 files in 0700 directories)", rel, info.Mode())
			}
		}
		return nil
	})
	if err != nil {
		d.t.Fatal(err)
	}
	if secret < 6 {
		d.t.Fatalf("found %d entries under tls/, raft/, state/ and identity.json: the layout moved; update this check", secret)
	}
	d.t.Logf("walked %d directories and %d files of %s (%d of them root-only records and keys)", dirs, files, d.dir, secret)
}
