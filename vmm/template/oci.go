package template

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Kinds of BuildOCI errors, for errors.Is; any other is the input's fault.
var (
	// ErrImageUnavailable: the registry could not be reached or failed.
	ErrImageUnavailable = errors.New("image registry unavailable")
	// ErrImageNotFound: the registry has no such image.
	ErrImageNotFound = errors.New("image not found")
)

// Workspaces run linux/amd64: the image chosen from an index.
var workspacePlatform = v1.Platform{OS: "linux", Architecture: "amd64"}

// OCIOptions of BuildOCI; exactly one of File and Registry.
type OCIOptions struct {
	StorageRoot string
	Name        string
	// File is an uncompressed `docker save` tarball or OCI image-layout
	// archive (a tar holding oci-layout and index.json).
	File string
	// Ref picks the image of a File that holds several: a tag as docker
	// save records it (app:1) or an OCI layout's ref name.
	Ref string
	// Registry is an image reference such as localhost:5000/app:1 or
	// docker.io/library/debian:12; credentials are the Docker config's,
	// and a registry on a loopback address is spoken to over plain http.
	Registry string
	// SizeMiB of the image; 0: as Build. It also bounds the image's
	// files, which are otherwise bounded by unpackMaxBytes.
	SizeMiB int
	// Progress, if set, hears how far the layers are, from another
	// goroutine.
	Progress func(OCIProgress)
}

// OCIProgress is how far BuildOCI read the image's layers.
type OCIProgress struct {
	Layers, LayersDone int
	Bytes              int64 // uncompressed layer bytes read
}

// BuildOCI builds a template from an OCI or Docker image: its layers are
// flattened with their whiteouts (mutate.Extract), unpacked into a tree
// as untrusted input (unpacker), the image config's Env, WorkingDir and
// User written to guestproto.ImageConfigPath in the tree, and the tree
// imaged by Build. The same image gives the same template id, whether it
// came from a file or a registry.
func BuildOCI(ctx context.Context, o OCIOptions) (*Template, error) {
	if !nameRE.MatchString(o.Name) {
		return nil, fmt.Errorf("template name %q is not valid: use 1-63 lower-case letters, digits, '.' or '-'", o.Name)
	}
	if (o.File == "") == (o.Registry == "") {
		return nil, fmt.Errorf("template %s: give exactly one of an image file and a registry reference", o.Name)
	}
	if o.SizeMiB < 0 {
		return nil, fmt.Errorf("template %s: size %d MiB is negative", o.Name, o.SizeMiB)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return nil, errors.New("template " + o.Name + ": mkfs.ext4 not found: install the Debian package e2fsprogs")
	}
	if err := os.MkdirAll(Dir(o.StorageRoot), 0o700); err != nil {
		return nil, err
	}
	// Under the storage root, not /tmp: an image's tree is as large as
	// the image and may hold device nodes.
	work, err := os.MkdirTemp(Dir(o.StorageRoot), ".oci-"+o.Name+"-*.tmp")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	var img v1.Image
	var source string
	if o.File != "" {
		img, source, err = o.fileImage(ctx, work)
	} else {
		img, source, err = o.registryImage(ctx)
	}
	if err != nil {
		return nil, err
	}
	what := "image file " + o.File
	if o.Registry != "" {
		what = "image " + strings.TrimPrefix(source, "registry:")
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, o.imageErr(what, "read the image config", readError{err})
	}
	if (cfg.OS != "" && cfg.OS != workspacePlatform.OS) || (cfg.Architecture != "" && cfg.Architecture != workspacePlatform.Architecture) {
		return nil, fmt.Errorf("template %s: %s is a %s/%s image; Workspaces run %s/%s", o.Name, what, cfg.OS, cfg.Architecture, workspacePlatform.OS, workspacePlatform.Architecture)
	}
	tree := filepath.Join(work, "rootfs")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return nil, err
	}
	u, err := newUnpacker(tree, int64(o.SizeMiB)<<20)
	if err != nil {
		return nil, err
	}
	defer u.Close()
	layers, err := img.Layers()
	if err != nil {
		return nil, o.imageErr(what, "read the layer list", readError{err})
	}
	count := &layerCount{layers: len(layers), report: o.Progress}
	defer count.stop()
	flat := mutate.Extract(countedImage{Image: img, c: count})
	defer flat.Close()
	if err := u.unpack(ctx, flat); err != nil {
		return nil, o.imageErr(what, "unpack", err)
	}
	ic := guestproto.ImageConfig{Env: cfg.Config.Env, WorkingDir: cfg.Config.WorkingDir, User: cfg.Config.User}
	if ic.Env == nil {
		ic.Env = []string{}
	}
	raw, _ := json.MarshalIndent(ic, "", "  ")
	if err := u.replaceFile(strings.TrimPrefix(guestproto.ImageConfigPath, "/"), append(raw, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("template %s: write the image's exec defaults: %w", o.Name, err)
	}
	return Build(ctx, Options{StorageRoot: o.StorageRoot, Name: o.Name, FromDir: tree, SizeMiB: o.SizeMiB, Source: source})
}

