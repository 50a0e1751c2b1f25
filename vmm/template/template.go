// Package template builds Workspace root filesystems: an ext4 image made
// from a directory or a rootfs tarball, content-addressed under
// <storage root>/templates/sha256-<digest>/ with a template.json. A
// Workspace boots with its template image as the read-only base of its
// retained writable layer (a qcow2 overlay), so the image is never written.
//
// This package keeps templates on the node that built them; the cluster
// registry and distribution to other nodes come with Workspaces.
package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/recordfmt"
	"github.com/kibotos/kibotos/storagepool"
)

// FormatVersion of template.json.
const FormatVersion = 1

// ImageFile is the ext4 image inside a template directory.
const ImageFile = "rootfs.ext4"

// Template is one built template.
type Template struct {
	FormatVersion int       `json:"format_version"`
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	Source        string    `json:"source"`
	Files         int       `json:"files"`
	ContentBytes  int64     `json:"content_bytes"`
	ImageBytes    int64     `json:"image_bytes"`
	CreatedAt     time.Time `json:"created_at"`
	// Dir is where it lives (not stored).
	Dir string `json:"-"`
	// ImageDigest is the image's digest in the artifact store (sha256:),
	// once it was published from here or fetched here and verified;
	// kept in ImageDigestFile beside the image.
	ImageDigest string `json:"-"`
}

// ImageDigestFile holds a template's ImageDigest.
const ImageDigestFile = "image.sha256"

var imageDigestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// SetImageDigest records the digest the image hashed to as it was put
// into or fetched from the artifact store.
func (t *Template) SetImageDigest(digest string) error {
	if !imageDigestRE.MatchString(digest) {
		return fmt.Errorf("template %s: image digest %.80q is not sha256: and 64 hex digits", t.Name, digest)
	}
	if err := storagepool.WriteFile(filepath.Join(t.Dir, ImageDigestFile), []byte(digest+"\n"), 0o400, storagepool.Temp{Purpose: "record"}); err != nil {
		return fmt.Errorf("template %s: %w", t.Name, err)
	}
	t.ImageDigest = digest
	return nil
}

// Image is the path of the ext4 image.
func (t *Template) Image() string { return filepath.Join(t.Dir, ImageFile) }

// Options of Build; exactly one of FromDir and FromTar.
type Options struct {
	StorageRoot string
	Name        string
	FromDir     string
	FromTar     string
	// SizeMiB of the image; 0: the content plus half again plus 64 MiB.
	SizeMiB int
	// Source is recorded in template.json; default dir:FromDir or
	// tar:FromTar.
	Source string
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)

// Dir is where templates live.
func Dir(storageRoot string) string { return filepath.Join(storageRoot, "templates") }

// Build makes the template image. The same content under the same name
// gives the same id and reuses the existing image.
func Build(ctx context.Context, o Options) (*Template, error) {
	if !nameRE.MatchString(o.Name) {
		return nil, fmt.Errorf("template name %q is not valid: use 1-63 lower-case letters, digits, '.' or '-'", o.Name)
	}
	if (o.FromDir == "") == (o.FromTar == "") {
		return nil, errors.New("template " + o.Name + ": give exactly one of --from-dir and --from-tar")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return nil, errors.New("template " + o.Name + ": mkfs.ext4 not found: install the Debian package e2fsprogs")
	}
	root := Dir(o.StorageRoot)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(root, ".build-"+o.Name+"-*.tmp")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	src, source := o.FromDir, "dir:"+o.FromDir
	if o.FromTar != "" {
		src, source = filepath.Join(work, "tree"), "tar:"+o.FromTar
		if err := extract(ctx, o.FromTar, src); err != nil {
			return nil, fmt.Errorf("template %s: %w", o.Name, err)
		}
	}
	if o.Source != "" {
		source = o.Source
	}
	digest, files, size, err := treeDigest(src, o.Name)
	if err != nil {
		return nil, fmt.Errorf("template %s: read %s: %w", o.Name, src, err)
	}
	id := "sha256-" + digest
	final := filepath.Join(root, id)
	if t, err := Load(final); err == nil {
		return t, nil
	}
	sizeMiB := o.SizeMiB
	if sizeMiB == 0 {
		sizeMiB = int(size*3/2>>20) + 64
	}
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o700); err != nil {
		return nil, err
	}
	img := filepath.Join(out, ImageFile)
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "kibotos-root", "-E", "root_owner=0:0", "-d", src, img, fmt.Sprintf("%dM", sizeMiB))
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("template %s: mkfs.ext4: %v: %s (is --size big enough for %d MiB of content?)", o.Name, err, strings.TrimSpace(string(b)), size>>20)
	}
	st, err := os.Stat(img)
	if err != nil {
		return nil, err
	}
	t := &Template{FormatVersion: FormatVersion, ID: id, Name: o.Name, Source: source, Files: files, ContentBytes: size, ImageBytes: st.Size(), CreatedAt: time.Now().UTC()}
	raw, _ := json.MarshalIndent(t, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "template.json"), raw, 0o600); err != nil {
		return nil, err
	}
	if err := os.Chmod(img, 0o400); err != nil { // the base of every layer: never written
		return nil, err
	}
	if err := os.Rename(out, final); err != nil {
		if t2, lerr := Load(final); lerr == nil {
			return t2, nil // built concurrently
		}
		return nil, fmt.Errorf("template %s: %w", o.Name, err)
	}
	t.Dir = final
	return t, nil
}

