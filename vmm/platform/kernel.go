package platform

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// DefaultKernelPackage is Debian's metapackage for the current cloud kernel;
// it is resolved to the versioned linux-image-<release> package it depends on.
const DefaultKernelPackage = "linux-image-cloud-amd64"

// kernelTree is a kernel .deb unpacked (never installed) in the cache.
type kernelTree struct {
	Package string // versioned package, e.g. linux-image-6.1.0-57-cloud-amd64
	Version string // Debian version of that package, e.g. 6.1.192-3
	Release string // kernel release: lib/modules/<Release>
	Root    string // the unpacked tree
}

func (k *kernelTree) bzImage() string {
	return filepath.Join(k.Root, "boot", "vmlinuz-"+k.Release)
}

var versionedKernel = regexp.MustCompile(`^linux-image-[0-9]`)

// fetchKernel returns the unpacked tree of pkg (a package name or a path to
// a .deb), downloading and unpacking it into cacheDir unless already there.
func fetchKernel(ctx context.Context, pkg, cacheDir string, log *slog.Logger) (*kernelTree, error) {
	deb := pkg
	if !strings.HasSuffix(pkg, ".deb") {
		var err error
		deb, err = downloadKernel(ctx, pkg, filepath.Join(cacheDir, "debs"), log)
		if err != nil {
			return nil, err
		}
	}
	fields, err := run(ctx, "", "dpkg-deb", "-f", deb, "Package", "Version")
	if err != nil {
		return nil, fmt.Errorf("kernel package %s: %w", deb, err)
	}
	ctl := parseControl(fields)
	k := &kernelTree{Package: ctl["Package"], Version: ctl["Version"]}
	if k.Package == "" || k.Version == "" {
		return nil, fmt.Errorf("kernel package %s: no Package/Version in its control file", deb)
	}
	k.Root = filepath.Join(cacheDir, "kernels", k.Package+"_"+k.Version)
	if k.Release, err = unpackedRelease(k.Root); err == nil {
		log.Debug("kernel tree cached", "package", k.Package, "version", k.Version, "dir", k.Root)
		return k, nil
	}
	if err := os.MkdirAll(filepath.Dir(k.Root), 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(k.Root), ".unpack-*.tmp")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	log.Info("unpacking kernel package", "package", k.Package, "version", k.Version, "deb", deb)
	if _, err := run(ctx, "", "dpkg", "-x", deb, tmp); err != nil {
		return nil, fmt.Errorf("unpack kernel package %s: %w", deb, err)
	}
	rel, err := kernelRelease(tmp)
	if err != nil {
		return nil, fmt.Errorf("kernel package %s: %w", deb, err)
	}
	// The package ships no modules.dep; modprobe needs it to order modules.
	if _, err := run(ctx, "", "depmod", "-b", tmp, rel); err != nil {
		return nil, fmt.Errorf("depmod for kernel %s: %w", rel, err)
	}
	if err := os.Rename(tmp, k.Root); err != nil {
		// Another build unpacked the same version first: use theirs.
		if r, err2 := unpackedRelease(k.Root); err2 == nil {
			k.Release = r
			return k, nil
		}
		return nil, fmt.Errorf("kernel tree %s: %w", k.Root, err)
	}
	k.Release = rel
	return k, nil
}

// unpackedRelease is kernelRelease of a finished tree: unpacked and with
// the modules.dep that depmod adds.
func unpackedRelease(root string) (string, error) {
	rel, err := kernelRelease(root)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "lib", "modules", rel, "modules.dep")); err != nil {
		return "", fmt.Errorf("kernel %s has no modules.dep: %w", rel, err)
	}
	return rel, nil
}

// kernelRelease finds the single lib/modules/<release> of an unpacked tree
// that also has its boot/vmlinuz-<release>.
func kernelRelease(root string) (string, error) {
	ents, err := os.ReadDir(filepath.Join(root, "lib", "modules"))
	if err != nil {
		return "", fmt.Errorf("no lib/modules: %w", err)
	}
	var rels []string
	for _, e := range ents {
		if e.IsDir() {
			rels = append(rels, e.Name())
		}
	}
	if len(rels) != 1 {
		return "", fmt.Errorf("want exactly one kernel in lib/modules, found %v", rels)
	}
	if _, err := os.Stat(filepath.Join(root, "boot", "vmlinuz-"+rels[0])); err != nil {
		return "", fmt.Errorf("kernel %s has no boot/vmlinuz: %w", rels[0], err)
	}
	return rels[0], nil
}

