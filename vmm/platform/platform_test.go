package platform

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

func TestLZ4LegacyDecodeMatchesTool(t *testing.T) {
	lz4 := testenv.LookPath(t, "lz4", "lz4") // makes the reference frames
	// Compressible text, random bytes and long runs, over two 8 MiB blocks.
	var in bytes.Buffer
	r := rand.New(rand.NewSource(1))
	for in.Len() < 9<<20 {
		switch r.Intn(3) {
		case 0:
			in.WriteString(strings.Repeat("kibotos platform ", 1+r.Intn(50)))
		case 1:
			b := make([]byte, r.Intn(4096))
			r.Read(b)
			in.Write(b)
		default:
			in.Write(bytes.Repeat([]byte{byte(r.Intn(256))}, r.Intn(70000)))
		}
	}
	cmd := exec.Command(lz4, "-l", "-c1", "-")
	cmd.Stdin = bytes.NewReader(in.Bytes())
	frame, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	out, err := lz4LegacyDecode(frame, in.Len())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, in.Bytes()) {
		t.Fatalf("decoded %d bytes differ from the %d input bytes", len(out), in.Len())
	}
	if _, err := lz4LegacyDecode(frame[:len(frame)/2], 0); err == nil {
		t.Fatal("truncated frame decoded without error")
	}
}

func TestLZ4DecodeBlockOverlap(t *testing.T) {
	// token: 1 literal, match length 4+6; offset 1 repeats the literal.
	blk := []byte{0x16, 'a', 1, 0, 0x10, 'b'}
	out, err := lz4DecodeBlock(nil, blk)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "aaaaaaaaaaab" {
		t.Fatalf("got %q", out)
	}
	if _, err := lz4DecodeBlock(nil, []byte{0x10, 'a', 5, 0}); err == nil {
		t.Fatal("offset past the start decoded without error")
	}
}

func TestBzImagePayloadFallsBackToMagic(t *testing.T) {
	img := append([]byte("junk-without-header"), lz4LegacyMagic...)
	img = append(img, 1, 2, 3)
	p, err := bzImagePayload(img)
	if err != nil || !bytes.HasPrefix(p, lz4LegacyMagic) || len(p) != 7 {
		t.Fatalf("payload %x, %v", p, err)
	}
	if _, err := bzImagePayload([]byte("nothing here")); err == nil {
		t.Fatal("want an error without header or magic")
	}
	// With a header the payload is exactly payload_offset/payload_length.
	hdr := make([]byte, 3*512+64)
	hdr[0x1f1] = 2
	copy(hdr[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(hdr[0x206:], 0x20f)
	binary.LittleEndian.PutUint32(hdr[0x248:], 10)
	binary.LittleEndian.PutUint32(hdr[0x24c:], 20)
	p, err = bzImagePayload(hdr)
	if err != nil || len(p) != 20 || &p[0] != &hdr[3*512+10] {
		t.Fatalf("header payload: len %d, %v", len(p), err)
	}
}

// readCpio parses a newc archive into name -> (mode, content).
func readCpio(t *testing.T, b []byte) map[string]cpioEntry {
	t.Helper()
	out := map[string]cpioEntry{}
	off := 0
	field := func(i int) int {
		var v int
		for _, c := range b[off+6+8*i : off+6+8*i+8] {
			v = v*16 + strings.IndexByte("0123456789ABCDEF", c)
		}
		return v
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d", off)
		}
		mode, size, rmaj, rmin, nsz := field(1), field(6), field(9), field(10), field(11)
		name := string(b[off+110 : off+110+nsz-1])
		data := off + align(110+nsz)
		if name == "TRAILER!!!" {
			return out
		}
		out[name] = cpioEntry{name: name, mode: uint32(mode), data: b[data : data+size], major: uint32(rmaj), minor: uint32(rmin)}
		off = align(data + size)
	}
}

func TestCpioTree(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	tree := cpioTree{}
	tree.file("a/b/c/file", src, 0o755)
	tree.bytes("init", []byte("#!/bin/sh\n"), 0o755)
	tree.symlink("sbin", "bin")
	tree.chardev("dev/console", 0o600, 5, 1)
	var buf bytes.Buffer
	if err := tree.write(&buf); err != nil {
		t.Fatal(err)
	}
	got := readCpio(t, buf.Bytes())
	for _, d := range []string{"a", "a/b", "a/b/c", "dev"} {
		if got[d].mode != modeDir|0o755 {
			t.Errorf("%s: mode %o, want a directory", d, got[d].mode)
		}
	}
	if e := got["a/b/c/file"]; string(e.data) != "hello" || e.mode != modeFile|0o755 {
		t.Errorf("file: %q mode %o", e.data, e.mode)
	}
	if e := got["sbin"]; string(e.data) != "bin" || e.mode != modeLink|0o777 {
		t.Errorf("symlink: %q mode %o", e.data, e.mode)
	}
	if e := got["dev/console"]; e.mode != modeChr|0o600 || e.major != 5 || e.minor != 1 {
		t.Errorf("console: mode %o %d:%d", e.mode, e.major, e.minor)
	}
	// Same tree, same bytes: the Platform id depends on it.
	var again bytes.Buffer
	if err := tree.write(&again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Fatal("two writes of one tree differ")
	}
	cmd := exec.Command(testenv.LookPath(t, "cpio", "cpio"), "-t", "--quiet")
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cpio -t rejects the archive: %v", err)
	}
	if !strings.Contains(string(out), "a/b/c/file\n") {
		t.Fatalf("cpio -t lists:\n%s", out)
	}
}

