package fsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// A Raft snapshot holds a read transaction while it writes the state out
// (seconds, for a large state). Applies that grow the state file meanwhile
// must not wait for it: bbolt remaps the file only once every read
// transaction ended, so a file mapped no larger than it was would stall
// every apply until the snapshot is written.
func TestApplyDoesNotWaitForASnapshot(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	write, release, err := h.f.BeginSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var before bytes.Buffer
	if err := write(&before); err != nil {
		t.Fatal(err)
	}
	done := make(chan []Result)
	go func() {
		// About 4 MiB of command records: the file grows many times
		// over what it held when the snapshot began.
		var failed []Result
		pad := strings.Repeat("p", 1000)
		for i := range 32 {
			var es []Entry
			for j := range 128 {
				op := OpNodeDrain
				if j%2 == 1 {
					op = OpNodeCancelDrain
				}
				es = append(es, makeEntry(t0, op, NodeArgs{NodeID: "node-a"}, withCommand(fmt.Sprintf("c-%d-%d-%s", i, j, pad)), withCommandLog()))
			}
			for _, r := range h.f.Apply(es) {
				if r.Error != nil {
					failed = append(failed, r)
				}
			}
		}
		done <- failed
	}()
	select {
	case failed := <-done:
		if len(failed) > 0 {
			t.Fatalf("%d writes failed, the first: %v", len(failed), failed[0].Error)
		}
	case <-time.After(30 * time.Second):
		release()
		<-done
		t.Fatal("the applies waited for the snapshot's read transaction")
	}
	// The snapshot still writes the state as of its beginning (the
	// bytes of pages it does not use may differ).
	var after bytes.Buffer
	if err := write(&after); err != nil {
		t.Fatal(err)
	}
	if b, a := mustDump(t, restoredFrom(t, &before)), mustDump(t, restoredFrom(t, &after)); a != b {
		t.Fatalf("the snapshot's state changed under it:\n%s", diffLines(b, a))
	}
}

// ---------------------------------------------------------------------------
// Snapshot and restore

func TestRestoreRefusesNewerSchema(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	before := h.dump()

	path := filepath.Join(t.TempDir(), "newer.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], SchemaVersion+1)
		if err := tx.Bucket(bucketMeta).Put(keySchemaVersion, v[:]); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keyClusterID, []byte("from-the-future"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	snap, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	err = h.f.Restore(bytes.NewReader(snap))
	if err == nil || !strings.Contains(err.Error(), "schema version") {
		t.Fatalf("restore of a newer schema: %v", err)
	}
	if got := h.dump(); got != before {
		t.Fatalf("refused restore changed the state:\n%s", diffLines(before, got))
	}
	// The FSM keeps working on the old state.
	h.advance(time.Second)
	h.report("node-a", "s1", api.Report{})
	if v := h.version("node-a"); v != 3 {
		t.Errorf("version %d", v)
	}
	if _, err := os.Stat(h.f.path + ".restore.tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary restore file left behind: %v", err)
	}

	// The same file with the current schema version is accepted.
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], SchemaVersion)
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, v[:])
	})
	db.Close()
	snap, _ = os.ReadFile(path)
	if err := h.f.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatalf("restore current schema: %v", err)
	}
	h.f.View(func(tx *bolt.Tx) error {
		if id := ClusterID(tx); id != "from-the-future" {
			t.Errorf("cluster id after restore %q", id)
		}
		return nil
	})
}

// writeStateFile builds a bbolt file with every bucket and the given meta
// schema_version value, and returns its bytes.
func writeStateFile(t *testing.T, schemaVersion []byte) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "snap.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, schemaVersion)
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A corrupt schema version record is refused, not a panic.
func TestRestoreRefusesCorruptSchemaVersion(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	before := h.dump()
	for _, v := range [][]byte{{1}, {0, 0, 0, 1}, {}, make([]byte, 9)} {
		if err := h.f.Restore(bytes.NewReader(writeStateFile(t, v))); err == nil {
			t.Errorf("schema version %x accepted", v)
		}
		if got := h.dump(); got != before {
			t.Fatal("refused restore changed the state")
		}
	}
}

func TestRestoreRefusesGarbage(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	before := h.dump()
	for _, snap := range [][]byte{nil, []byte("not a bolt file"), bytes.Repeat([]byte{0xff}, 8192)} {
		if err := h.f.Restore(bytes.NewReader(snap)); err == nil {
			t.Errorf("restore of %d garbage bytes succeeded", len(snap))
		}
		if got := h.dump(); got != before {
			t.Fatalf("refused restore changed the state")
		}
	}
	h.advance(time.Second)
	h.report("node-a", "s1", api.Report{})
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("d"))
	var buf bytes.Buffer
	if err := h.f.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	want := h.dump()
	c := &harness{t: t, f: openFSM(t), now: h.now}
	if err := c.f.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if got := c.dump(); got != want {
		t.Fatalf("restored state differs:\n%s", diffLines(want, got))
	}
	// Command records travel with the snapshot.
	if r := c.expectUnchanged(c.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("d"))); !r.Replayed {
		t.Error("command record lost in the snapshot")
	}
}