// downloadKernel resolves pkg to a versioned kernel package and makes sure
// its .deb is in dir, checked against the archive's SHA256.
func downloadKernel(ctx context.Context, pkg, dir string, log *slog.Logger) (string, error) {
	if !versionedKernel.MatchString(pkg) {
		out, err := run(ctx, "", "apt-cache", "depends", "--no-recommends", "--no-suggests", pkg)
		if err != nil {
			return "", fmt.Errorf("resolve kernel package %s: %w", pkg, err)
		}
		dep := ""
		for _, l := range strings.Split(string(out), "\n") {
			name, ok := strings.CutPrefix(strings.TrimSpace(l), "Depends: ")
			if ok && versionedKernel.MatchString(name) {
				dep = strings.TrimSpace(name)
				break
			}
		}
		if dep == "" {
			return "", fmt.Errorf("kernel package %s depends on no linux-image-<release> package", pkg)
		}
		log.Info("kernel package resolved", "package", pkg, "resolved", dep)
		pkg = dep
	}
	out, err := run(ctx, "", "apt-cache", "show", "--no-all-versions", pkg)
	if err != nil {
		return "", fmt.Errorf("kernel package %s: %w (is it in the apt sources? run apt-get update)", pkg, err)
	}
	ctl := parseControl(out)
	if ctl["Filename"] == "" || ctl["Version"] == "" {
		return "", fmt.Errorf("kernel package %s: apt-cache show gives no Filename/Version", pkg)
	}
	deb := filepath.Join(dir, filepath.Base(ctl["Filename"]))
	want := ctl["SHA256"]
	if sum, err := fileSHA256(deb); err == nil && (want == "" || sum == want) {
		log.Debug("kernel package cached", "package", pkg, "deb", deb)
		return deb, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, ".download-*.tmp")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	log.Info("downloading kernel package", "package", pkg, "version", ctl["Version"])
	// As root apt would drop to _apt, which cannot write to our cache dir.
	if _, err := run(ctx, tmp, "apt-get", "-q", "-o", "APT::Sandbox::User=root", "download", pkg+"="+ctl["Version"]); err != nil {
		return "", fmt.Errorf("download kernel package %s: %w", pkg, err)
	}
	got := filepath.Join(tmp, filepath.Base(ctl["Filename"]))
	sum, err := fileSHA256(got)
	if err != nil {
		return "", fmt.Errorf("download kernel package %s: %w", pkg, err)
	}
	if want != "" && sum != want {
		return "", fmt.Errorf("download kernel package %s: sha256 %s, the archive says %s", pkg, sum, want)
	}
	if err := os.Rename(got, deb); err != nil {
		return "", err
	}
	return deb, nil
}

// moduleOrder lists the module files (paths inside the kernel tree, from
// lib/) to load for mods, dependencies first, each once. Built-in modules
// need no file and are left out.
func moduleOrder(ctx context.Context, k *kernelTree, mods []string) ([]string, error) {
	var order []string
	seen := map[string]bool{}
	marker := "/lib/modules/" + k.Release + "/"
	for _, m := range mods {
		out, err := run(ctx, "", "modprobe", "-d", k.Root, "-S", k.Release, "--show-depends", m)
		if err != nil {
			return nil, fmt.Errorf("module %s of kernel %s: %w", m, k.Release, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 || f[0] != "insmod" {
				continue // "builtin NAME" or blank
			}
			i := strings.Index(f[1], marker)
			if i < 0 {
				return nil, fmt.Errorf("module %s: modprobe gave %s, outside %s", m, f[1], marker)
			}
			rel := f[1][i+1:]
			if !seen[rel] {
				seen[rel] = true
				order = append(order, rel)
			}
		}
	}
	return order, nil
}

func parseControl(b []byte) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" {
			break // first stanza only
		}
		if k, v, ok := strings.Cut(l, ":"); ok && !strings.HasPrefix(l, " ") {
			if _, dup := m[k]; !dup {
				m[k] = strings.TrimSpace(v)
			}
		}
	}
	return m
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// run runs a host tool and returns its stdout; the error carries stderr.
func run(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.Is(err, exec.ErrNotFound) {
			return nil, fmt.Errorf("%s not found: install %s", name, debianPackageOf(name))
		}
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

// debianPackageOf names the Debian package that provides a tool we run.
func debianPackageOf(tool string) string {
	switch tool {
	case "dpkg", "dpkg-deb":
		return "dpkg"
	case "apt-get", "apt-cache":
		return "apt"
	case "depmod", "modprobe":
		return "kmod"
	}
	return "the package providing " + tool
}
