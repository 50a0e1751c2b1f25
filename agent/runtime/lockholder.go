package runtime

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kibotos/kibotos/internal/recordfmt"
	"github.com/kibotos/kibotos/vmm/units"
)

// The runtime lock also says which process holds it and the cgroup that
// process runs in. Tools the node starts (mkfs.ext4, qemu-img, cp, tar)
// run in that cgroup and are not the node's units: once the node has
// stopped, check-maintenance finds there what it left running, which
// nothing else records.

// lockFile is the runtime lock of the storage root.
func lockFile(storageRoot string) string { return filepath.Join(storageRoot, "runtime", "lock") }

// lockHolderVersion is the format of the lock's record.
const lockHolderVersion = 1

var lockHolderRange = recordfmt.Current(lockHolderVersion)

// lockHolder is the content of runtime/lock while and after a node held it.
type lockHolder struct {
	FormatVersion int    `json:"format_version"`
	PID           int    `json:"pid"`
	StartTime     uint64 `json:"start_time"`
	// Cgroup is the node's cgroup2 path (the "0::" line of
	// /proc/self/cgroup), CgroupDir that cgroup's directory on the
	// cgroup2 mount; both empty on a host without cgroup2.
	Cgroup    string `json:"cgroup,omitempty"`
	CgroupDir string `json:"cgroup_dir,omitempty"`
}

// writeLockHolder records this process in the lock file f, which it
// holds. The file is rewritten in place: a file renamed over the path
// would be a second lock. A write cut short by a crash leaves the new
// value ahead of the old one's tail, and the reader takes the first value.
func writeLockHolder(f *os.File) error {
	h := lockHolder{FormatVersion: lockHolderVersion, PID: os.Getpid()}
	var err error
	if h.StartTime, err = procStartTime(h.PID); err != nil {
		return err
	}
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		h.Cgroup = units.Cgroup2Path(string(b))
	}
	if mount, err := units.Cgroup2Mount(); err == nil && h.Cgroup != "" {
		h.CgroupDir = filepath.Join(mount, h.Cgroup)
	}
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if _, err := f.WriteAt(b, 0); err != nil {
		return err
	}
	return f.Truncate(int64(len(b)))
}

// errNoLockHolder: the lock says nothing of its holder (written by a
// build from before the record, or a node that ended before writing it).
var errNoLockHolder = errors.New("the runtime lock does not say which process held it")

// readLockHolder reads the record of the lock file at path.
func readLockHolder(path string) (*lockHolder, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errNoLockHolder
	}
	var h lockHolder
	if err := json.NewDecoder(bytes.NewReader(raw)).Decode(&h); err != nil {
		return nil, fmt.Errorf("runtime lock %s is corrupt: %w; stop every node process, then remove the file (the next node writes it again)", path, err)
	}
	if err := lockHolderRange.Check(path, h.FormatVersion); err != nil {
		return nil, fmt.Errorf("runtime lock %w", err)
	}
	// The check reads the processes of CgroupDir: only a clean absolute
	// cgroup path, and a directory that is a mount joined with it, are
	// taken ("/" is the mount itself).
	if h.PID <= 0 || (h.Cgroup != "" && (!filepath.IsAbs(h.Cgroup) || filepath.Clean(h.Cgroup) != h.Cgroup)) ||
		(h.CgroupDir != "" && (h.Cgroup == "" || filepath.Clean(h.CgroupDir) != h.CgroupDir ||
			filepath.Join(strings.TrimSuffix(h.CgroupDir, h.Cgroup), h.Cgroup) != h.CgroupDir)) {
		return nil, fmt.Errorf("runtime lock %s is corrupt: pid %d, cgroup %.200q in %.200q; stop every node process, then remove the file (the next node writes it again)", path, h.PID, h.Cgroup, h.CgroupDir)
	}
	return &h, nil
}
