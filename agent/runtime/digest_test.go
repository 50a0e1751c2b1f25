package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// The follower's digest of a file written while it reads is the digest
// of the whole file, whatever the interleaving, including bytes written
// between its last look and finish.
func TestDigestFollowerChasesWriter(t *testing.T) {
	ctx := context.Background()
	for run := range 5 {
		path := filepath.Join(t.TempDir(), "state")
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		d, err := followDigest(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(uint64(run), 1))
		h := sha256.New()
		var total uint64
		for range 40 {
			chunk := make([]byte, r.IntN(3*followChunk))
			for i := range chunk {
				chunk[i] = byte(r.Uint32())
			}
			if _, err := f.Write(chunk); err != nil {
				t.Fatal(err)
			}
			h.Write(chunk)
			total += uint64(len(chunk))
		}
		size, sum, err := d.finish()
		f.Close()
		if err != nil || size != total || sum != hex.EncodeToString(h.Sum(nil)) {
			t.Fatalf("run %d: follower %d bytes %s (%v), file %d bytes %x", run, size, sum, err, total, h.Sum(nil))
		}
		if fsize, fsum, err := fileDigest(ctx, path); err != nil || fsize != size || fsum != sum {
			t.Fatalf("run %d: fileDigest %d %s %v, follower %d %s", run, fsize, fsum, err, size, sum)
		}
	}
}

// A follower stopped before the writer is done ends and says so.
func TestDigestFollowerStops(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(path, []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := followDigest(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	d.stop()
	if r := <-d.result; r.err == nil {
		t.Fatalf("a stopped follower returned %d bytes %s", r.size, r.sum)
	}
}

// A state file that differs from its snapshot.json in a byte or in its
// size is unusable.
func TestCheckState(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	state := filepath.Join(dir, SnapshotStateFile)
	if err := os.WriteFile(state, []byte("the saved machine"), 0o600); err != nil {
		t.Fatal(err)
	}
	size, sum, err := fileDigest(ctx, state)
	if err != nil {
		t.Fatal(err)
	}
	m := SnapshotMeta{StateBytes: size, StateSHA256: sum}
	if err := checkState(ctx, dir, m); err != nil {
		t.Fatalf("the file as saved: %v", err)
	}
	for _, content := range []string{"the saved machinE", "the saved machin"} {
		os.WriteFile(state, []byte(content), 0o600)
		if err := checkStateAsync(ctx, dir, m).wait(); err == nil {
			t.Errorf("state %q passed as %q", content, "the saved machine")
		}
	}
}

// A check abandoned with its start does not call the snapshot unusable:
// the agent removes unusable snapshots.
func TestCheckStateCancelledIsNotUnusable(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, SnapshotStateFile), []byte("the saved machine"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := checkState(ctx, dir, SnapshotMeta{StateBytes: 17, StateSHA256: "whatever"})
	if err == nil || errors.Is(err, ErrSnapshotUnusable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("check with its context cancelled: %v; want context.Canceled, not unusable", err)
	}
}