// imageErr names the template, the image and the step, and gives the
// error its kind: a failed read from a registry may be the registry's
// fault (registryErr); what the unpacker refuses is the image's.
func (o OCIOptions) imageErr(what, step string, err error) error {
	err = fmt.Errorf("template %s: %s: %s: %w", o.Name, what, step, err)
	var re readError
	if o.Registry != "" && errors.As(err, &re) {
		return registryErr(err)
	}
	return err
}

// registryErr gives a registry's error its kind: no such image, or the
// registry (or the way to it) failing.
func registryErr(err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		for _, d := range te.Errors {
			if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode {
				return withKind(ErrImageNotFound, err)
			}
		}
		if te.StatusCode == 404 {
			return withKind(ErrImageNotFound, err)
		}
		return withKind(ErrImageUnavailable, err)
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) {
		return withKind(ErrImageUnavailable, err)
	}
	return err
}

func (o OCIOptions) registryImage(ctx context.Context) (v1.Image, string, error) {
	ref, err := name.ParseReference(o.Registry)
	if err != nil {
		return nil, "", fmt.Errorf("template %s: %q is not an image reference such as localhost:5000/app:1 or docker.io/library/debian:12: %v", o.Name, o.Registry, err)
	}
	img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithPlatform(workspacePlatform),
		remote.WithTransport(loopbackHTTPOnly{remote.DefaultTransport}))
	if err != nil {
		return nil, "", registryErr(fmt.Errorf("template %s: image %s: %w", o.Name, ref, err))
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, "", registryErr(fmt.Errorf("template %s: image %s: %w", o.Name, ref, err))
	}
	// The digest makes the source say which image a moving tag gave.
	source := "registry:" + ref.Name()
	if _, isTag := ref.(name.Tag); isTag {
		source += "@" + digest.String()
	}
	return img, source, nil
}

// loopbackHTTPOnly refuses plain http except to a loopback address:
// go-containerregistry also falls back to it for private (RFC 1918) and
// .local registries, where whoever is on the way could then hand out
// another image for a tag.
type loopbackHTTPOnly struct{ http.RoundTripper }

func (t loopbackHTTPOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	h := req.URL.Hostname()
	if ip := net.ParseIP(h); req.URL.Scheme == "http" && h != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("plain http to %s refused: only a registry on a loopback address is spoken to without TLS", req.URL.Host)
	}
	return t.RoundTripper.RoundTrip(req)
}

// fileImage opens an image file: a docker save tarball is read in place;
// an OCI image-layout archive is unpacked (as untrusted as any layer)
// into work first.
func (o OCIOptions) fileImage(ctx context.Context, work string) (v1.Image, string, error) {
	source := "oci:" + o.File
	fail := func(format string, a ...any) (v1.Image, string, error) {
		return nil, "", fmt.Errorf("template %s: image file %s: %s", o.Name, o.File, fmt.Sprintf(format, a...))
	}
	names, err := archiveNames(o.File)
	if err != nil {
		return fail("%v", err)
	}
	switch {
	case names["manifest.json"]:
		img, err := o.dockerImage()
		if err != nil {
			return fail("%v", err)
		}
		return img, source, nil
	case names["oci-layout"] && names["index.json"]:
		dir := filepath.Join(work, "layout")
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, "", err
		}
		f, err := os.Open(o.File)
		if err != nil {
			return fail("%v", err)
		}
		defer f.Close()
		u, err := newUnpacker(dir, 0)
		if err != nil {
			return nil, "", err
		}
		defer u.Close()
		if err := u.unpack(ctx, f); err != nil {
			return fail("%v", err)
		}
		img, err := o.layoutImage(dir)
		if err != nil {
			return fail("%v", err)
		}
		return img, source, nil
	default:
		return fail("neither a docker save tarball (manifest.json) nor an OCI image-layout archive (oci-layout, index.json)")
	}
}

// archiveNames lists the top-level names of the tar file path.
func archiveNames(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var magic [2]byte
	if _, err := io.ReadFull(f, magic[:]); err == nil && magic == [2]byte{0x1f, 0x8b} {
		return nil, errors.New("is gzip-compressed: decompress it first (gunzip -k)")
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	names := map[string]bool{}
	tr := tar.NewReader(f) // skips over the contents with Seek
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return names, nil
		}
		if err != nil {
			return nil, fmt.Errorf("not a tar archive: %v", err)
		}
		if n > unpackMaxMembers {
			return nil, fmt.Errorf("more than %d members", unpackMaxMembers)
		}
		names[strings.TrimPrefix(hdr.Name, "./")] = true
	}
}

