package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TreeDigest is a digest of everything under dir: each entry's path, type,
// mode, size, modification time and, for regular files, content. Tests of
// read-only commands compare it before and after (sockets and other
// special files count by name and mode only).
func TreeDigest(t testing.TB, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		fmt.Fprintf(h, "%s %v %d %d\n", rel, info.Mode(), info.Size(), info.ModTime().UnixNano())
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(h, f)
		return err
	})
	if err != nil {
		t.Fatalf("digest of %s: %v", dir, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
