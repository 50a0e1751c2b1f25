// Package platform builds and reads Platforms: the guest kernel (the
// uncompressed PVH vmlinux of a Debian cloud kernel) and the initramfs that
// runs the kibotos executable itself as the guest agent.
//
// A Platform is content addressed like a runtime installation: it lives in
// <storage-root>/installations/sha256-<digest>/ with an installation.json,
// is built in a temp dir next to it and renamed into place, and is never
// changed afterwards. The kernel package is unpacked with dpkg -x into a
// cache, never installed on the host; this package never touches /boot or
// /lib/modules of the host.
package platform

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	kbuildinfo "github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/internal/recordfmt"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Files of a Platform installation.
const (
	KernelFile   = "vmlinux"
	InitrdFile   = "initramfs.cpio.gz"
	ManifestFile = "installation.json"
	Kind         = "platform"
	// FormatVersion 2 added the agent's release and digest; a version 1
	// manifest is read (its agent is then of an unknown release) and
	// rewritten as version 2 by the next build of the same content.
	FormatVersion = 2
	// contentScheme versions how the id is computed from the files,
	// which the manifest's format does not change.
	contentScheme = 1
)

// Formats are the manifest versions this build reads.
var Formats = recordfmt.Range{Min: 1, Max: FormatVersion}

// Paths inside the initramfs that the guest agent relies on.
const (
	// AgentPath is the kibotos executable in the guest.
	AgentPath = "/bin/kibotos"
	// ModulesListPath lists the module files to load, in order, one
	// absolute guest path per line.
	ModulesListPath = "/modules.list"
	// InitStartedLine is written to the console by /init before it execs
	// the agent, so a boot can be confirmed without the agent.
	InitStartedLine = "kibotos-init-started"
)

// DefaultModules are the kernel modules the guest needs for the microvm
// devices (the cloud kernel builds them as modules); their dependencies are
// added in load order.
var DefaultModules = []string{"virtio_mmio", "virtio_console", "virtio_blk", "virtio_net"}

// Options say what to build and where.
type Options struct {
	// StorageRoot holds installations/; required.
	StorageRoot string
	// CacheDir keeps downloaded .debs and unpacked kernels between builds;
	// default <StorageRoot>/cache/platform.
	CacheDir string
	// KernelPackage is a Debian package name (a metapackage is resolved to
	// the linux-image-<release> it depends on) or a path to a .deb;
	// default DefaultKernelPackage.
	KernelPackage string
	// AgentBinary is the static kibotos executable to ship; default the
	// running executable.
	AgentBinary string
	// Busybox is a static busybox; default /bin/busybox (busybox-static).
	Busybox string
	// Modules to load in the guest; default DefaultModules.
	Modules []string
	Logger  *slog.Logger
	Now     func() time.Time
}

// Installation is a built Platform as recorded in installation.json.
type Installation struct {
	FormatVersion        int    `json:"format_version"`
	ID                   string `json:"id"`
	Kind                 string `json:"kind"`
	KernelPackage        string `json:"kernel_package"`
	KernelPackageVersion string `json:"kernel_package_version"`
	KernelVersion        string `json:"kernel_version"`
	AgentRevision        string `json:"agent_revision"`
	// AgentRelease is the kibotos release of the guest agent
	// ("unreleased", or "" when unknown: a version 1 manifest).
	AgentRelease string `json:"agent_release,omitempty"`
	// AgentSHA256 is the digest of the kibotos executable shipped as the
	// guest agent: the node whose executable has it uses this Platform.
	AgentSHA256 string    `json:"agent_sha256,omitempty"`
	Modules     []string  `json:"modules"`
	CreatedAt   time.Time `json:"created_at"`
	Files       []File    `json:"files"`

	// Dir is where the installation was loaded from.
	Dir string `json:"-"`
}

// File is one content file of an installation.
type File struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Kernel is the path of the vmlinux to pass to -kernel.
func (in *Installation) Kernel() string { return filepath.Join(in.Dir, KernelFile) }

// Initrd is the path of the initramfs to pass to -initrd.
func (in *Installation) Initrd() string { return filepath.Join(in.Dir, InitrdFile) }

// Size is the total size of the content files.
func (in *Installation) Size() int64 {
	var n int64
	for _, f := range in.Files {
		n += f.Size
	}
	return n
}

// InstallationsDir is where installations of all kinds live.
func InstallationsDir(storageRoot string) string {
	return filepath.Join(storageRoot, "installations")
}