// dockerImage reads the docker save tarball o.File: its only image, or
// the one tagged o.Ref.
func (o OCIOptions) dockerImage() (v1.Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(o.File) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, err
	}
	var have []string
	for _, d := range m {
		if len(d.RepoTags) == 0 {
			have = append(have, "an untagged image")
		}
		have = append(have, d.RepoTags...)
	}
	switch {
	case len(m) == 0:
		return nil, errors.New("holds no image")
	case o.Ref == "" && len(m) > 1:
		return nil, fmt.Errorf("holds %d images (%s): pick one with --oci-ref TAG", len(m), strings.Join(have, ", "))
	case o.Ref == "":
		return tarball.Image(opener, nil)
	}
	tag, err := name.NewTag(o.Ref)
	if err != nil {
		return nil, fmt.Errorf("--oci-ref %q is not a tag such as app:1: %v", o.Ref, err)
	}
	for _, d := range m {
		for _, t := range d.RepoTags {
			if t2, err := name.NewTag(t); err == nil && t2.Name() == tag.Name() {
				return tarball.Image(opener, &tag)
			}
		}
	}
	return nil, fmt.Errorf("has no image tagged %s; it has %s", o.Ref, strings.Join(have, ", "))
}

// Annotations an OCI layout's index names its images with: the OCI ref
// name (a tag, or a whole reference) and the one Docker and containerd
// add (the whole reference).
var layoutRefAnnotations = []string{"org.opencontainers.image.ref.name", "io.containerd.image.name"}

// layoutImage picks the image of the OCI layout in dir: its only one, or
// the one named o.Ref; from an index, the linux/amd64 image.
func (o OCIOptions) layoutImage(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var have []string
	var picked []v1.Descriptor
	for _, d := range im.Manifests {
		refName := ""
		for _, a := range layoutRefAnnotations {
			if v := d.Annotations[a]; v != "" {
				refName = v
				if o.Ref != "" && sameRef(v, o.Ref) {
					picked = append(picked, d)
					break
				}
			}
		}
		if refName == "" {
			refName = "an unnamed image " + d.Digest.String()
		}
		have = append(have, refName)
	}
	if o.Ref == "" {
		picked = im.Manifests
	}
	switch {
	case len(im.Manifests) == 0:
		return nil, errors.New("holds no image")
	case len(picked) == 0:
		return nil, fmt.Errorf("has no image named %s; it has %s", o.Ref, strings.Join(have, ", "))
	case len(picked) > 1:
		return nil, fmt.Errorf("holds %d images (%s): pick one with --oci-ref NAME", len(picked), strings.Join(have, ", "))
	}
	d := picked[0]
	if !d.MediaType.IsIndex() {
		return idx.Image(d.Digest)
	}
	child, err := idx.ImageIndex(d.Digest)
	if err != nil {
		return nil, err
	}
	return platformImage(child)
}

// sameRef reports whether an image's name in a layout is the reference
// ref: the same string, the same tag, or the same full reference written
// differently (app:1 and docker.io/library/app:1).
func sameRef(have, ref string) bool {
	if have == ref {
		return true
	}
	t1, err1 := name.NewTag(have)
	t2, err2 := name.NewTag(ref)
	return err1 == nil && err2 == nil && (t1.Name() == t2.Name() || (!strings.ContainsAny(have, ":/") && have == t2.TagStr()))
}

// platformImage picks the linux/amd64 image of an index.
func platformImage(idx v1.ImageIndex) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var have []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			continue
		}
		if d.Platform.OS == workspacePlatform.OS && d.Platform.Architecture == workspacePlatform.Architecture && d.MediaType.IsImage() {
			return idx.Image(d.Digest)
		}
		have = append(have, d.Platform.OS+"/"+d.Platform.Architecture)
	}
	slices.Sort(have)
	return nil, fmt.Errorf("has no %s/%s image (it has %s)", workspacePlatform.OS, workspacePlatform.Architecture, strings.Join(slices.Compact(have), ", "))
}

// countedImage reports how far mutate.Extract read its layers.
type countedImage struct {
	v1.Image
	c *layerCount
}

type layerCount struct {
	mu      sync.Mutex
	layers  int
	done    int
	bytes   int64
	report  func(OCIProgress)
	stopped bool
}

// add counts n bytes read and reports, under the lock, so that once stop
// returned no report is running or comes later (mutate.Extract may still
// be reading when BuildOCI returns an error).
func (c *layerCount) add(n int, finished bool) {
	if c.report == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bytes += int64(n)
	if finished {
		c.done++
	}
	if !c.stopped {
		c.report(OCIProgress{Layers: c.layers, LayersDone: c.done, Bytes: c.bytes})
	}
}

func (c *layerCount) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
}

func (i countedImage) Layers() ([]v1.Layer, error) {
	ls, err := i.Image.Layers()
	if err != nil {
		return nil, err
	}
	out := make([]v1.Layer, len(ls))
	for j, l := range ls {
		out[j] = countedLayer{Layer: l, c: i.c}
	}
	return out, nil
}

type countedLayer struct {
	v1.Layer
	c *layerCount
}

func (l countedLayer) Uncompressed() (io.ReadCloser, error) {
	rc, err := l.Layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	return &countedReader{ReadCloser: rc, c: l.c}, nil
}

type countedReader struct {
	io.ReadCloser
	c   *layerCount
	eof bool
}

func (r *countedReader) Read(b []byte) (int, error) {
	n, err := r.ReadCloser.Read(b)
	finished := err == io.EOF && !r.eof
	r.eof = r.eof || err == io.EOF
	r.c.add(n, finished)
	return n, err
}
