package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
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
		h := stateHash(snapshotFormat)
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
		if fsize, fsum, err := fileDigest(ctx, path, snapshotFormat); err != nil || fsize != size || fsum != sum {
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
// size is unusable, in this build's format and in format 1 (sha256),
// which snapshots taken before the upgrade are in.
func TestCheckState(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	state := filepath.Join(dir, SnapshotStateFile)
	for _, format := range []int{snapshotFormat, 1} {
		if err := os.WriteFile(state, []byte("the saved machine"), 0o600); err != nil {
			t.Fatal(err)
		}
		size, sum, err := fileDigest(ctx, state, format)
		if err != nil {
			t.Fatal(err)
		}
		m := SnapshotMeta{FormatVersion: format, StateBytes: size, StateXXH3: sum}
		if format == 1 {
			m.StateXXH3, m.StateSHA256 = "", sum
			if want := sha256.Sum256([]byte("the saved machine")); sum != hex.EncodeToString(want[:]) {
				t.Fatalf("format 1 checksum %s; want the sha256 format 1 recorded", sum)
			}
		}
		if err := checkState(ctx, dir, m); err != nil {
			t.Fatalf("format %d: the file as saved: %v", format, err)
		}
		for _, content := range []string{"the saved machinE", "the saved machin"} {
			os.WriteFile(state, []byte(content), 0o600)
			if err := checkStateAsync(ctx, dir, m).wait(); !errors.Is(err, ErrSnapshotUnusable) {
				t.Errorf("format %d: state %q passed as %q: %v", format, content, "the saved machine", err)
			}
		}
		// A checksum of the other format's length is not one.
		m.StateXXH3, m.StateSHA256 = m.StateSHA256, m.StateXXH3
		if err := checkState(ctx, dir, m); !errors.Is(err, ErrSnapshotUnusable) || !strings.Contains(err.Error(), "hex digits") {
			t.Errorf("format %d with the other format's checksum: %v", format, err)
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
	err := checkState(ctx, dir, SnapshotMeta{FormatVersion: snapshotFormat, StateBytes: 17, StateXXH3: "00112233445566778899aabbccddeeff"})
	if err == nil || errors.Is(err, ErrSnapshotUnusable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("check with its context cancelled: %v; want context.Canceled, not unusable", err)
	}
}

// A snapshot.json of a format this build does not read is refused
// before anything of it is used; one a newer build wrote is whole for
// that build and not called unusable (the agent removes unusable ones).
func TestReadSnapshotMetaFormats(t *testing.T) {
	for _, c := range []struct {
		format     int
		unusable   bool
		wantSubstr string
	}{
		{0, true, "this build reads [1 2]"},
		{snapshotFormat + 1, false, "a newer kibotos wrote it"},
	} {
		dir := t.TempDir()
		b := fmt.Appendf(nil, `{"format_version": %d, "instance_id": "vm-a", "state_bytes": 17, "state_xxh3": "00112233445566778899aabbccddeeff"}`, c.format)
		if err := os.WriteFile(filepath.Join(dir, SnapshotMetaFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := readSnapshotMeta(dir)
		if err == nil || errors.Is(err, ErrSnapshotUnusable) != c.unusable || !strings.Contains(err.Error(), c.wantSubstr) {
			t.Errorf("format %d: %v; want unusable %v and %q", c.format, err, c.unusable, c.wantSubstr)
		}
	}
}

// A snapshot.json from a pool whose recorded configuration a guest must
// not be told (a network, a relative mount target) is unusable, and one
// within bounds reads back with it.
func TestReadSnapshotMetaConfigured(t *testing.T) {
	for _, c := range []struct {
		configured string
		refused    string
	}{
		{`{"hostname": "ws-1", "mounts": [{"source": "proc", "target": "/rootfs/proc", "fstype": "proc"}]}`, ""},
		{`{"dns": ["10.0.0.1"]}`, "holds a network"},
		{`{"mounts": [{"source": "tmpfs", "target": "rootfs/x"}]}`, "is not one a guest is told"},
	} {
		dir := t.TempDir()
		b := fmt.Appendf(nil, `{"format_version": 2, "instance_id": "vm-a", "state_bytes": 17, "state_xxh3": "00112233445566778899aabbccddeeff",
			"compat": {"installation_id": "sha256-a", "qemu_version": "7.2", "accel": "tcg", "memory_mib": 256, "vcpus": 1}, "configured": %s}`, c.configured)
		if err := os.WriteFile(filepath.Join(dir, SnapshotMetaFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := readSnapshotMeta(dir)
		switch {
		case c.refused == "" && (err != nil || m.Configured == nil || m.Configured.Hostname != "ws-1"):
			t.Errorf("%s: %+v, %v; want it read with its configuration", c.configured, m.Configured, err)
		case c.refused != "" && (!errors.Is(err, ErrSnapshotUnusable) || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("%s: %v; want unusable, %q", c.configured, err, c.refused)
		}
	}
}
