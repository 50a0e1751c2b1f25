package storagepool

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
)

// ext4Blocks reads the block count and block size of the ext4 superblock
// at byte 1024 of path (magic 0xEF53 at offset 56).
func ext4Blocks(t *testing.T, path string) (blocks uint64, blockSize uint64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		t.Fatal(err)
	}
	if magic := binary.LittleEndian.Uint16(sb[56:]); magic != 0xEF53 {
		t.Fatalf("%s: no ext4 superblock (magic %#x)", path, magic)
	}
	lo, hi := binary.LittleEndian.Uint32(sb[4:]), binary.LittleEndian.Uint32(sb[0x150:])
	return uint64(hi)<<32 | uint64(lo), 1024 << binary.LittleEndian.Uint32(sb[24:])
}

func TestVolumeFile(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	pool := t.TempDir()
	path := filepath.Join(pool, "volumes", "data", "vol-abc.img")
	ctx := context.Background()
	if err := CreateVolume(ctx, "node-a", path, 64<<20); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Size() != 64<<20 || st.Mode().Perm() != 0o600 {
		t.Fatalf("volume file %v %v", st, err)
	}
	if blocks, bs := ext4Blocks(t, path); bs != 4096 || blocks != 64<<20/4096 {
		t.Fatalf("filesystem of %d blocks of %d bytes", blocks, bs)
	}
	// No temporary file left; a second create keeps the file as it is.
	if names := dirNames(t, filepath.Dir(path)); len(names) != 1 || names[0] != "vol-abc.img" {
		t.Fatalf("directory holds %v", names)
	}
	os.WriteFile(path+".marker", nil, 0o600)
	f, _ := os.OpenFile(path, os.O_WRONLY, 0)
	f.WriteAt([]byte("data"), 10<<20)
	f.Close()
	if err := CreateVolume(ctx, "node-a", path, 128<<20); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); len(b) != 64<<20 || string(b[10<<20:10<<20+4]) != "data" {
		t.Fatal("a repeated create replaced the file")
	}
	// Grow only: a smaller size changes nothing.
	if err := GrowVolume(path, 256<<20); err != nil {
		t.Fatal(err)
	}
	if err := GrowVolume(path, 128<<20); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Size() != 256<<20 {
		t.Fatalf("size after grow and a smaller grow: %d", st.Size())
	}
	if err := GrowVolume(filepath.Join(pool, "missing.img"), 1<<20); err == nil {
		t.Error("grow of a missing file succeeded")
	}
	os.Symlink(path, filepath.Join(pool, "link.img"))
	if err := GrowVolume(filepath.Join(pool, "link.img"), 512<<20); err == nil {
		t.Error("grow through a symlink succeeded")
	}
	if err := WriteHolder(path, Holder{NodeID: "node-a", Grant: "inst-1"}); err != nil {
		t.Fatal(err)
	}
	if err := RemoveVolume(path); err != nil {
		t.Fatal(err)
	}
	if err := RemoveVolume(path); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if names := dirNames(t, filepath.Dir(path)); len(names) != 1 || names[0] != "vol-abc.img.marker" {
		t.Fatalf("after remove the directory holds %v", names)
	}
}