func TestCheckStatic(t *testing.T) {
	if _, err := os.Stat("/bin/busybox"); err == nil {
		if err := checkStatic("/bin/busybox", "busybox", "x"); err != nil && !strings.Contains(err.Error(), "dynamically") {
			t.Fatal(err)
		}
	}
	for _, dyn := range []string{"/bin/sh", "/usr/bin/env"} {
		if _, err := os.Stat(dyn); err != nil {
			continue
		}
		real, _ := filepath.EvalSymlinks(dyn)
		err := checkStatic(real, "agent binary", "build kibotos with CGO_ENABLED=0")
		if err == nil {
			continue // a static system binary: nothing to learn
		}
		if !strings.Contains(err.Error(), "dynamically linked") || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
			t.Fatalf("unclear error: %v", err)
		}
		return
	}
	t.Log("no dynamically linked binary found to check against")
}

func TestCheckStaticNotELF(t *testing.T) {
	p := filepath.Join(t.TempDir(), "script")
	os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755)
	if err := checkStatic(p, "agent binary", "x"); err == nil || !strings.Contains(err.Error(), "not a readable ELF") {
		t.Fatalf("err = %v", err)
	}
}

func writeInstallation(t *testing.T, root string, created time.Time, content string) *Installation {
	t.Helper()
	tmp := filepath.Join(InstallationsDir(root), ".x.tmp")
	os.MkdirAll(tmp, 0o755)
	kf, err := writeContent(filepath.Join(tmp, KernelFile), func(w io.Writer) error { _, err := io.WriteString(w, "k"+content); return err })
	if err != nil {
		t.Fatal(err)
	}
	rf, err := writeContent(filepath.Join(tmp, InitrdFile), func(w io.Writer) error { _, err := io.WriteString(w, "i"+content); return err })
	if err != nil {
		t.Fatal(err)
	}
	in := &Installation{FormatVersion: FormatVersion, Kind: Kind, KernelVersion: "6.1", CreatedAt: created, Files: []File{kf, rf}}
	in.ID = contentID(in.Files)
	raw, _ := json.Marshal(in)
	os.WriteFile(filepath.Join(tmp, ManifestFile), raw, 0o644)
	if err := os.Rename(tmp, filepath.Join(InstallationsDir(root), in.ID)); err != nil {
		t.Fatal(err)
	}
	return in
}

func TestLoadAndList(t *testing.T) {
	root := t.TempDir()
	if l, err := List(root); err != nil || len(l) != 0 {
		t.Fatalf("empty root: %v, %v", l, err)
	}
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	old := writeInstallation(t, root, t0, "old")
	young := writeInstallation(t, root, t0.Add(time.Hour), "young")
	if old.ID == young.ID {
		t.Fatal("different content, same id")
	}
	// A runtime installation and a build in progress are not Platforms.
	other := filepath.Join(InstallationsDir(root), "sha256-other")
	os.MkdirAll(other, 0o755)
	os.WriteFile(filepath.Join(other, ManifestFile), []byte(`{"kind":"runtime"}`), 0o644)
	os.MkdirAll(filepath.Join(InstallationsDir(root), ".platform-build-1.tmp"), 0o755)

	l, err := List(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 2 || l[0].ID != young.ID || l[1].ID != old.ID {
		t.Fatalf("list: %+v", l)
	}
	if l[0].Kernel() != filepath.Join(InstallationsDir(root), young.ID, KernelFile) {
		t.Fatalf("kernel path %s", l[0].Kernel())
	}

	// A truncated file breaks that Platform only.
	os.WriteFile(filepath.Join(InstallationsDir(root), old.ID, InitrdFile), nil, 0o644)
	l, err = List(root)
	if err == nil || !strings.Contains(err.Error(), "recorded") || len(l) != 1 {
		t.Fatalf("list with a broken platform: %d, %v", len(l), err)
	}
	if _, err := Load(other); err == nil || !strings.Contains(err.Error(), "not a platform") {
		t.Fatalf("load runtime: %v", err)
	}
}

func TestContentIDOrderIndependent(t *testing.T) {
	a := []File{{Name: "vmlinux", SHA256: "aa", Size: 1}, {Name: "initramfs.cpio.gz", SHA256: "bb", Size: 2}}
	b := []File{a[1], a[0]}
	if contentID(a) != contentID(b) || !strings.HasPrefix(contentID(a), "sha256-") || len(contentID(a)) != 7+64 {
		t.Fatalf("ids %s %s", contentID(a), contentID(b))
	}
}
