package cluster_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"hash/crc64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/fsm"
)

// A member whose state was written by a newer kibotos refuses to start and
// says why.
func TestNewerStateRefusedAtStart(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	m := c.Members[0]
	if err := m.Server.Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	m.Stop()

	snaps, _ := filepath.Glob(filepath.Join(m.Dir.RaftDir(), "snapshots", "*"))
	if len(snaps) == 0 {
		t.Fatal("no snapshot written")
	}
	dir := snaps[len(snaps)-1]
	state := filepath.Join(dir, "state.bin")
	db, err := bolt.Open(state, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], fsm.SchemaVersion+1)
		return tx.Bucket([]byte("meta")).Put([]byte("schema_version"), b[:])
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Keep the snapshot's checksum right so only the schema is wrong.
	raw, _ := os.ReadFile(state)
	h := crc64.New(crc64.MakeTable(crc64.ECMA))
	h.Write(raw)
	metaPath := filepath.Join(dir, "meta.json")
	var meta map[string]any
	mraw, _ := os.ReadFile(metaPath)
	json.Unmarshal(mraw, &meta)
	meta["CRC"] = h.Sum(nil)
	meta["Size"] = len(raw)
	mraw, _ = json.Marshal(meta)
	os.WriteFile(metaPath, mraw, 0o600)

	_, err = cluster.Open(context.Background(), cluster.Config{DataDir: m.Dir, Timings: cluster.TestTimings()})
	if err == nil || !strings.Contains(err.Error(), "schema version") || !strings.Contains(err.Error(), "at least as new") {
		t.Fatalf("start with newer state: %v", err)
	}
}
