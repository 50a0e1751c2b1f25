package cluster_test

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/kibotos/kibotos/cluster/clustertest"
)

// A ctrl member's own records are root's alone, as the security model
// says: its identity, keys and certificates, the Raft log (raft-wal makes
// its files 0644), the Raft snapshots (raft makes them 0644 in 0755) and
// the state. Walked after a snapshot and a restart, which reopens all.
func TestMemberRecordsArePrivate(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	m := c.Members[0]
	if err := m.Server.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	m.Stop()
	m.Restart(clustertest.Options{})
	c.WaitLeader()
	// Whatever the restart appended (a member's report): nothing at all
	// is fine too, the first snapshot went through the same store.
	if err := m.Server.Raft().Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		t.Fatal(err)
	}
	var files, dirs int
	for _, top := range []string{m.Dir.IdentityFile(), filepath.Dir(m.Dir.MemberKey()), m.Dir.RaftDir(), filepath.Dir(m.Dir.StateFile())} {
		err := filepath.WalkDir(top, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := e.Info()
			if err != nil {
				return err
			}
			rel := strings.TrimPrefix(p, string(m.Dir)+"/")
			switch {
			case e.IsDir():
				dirs++
				if info.Mode().Perm() != 0o700 {
					t.Errorf("directory %s is %v; want 0700", rel, info.Mode().Perm())
				}
			case e.Type().IsRegular():
				files++
				if info.Mode().Perm()&0o077 != 0 {
					t.Errorf("file %s is %v; want no access for group and others (0600)", rel, info.Mode().Perm())
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	snaps, _ := filepath.Glob(filepath.Join(m.Dir.RaftDir(), "snapshots", "*", "state.bin"))
	segments, _ := filepath.Glob(filepath.Join(m.Dir.RaftDir(), "*", "*.wal"))
	if len(snaps) == 0 || len(segments) == 0 || files < 8 {
		t.Fatalf("walked %d files in %d directories, %d snapshots, %d log segments: the member's records are not where the test looks", files, dirs, len(snaps), len(segments))
	}
}
