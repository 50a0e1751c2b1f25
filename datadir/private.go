package datadir

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Modes of the member's own records (identity, keys, Raft log and
// snapshots, state): root's alone.
const (
	PrivateDirMode  fs.FileMode = 0o700
	PrivateFileMode fs.FileMode = 0o600
)

// MakePrivate takes group and other permissions away from root and
// everything below it: directories become 0700, files 0600. It is for
// what libraries create with wider modes (raft-wal's segments and meta
// store, raft's snapshots are 0644 in 0755): the parent directory already
// keeps others out, but the data directory's modes must say so too.
func MakePrivate(root string) error {
	return filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed meanwhile (a snapshot being replaced)
			}
			return err
		}
		want := PrivateFileMode
		switch {
		case e.IsDir():
			want = PrivateDirMode
		case !e.Type().IsRegular():
			return nil // a socket or a link is not a record
		}
		info, err := e.Info()
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if info.Mode().Perm()&^want != 0 {
			if err := os.Chmod(p, info.Mode().Perm()&want); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("data directory: make %s private: %w", p, err)
			}
		}
		return nil
	})
}
