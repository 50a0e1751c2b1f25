package platform

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/kibotos/kibotos/internal/tarfile"
	"github.com/kibotos/kibotos/storagepool"
)

// A published Platform travels through the artifact store as a tar of its
// installation directory: installation.json and its content files, all
// regular, nothing else. The archive is untrusted when it comes back: only
// those names are unpacked, each bounded, and the result must load as the
// Platform the catalog names (its id is the digest of its files) and verify.

// maxArchiveFile bounds one file of an archive (a kernel and an
// initramfs are tens of MiB).
const maxArchiveFile = 2 << 30

// WriteArchive writes in's directory as a Platform archive.
func WriteArchive(in *Installation, w io.Writer) error {
	tw := tar.NewWriter(w)
	names := []string{ManifestFile}
	for _, f := range in.Files {
		names = append(names, f.Name)
	}
	for _, name := range names {
		if err := tarfile.Add(tw, name, filepath.Join(in.Dir, name), 0o644); err != nil {
			return fmt.Errorf("platform %s: archive %s: %w", in.ID, name, err)
		}
	}
	return tw.Close()
}

// FetchDir is where the archive of Platform id is fetched and unpacked
// before it is installed: the same path on every attempt, so an
// interrupted fetch continues. Its name starts with a dot, so List and
// the removal of unused installations leave it alone.
func FetchDir(storageRoot, id string) string {
	return filepath.Join(InstallationsDir(storageRoot), ".fetch-"+strings.TrimPrefix(id, "sha256-"))
}

// ArchiveFile is the archive's name inside FetchDir.
const ArchiveFile = "platform.tar"

// Install puts the published Platform id in place on this node: fetch
// writes (and verifies against the catalog's digest) the archive at the
// path it is given, which is then unpacked, loaded, verified and renamed
// into place. An installation of id already here is returned as it is.
// Callers serialize installs of one Platform.
func Install(ctx context.Context, storageRoot, id string, fetch func(ctx context.Context, archive string) error) (*Installation, error) {
	if !strings.HasPrefix(id, "sha256-") || len(id) != len("sha256-")+64 || strings.ContainsAny(id, "/.") {
		return nil, fmt.Errorf("platform id %.80q is not sha256- and 64 hex digits", id)
	}
	final := filepath.Join(InstallationsDir(storageRoot), id)
	if in, err := Load(final); err == nil {
		return in, nil
	}
	work := FetchDir(storageRoot, id)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, fmt.Errorf("platform %s: %w", id, err)
	}
	archive := filepath.Join(work, ArchiveFile)
	if err := fetch(ctx, archive); err != nil {
		return nil, err
	}
	dir := filepath.Join(work, id)
	if err := os.RemoveAll(dir); err != nil { // a torn unpack of an earlier attempt
		return nil, fmt.Errorf("platform %s: %w", id, err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("platform %s: %w", id, err)
	}
	if err := unpackArchive(archive, dir); err != nil {
		return nil, fmt.Errorf("platform %s: the archive %w", id, err)
	}
	in, err := Load(dir)
	if err == nil {
		err = in.Verify()
	}
	if err != nil {
		return nil, fmt.Errorf("platform %s: the fetched archive does not hold it: %w", id, err)
	}
	storagepool.SyncDir(dir)
	if err := os.Rename(dir, final); err != nil {
		if in2, lerr := Load(final); lerr == nil {
			return in2, nil // installed concurrently
		}
		return nil, fmt.Errorf("platform %s: %w", id, err)
	}
	storagepool.SyncDir(InstallationsDir(storageRoot))
	os.RemoveAll(work)
	return Load(final)
}

// unpackArchive writes the archive's files into dir: only the names a
// Platform has, regular, each once and bounded.
func unpackArchive(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	allowed := map[string]bool{ManifestFile: true, KernelFile: true, InitrdFile: true}
	seen := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("is not a readable tar: %w", err)
		}
		switch {
		case !allowed[hdr.Name]:
			return fmt.Errorf("holds %.80q, which is not a file of a Platform (%s, %s, %s)", hdr.Name, ManifestFile, KernelFile, InitrdFile)
		case hdr.Typeflag != tar.TypeReg:
			return fmt.Errorf("holds %s as something other than a regular file", hdr.Name)
		case seen[hdr.Name]:
			return fmt.Errorf("holds %s twice", hdr.Name)
		case hdr.Size < 0 || hdr.Size > maxArchiveFile:
			return fmt.Errorf("holds %s of %d bytes: at most %d", hdr.Name, hdr.Size, int64(maxArchiveFile))
		}
		seen[hdr.Name] = true
		if err := tarfile.Extract(tr, hdr.Size, filepath.Join(dir, hdr.Name), 0o644); err != nil {
			return fmt.Errorf("file %s: %w", hdr.Name, err)
		}
	}
	if !seen[ManifestFile] {
		return fmt.Errorf("lacks %s", ManifestFile)
	}
	return nil
}
