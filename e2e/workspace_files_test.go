package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
)

// testFiles: cp of 100 MiB in and out, and of a missing file.
func (d *wsDev) testFiles(id string) {
	t := d.t
	const size = 100 << 20
	local := filepath.Join(d.tmp, "big.in")
	data := randBytes(t, size)
	if err := os.WriteFile(local, data, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	data = nil

	t0 := time.Now()
	r := d.kibo(3*time.Minute, nil, "workspace", "cp", local, id+":/root/big")
	up := time.Since(t0)
	if r.Code != 0 {
		t.Fatalf("cp in: %s", r)
	}
	if r := d.must("workspace", "exec", id, "--", "sha256sum", "/root/big"); !strings.HasPrefix(r.Stdout, want+" ") {
		t.Errorf("sha256sum of the copied file in the Workspace: %q, want %s", r.Stdout, want)
	}
	back := filepath.Join(d.tmp, "big.out")
	t0 = time.Now()
	r = d.kibo(3*time.Minute, nil, "workspace", "cp", id+":/root/big", back)
	down := time.Since(t0)
	if r.Code != 0 {
		t.Fatalf("cp out: %s", r)
	}
	if note := fmt.Sprintf("%s:/root/big: %d bytes written to %s", id, size, back); !strings.Contains(r.Stderr, note) {
		t.Errorf("cp out said %q; want %q", r.Stderr, note)
	}
	if got := wsFileSHA256(t, back); got != want {
		t.Errorf("cp in and back out: sha256 %s, want %s", got, want)
	}
	mbps := func(d time.Duration) float64 { return float64(size) / 1e6 / d.Seconds() }
	t.Logf("TIMING cp 100 MiB: in %s (%.1f MB/s), out %s (%.1f MB/s)", up.Round(time.Millisecond), mbps(up), down.Round(time.Millisecond), mbps(down))
	os.Remove(local)
	os.Remove(back)
	d.must("workspace", "exec", id, "--", "rm", "/root/big")

	missing := filepath.Join(d.tmp, "missing.out")
	r = d.kibo(time.Minute, nil, "workspace", "cp", id+":/root/nosuch", missing)
	if r.Code != api.ExitNotFound || !strings.Contains(r.Stderr, id+": /root/nosuch: no such file") {
		t.Errorf("cp of a missing file: want exit 12 and a message naming it: %s", r)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cp of a missing file left %s behind (%v)", missing, err)
	}

	// Into a directory that is not there: said in the Workspace's terms,
	// before anything is sent. Onto a directory: into it, as cp(1) does.
	// Out of a directory: refused with the way to do it.
	small := filepath.Join(d.tmp, "small.txt")
	os.WriteFile(small, []byte("small\n"), 0o600)
	r = d.kibo(time.Minute, nil, "workspace", "cp", small, id+":/nosuchdir/x")
	if r.Code != api.ExitNotFound || !strings.Contains(r.Stderr, "directory /nosuchdir does not exist: make it first (kibo workspace exec "+id+" -- mkdir -p /nosuchdir)") {
		t.Errorf("cp into a missing directory: want exit 12 naming it: %s", r)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "cp", small, id+":/root"); r.Code != 0 || !strings.Contains(r.Stderr, id+":/root/small.txt") {
		t.Errorf("cp onto a directory: want it written in it: %s", r)
	}
	if r := d.must("workspace", "exec", id, "--", "cat", "/root/small.txt"); r.Stdout != "small\n" {
		t.Errorf("the file copied onto /root: %q", r.Stdout)
	}
	r = d.kibo(time.Minute, nil, "workspace", "cp", id+":/root", filepath.Join(d.tmp, "rootdir"))
	if r.Code != 2 || !strings.Contains(r.Stderr, id+":/root is a directory; copy files one at a time (or tar them: kibo workspace exec "+id+" -- tar c -C /root . > dir.tar)") {
		t.Errorf("cp of a directory out: want exit 2 and the way to do it: %s", r)
	}
	d.must("workspace", "exec", id, "--", "rm", "/root/small.txt")
}

func wsFileSHA256(t *testing.T, path string) string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
