package platform

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeInstallation writes a Platform with small content files under
// storageRoot, as Build lays one out.
func fakeInstallation(t *testing.T, storageRoot string) *Installation {
	t.Helper()
	tmp := t.TempDir()
	var files []File
	for name, content := range map[string]string{KernelFile: "vmlinux bytes", InitrdFile: "initramfs bytes"} {
		f, err := writeContent(filepath.Join(tmp, name), func(w io.Writer) error { _, err := w.Write([]byte(content)); return err })
		if err != nil {
			t.Fatal(err)
		}
		f.Name = name
		files = append(files, f)
	}
	in := &Installation{FormatVersion: FormatVersion, Kind: Kind, KernelVersion: "6.1.0-28-cloud-amd64", AgentSHA256: strings.Repeat("5", 64), Files: files, CreatedAt: time.Unix(1, 0).UTC()}
	in.ID = contentID(files)
	dir := filepath.Join(InstallationsDir(storageRoot), in.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := os.Rename(filepath.Join(tmp, f.Name), filepath.Join(dir, f.Name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeManifest(dir, ManifestFile, in); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return loaded
}

func archiveOf(t *testing.T, in *Installation) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteArchive(in, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func installFrom(root, id string, archive []byte) (*Installation, error) {
	return Install(context.Background(), root, id, func(_ context.Context, path string) error { return os.WriteFile(path, archive, 0o600) })
}

// A Platform archived on one host installs on another as the same,
// verified Platform; the same installation gives the same archive.
func TestArchiveInstallsTheSamePlatform(t *testing.T) {
	in := fakeInstallation(t, t.TempDir())
	archive := archiveOf(t, in)
	if !bytes.Equal(archive, archiveOf(t, in)) {
		t.Fatal("two archives of one installation differ")
	}
	root := t.TempDir()
	got, err := installFrom(root, in.ID, archive)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != in.ID || got.Dir != filepath.Join(InstallationsDir(root), in.ID) || got.Verify() != nil {
		t.Fatalf("installed %+v", got)
	}
	if _, err := os.Stat(FetchDir(root, in.ID)); !os.IsNotExist(err) {
		t.Fatalf("fetch dir left behind: %v", err)
	}
	if l, _ := List(root); len(l) != 1 {
		t.Fatalf("List sees %d Platforms", len(l))
	}
}

// An archive is untrusted: another Platform, other names, links, doubled
// or changed files are refused and nothing is installed.
func TestArchiveRefusesWhatIsNotThePlatform(t *testing.T) {
	src := t.TempDir()
	in := fakeInstallation(t, src)
	other := "sha256-" + strings.Repeat("0", 64)
	entry := func(hdr *tar.Header, body string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, name := range []string{ManifestFile, KernelFile, InitrdFile} {
			raw, _ := os.ReadFile(filepath.Join(in.Dir, name))
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(raw))})
			tw.Write(raw)
		}
		if hdr != nil {
			hdr.Size = int64(len(body))
			tw.WriteHeader(hdr)
			tw.Write([]byte(body))
		}
		tw.Close()
		return buf.Bytes()
	}
	flipped := archiveOf(t, in)
	i := bytes.Index(flipped, []byte("vmlinux bytes"))
	flipped[i] ^= 1
	for name, c := range map[string]struct {
		id      string
		archive []byte
		want    string
	}{
		"another id":   {other, archiveOf(t, in), "does not match its directory"},
		"escape":       {in.ID, entry(&tar.Header{Typeflag: tar.TypeReg, Name: "../../evil", Mode: 0o644}, "x"), "not a file of a Platform"},
		"symlink":      {in.ID, entry(&tar.Header{Typeflag: tar.TypeSymlink, Name: KernelFile, Linkname: "/etc/shadow"}, ""), "other than a regular file"},
		"twice":        {in.ID, entry(&tar.Header{Typeflag: tar.TypeReg, Name: KernelFile, Mode: 0o644}, "x"), "twice"},
		"flipped byte": {in.ID, flipped, "sha256"},
		"not a tar":    {in.ID, []byte("hello"), "tar"},
	} {
		root := t.TempDir()
		_, err := installFrom(root, c.id, c.archive)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
		if l, _ := List(root); len(l) != 0 {
			t.Errorf("%s: installed %d Platforms", name, len(l))
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(root), "evil")); err == nil {
			t.Errorf("%s: wrote outside the storage root", name)
		}
	}
}