// contentID is the installation id: a digest over the names, digests and
// sizes of the content files (not over installation.json, whose created_at
// differs between two builds of the same content).
func contentID(files []File) string {
	fs := append([]File(nil), files...)
	sort.Slice(fs, func(i, j int) bool { return fs[i].Name < fs[j].Name })
	h := sha256.New()
	fmt.Fprintf(h, "kibotos-platform v%d\n", contentScheme)
	for _, f := range fs {
		fmt.Fprintf(h, "%s %s %d\n", f.Name, f.SHA256, f.Size)
	}
	return "sha256-" + hex.EncodeToString(h.Sum(nil))
}

// Build builds a Platform, or returns the existing installation with the
// same content.
func Build(ctx context.Context, o Options) (*Installation, error) {
	if o.StorageRoot == "" {
		return nil, errors.New("platform build: no storage root")
	}
	if o.CacheDir == "" {
		o.CacheDir = filepath.Join(o.StorageRoot, "cache", "platform")
	}
	if o.KernelPackage == "" {
		o.KernelPackage = DefaultKernelPackage
	}
	if o.Busybox == "" {
		o.Busybox = "/bin/busybox"
	}
	if len(o.Modules) == 0 {
		o.Modules = DefaultModules
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	log := o.Logger
	self := false
	if o.AgentBinary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("platform build: find own executable: %w", err)
		}
		o.AgentBinary, self = exe, true
	}
	if err := checkStatic(o.AgentBinary, "agent binary", "build kibotos with CGO_ENABLED=0"); err != nil {
		return nil, err
	}
	if err := checkStatic(o.Busybox, "busybox", "install the busybox-static package"); err != nil {
		return nil, err
	}
	revision := agentRevision(o.AgentBinary, self)
	agentSHA, err := fileSHA256(o.AgentBinary)
	if err != nil {
		return nil, fmt.Errorf("platform build: agent binary: %w", err)
	}
	release := agentRelease(ctx, o.AgentBinary, self)

	k, err := fetchKernel(ctx, o.KernelPackage, o.CacheDir, log)
	if err != nil {
		return nil, err
	}
	mods, err := moduleOrder(ctx, k, o.Modules)
	if err != nil {
		return nil, err
	}

	instDir := InstallationsDir(o.StorageRoot)
	if err := os.MkdirAll(instDir, 0o755); err != nil {
		return nil, fmt.Errorf("platform build: %w", err)
	}
	tmp, err := os.MkdirTemp(instDir, ".platform-build-*.tmp")
	if err != nil {
		return nil, fmt.Errorf("platform build: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed into place

	bz, err := os.ReadFile(k.bzImage())
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", k.Release, err)
	}
	vmlinux, err := extractVmlinux(bz)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", k.Release, err)
	}
	kf, err := writeContent(filepath.Join(tmp, KernelFile), func(w io.Writer) error {
		_, err := w.Write(vmlinux)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", k.Release, err)
	}

	tree, err := initramfsTree(ctx, k, mods, o.AgentBinary, o.Busybox)
	if err != nil {
		return nil, err
	}
	rf, err := writeContent(filepath.Join(tmp, InitrdFile), func(w io.Writer) error {
		zw := gzip.NewWriter(w) // zero ModTime and no name: reproducible
		if err := tree.write(zw); err != nil {
			return err
		}
		return zw.Close()
	})
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}

	in := &Installation{
		FormatVersion:        FormatVersion,
		Kind:                 Kind,
		KernelPackage:        k.Package,
		KernelPackageVersion: k.Version,
		KernelVersion:        k.Release,
		AgentRevision:        revision,
		AgentRelease:         release,
		AgentSHA256:          agentSHA,
		Modules:              guestPaths(mods),
		CreatedAt:            o.Now().UTC().Truncate(time.Second),
		Files:                []File{kf, rf},
	}
	in.ID = contentID(in.Files)
	final := filepath.Join(instDir, in.ID)
	if existing, err := Load(final); err == nil {
		log.Info("platform already installed", "id", in.ID, "dir", final)
		if existing.FormatVersion < FormatVersion {
			return migrate(existing, in, log)
		}
		return existing, nil
	}
	if err := writeManifest(tmp, ManifestFile, in); err != nil {
		return nil, fmt.Errorf("platform %s: %w", in.ID, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, final); err != nil {
		// A concurrent build of the same content won the rename.
		if existing, err2 := Load(final); err2 == nil {
			return existing, nil
		}
		return nil, fmt.Errorf("platform %s: install: %w (if %s is a broken earlier build, remove it)", in.ID, err, final)
	}
	storagepool.SyncDir(instDir)
	in.Dir = final
	log.Info("platform built", "id", in.ID, "kernel", k.Release, "kernel_package", k.Package+"="+k.Version,
		"agent_revision", revision, "dir", final)
	return in, nil
}

