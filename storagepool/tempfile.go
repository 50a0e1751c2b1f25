// Package storagepool is the node's side of storage: pool directories and
// what lives in them, and the one way every record, block file or archive
// of the code base is written: to a temporary file first, renamed into
// place once complete, so a reader sees the old file or the new one and
// an interrupted write leaves only a temporary file behind. Temporary
// names say who wrote them (in a pool, the node id first), so cleanup at
// start can tell its own from another node's still being written.
//
// It is host-local and knows nothing of consensus.
package storagepool

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// TempSuffix ends the name of every temporary file.
const TempSuffix = ".tmp"

// Temp names the temporary file of one write.
type Temp struct {
	// Node is the writing node's id; set for every write inside a pool
	// (a shared pool's other members keep their hands off it), empty in
	// the node's local directories.
	Node string
	// Purpose says what is being written: "record", "import",
	// "layer-<workspace>", "move-vol-<volume>".
	Purpose string
}

var purposePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,80}$`)

// Name is a fresh temporary file name: .<node>.<purpose>-<n>.tmp in a
// pool, .<purpose>-<n>.tmp locally (the seed's
// volumes/data/.node-a.import-1438876543.tmp and registry/.record-2826134621.tmp).
func (t Temp) Name() (string, error) {
	if !purposePattern.MatchString(t.Purpose) {
		return "", fmt.Errorf("storagepool: temporary file purpose %q: want lowercase letters, digits and '-'", t.Purpose)
	}
	if t.Node != "" && (strings.ContainsAny(t.Node, "/.\x00") || len(t.Node) > 63) {
		return "", fmt.Errorf("storagepool: temporary file of node %q: not a node id", t.Node)
	}
	var b [4]byte
	rand.Read(b[:])
	n := strconv.FormatUint(uint64(binary.BigEndian.Uint32(b[:])), 10)
	if t.Node == "" {
		return "." + t.Purpose + "-" + n + TempSuffix, nil
	}
	return "." + t.Node + "." + t.Purpose + "-" + n + TempSuffix, nil
}

// IsTemp says whether a file name is a temporary file's: hidden and
// ending in .tmp. Nothing else is ever swept.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.HasSuffix(name, TempSuffix) && len(name) > len("."+TempSuffix)
}

// WrittenBy says whether a temporary file name carries node's id.
func WrittenBy(name, node string) bool {
	return node != "" && strings.HasPrefix(name, "."+node+".")
}

// WriteFile writes data to path through a temporary file t names in the
// same directory, created with perm (never wider while it is written),
// fsynced, renamed over path, and the directory fsynced: after a crash
// path is the old file or the new one, durably.
func WriteFile(path string, data []byte, perm os.FileMode, t Temp) error {
	return Write(path, perm, t, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// Write is WriteFile for a writer that streams: fill writes the content
// into the temporary file.
func Write(path string, perm os.FileMode, t Temp, fill func(*os.File) error) error {
	dir := filepath.Dir(path)
	name, err := t.Name()
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, name)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("storagepool: write %s: %w", path, err)
	}
	// The umask may have narrowed perm; the file gets exactly perm.
	err = f.Chmod(perm)
	if err == nil {
		err = fill(f)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("storagepool: write %s: %w", path, err)
	}
	return Commit(tmp, path)
}

// Commit renames a complete temporary file over path and fsyncs the
// directory; for files another program wrote (qemu-img into TempPath).
// On error the temporary file is removed.
func Commit(tmp, path string) error {
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("storagepool: put %s in place: %w", path, err)
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("storagepool: put %s in place: %w", path, err)
	}
	return nil
}

// SyncFile fsyncs the file at path, which another program wrote (QEMU,
// mkfs.ext4), before it is committed.
func SyncFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// TempPath is a fresh temporary file path in dir for a program that
// writes the file itself; Commit puts it in place.
func TempPath(dir string, t Temp) (string, error) {
	name, err := t.Name()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, name), nil
}

// SyncDir makes the renames, creations and removals in dir durable (a
// file system that cannot sync a directory has nothing to make durable).
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}