func extract(ctx context.Context, tarball, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "tar", "-xf", tarball, "-C", dst, "--numeric-owner", "--same-permissions")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("extract %s: %v: %s", tarball, err, strings.TrimSpace(string(b)))
	}
	return nil
}

// treeDigest hashes names, modes, owners, link targets and contents in
// path order, so the id depends on the content only.
func treeDigest(dir, name string) (string, int, int64, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		return "", 0, 0, err
	}
	sort.Strings(paths)
	h := sha256.New()
	fmt.Fprintf(h, "kibotos-template v%d %s\n", FormatVersion, name)
	var size int64
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return "", 0, 0, err
		}
		rel, _ := filepath.Rel(dir, p)
		uid, gid := uint32(0), uint32(0)
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = st.Uid, st.Gid
		}
		fmt.Fprintf(h, "%s %o %d %d", rel, fi.Mode(), uid, gid)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return "", 0, 0, err
			}
			fmt.Fprintf(h, " -> %s", target)
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return "", 0, 0, err
			}
			fh := sha256.New()
			n, err := io.Copy(fh, f)
			f.Close()
			if err != nil {
				return "", 0, 0, err
			}
			size += n
			fmt.Fprintf(h, " %d %x", n, fh.Sum(nil))
		}
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil)), len(paths), size, nil
}

// Load reads one template directory.
func Load(dir string) (*Template, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "template.json"))
	if err != nil {
		return nil, err
	}
	if err := recordfmt.Current(FormatVersion).CheckJSON(dir, raw, 0); err != nil {
		return nil, fmt.Errorf("template record %w", err)
	}
	var t Template
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("template record %s is corrupt: %w", dir, err)
	}
	t.Dir = dir
	if _, err := os.Stat(t.Image()); err != nil {
		return nil, fmt.Errorf("template %s: image missing: %w", t.Name, err)
	}
	// A digest file that is not one is ignored: the node then holds no
	// verified copy, and a fetch or publish writes it again.
	if raw, err := os.ReadFile(filepath.Join(dir, ImageDigestFile)); err == nil && imageDigestRE.MatchString(strings.TrimSpace(string(raw))) {
		t.ImageDigest = strings.TrimSpace(string(raw))
	}
	return &t, nil
}

// List returns every template, by name, newest first within a name.
func List(storageRoot string) ([]*Template, error) {
	entries, err := os.ReadDir(Dir(storageRoot))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Template
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "sha256-") {
			continue
		}
		t, err := Load(filepath.Join(Dir(storageRoot), e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].CreatedAt.After(out[j].CreatedAt)
	})
	return out, errors.Join(errs...)
}

// Get returns the newest template with the name.
func Get(storageRoot, name string) (*Template, error) {
	all, err := List(storageRoot)
	for _, t := range all {
		if t.Name == name {
			return t, nil
		}
	}
	if err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("template %s not found on this node: build it with kibotos template build %s --from-dir DIR (or --from-tar FILE, or --debootstrap)", name, name)
}

// Delete removes every build of the name.
func Delete(storageRoot, name string) (int, error) {
	all, err := List(storageRoot)
	n := 0
	for _, t := range all {
		if t.Name != name {
			continue
		}
		if rerr := os.RemoveAll(t.Dir); rerr != nil {
			return n, rerr
		}
		n++
	}
	if n == 0 && err == nil {
		return 0, fmt.Errorf("template %s not found on this node", name)
	}
	return n, err
}