// initramfsTree lays out the initramfs: busybox with its applets, the agent
// behind a two-line /init, the modules and their load order.
func initramfsTree(ctx context.Context, k *kernelTree, mods []string, agent, busybox string) (cpioTree, error) {
	t := cpioTree{}
	for _, d := range []string{"dev", "proc", "sys", "tmp", "run", "mnt", "etc", "root"} {
		t.dir(d)
	}
	// The kernel opens /dev/console for init before anything is mounted.
	t.chardev("dev/console", 0o600, 5, 1)
	t.file("bin/busybox", busybox, 0o755)
	out, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox %s --list: %w", busybox, err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			t.symlink("bin/"+a, "busybox")
		}
	}
	t.symlink("sbin", "bin")
	t.symlink("usr/bin", "../bin")
	t.symlink("usr/sbin", "../bin")
	t.file(strings.TrimPrefix(AgentPath, "/"), agent, 0o755)
	// The kernel runs /init without arguments; the agent is a subcommand.
	// It serves the node's port (agent/runtime.AgentPortName) and the data
	// plane's; a host that gives the VM no data port leaves that one
	// waiting, the node's is served all the same.
	t.bytes("init", []byte("#!/bin/sh\necho "+InitStartedLine+" > /dev/console\nexec "+AgentPath+
		" guest-agent --port-name=kibotos.agent --data-port-name="+guestproto.DataPortName+"\n"), 0o755)
	for _, m := range mods {
		t.file(m, filepath.Join(k.Root, m), 0o644)
	}
	t.bytes(strings.TrimPrefix(ModulesListPath, "/"), []byte(strings.Join(guestPaths(mods), "\n")+"\n"), 0o644)
	t.bytes("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	t.bytes("etc/group", []byte("root:x:0:\n"), 0o644)
	return t, nil
}

func guestPaths(rel []string) []string {
	out := make([]string, len(rel))
	for i, r := range rel {
		out[i] = "/" + r
	}
	return out
}

// writeContent writes a file through fill, syncs it and returns its record.
func writeContent(path string, fill func(io.Writer) error) (File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return File{}, err
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	if err := fill(cw); err != nil {
		f.Close()
		return File{}, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return File{}, err
	}
	if err := f.Close(); err != nil {
		return File{}, err
	}
	return File{Name: filepath.Base(path), SHA256: hex.EncodeToString(h.Sum(nil)), Size: cw.n}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// agentRevision is the source revision of the agent binary: our own when we
// ship ourselves (that honours -ldflags -X), else its Go VCS stamp.
func agentRevision(path string, self bool) string {
	if self {
		return kbuildinfo.SourceRevision()
	}
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return "unknown"
}

// Load reads the Platform installation in dir.
func Load(dir string) (*Installation, error) {
	raw, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, fmt.Errorf("platform %s: %w", dir, err)
	}
	var in Installation
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, fmt.Errorf("platform %s: corrupt %s: %w", dir, ManifestFile, err)
	}
	if in.Kind != Kind {
		return nil, fmt.Errorf("installation %s is a %q, not a platform", dir, in.Kind)
	}
	if err := Formats.Check(filepath.Join(dir, ManifestFile), in.FormatVersion); err != nil {
		return nil, fmt.Errorf("platform %w", err)
	}
	if in.ID != filepath.Base(dir) || in.ID != contentID(in.Files) {
		return nil, fmt.Errorf("platform %s: id %s does not match its directory or files", dir, in.ID)
	}
	for _, f := range in.Files {
		st, err := os.Stat(filepath.Join(dir, f.Name))
		if err != nil {
			return nil, fmt.Errorf("platform %s: %w", in.ID, err)
		}
		if st.Size() != f.Size {
			return nil, fmt.Errorf("platform %s: %s is %d bytes, recorded %d", in.ID, f.Name, st.Size(), f.Size)
		}
	}
	in.Dir = dir
	return &in, nil
}

// List returns the Platforms under storageRoot, newest first. Installations
// of other kinds and builds in progress are skipped; a broken Platform is
// reported in the error while the good ones are still returned.
func List(storageRoot string) ([]*Installation, error) {
	dir := InstallationsDir(storageRoot)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Installation
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		var head struct {
			Kind string `json:"kind"`
		}
		raw, err := os.ReadFile(filepath.Join(p, ManifestFile))
		if err == nil && json.Unmarshal(raw, &head) == nil && head.Kind != Kind {
			continue
		}
		in, err := Load(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, errors.Join(errs...)
}
