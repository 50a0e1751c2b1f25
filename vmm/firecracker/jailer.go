package firecracker

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// DefaultChrootBaseDir is the jailer's default --chroot-base-dir.
const DefaultChrootBaseDir = "/srv/jailer"

// JailerOptions are the jailer's arguments (docs/jailer.md). The jailer is
// run in the foreground: the runtime's unit is its supervisor, so
// --daemonize (setsid, stdio to /dev/null) is not offered.
type JailerOptions struct {
	Jailer   string // the jailer binary, absolute
	ExecFile string // the firecracker binary, absolute; its name must contain "firecracker"
	ID       string // letters, digits and '-', at most 64
	UID, GID int    // what the jailer drops to before exec'ing Firecracker; not 0
	// ChrootBaseDir defaults to DefaultChrootBaseDir.
	ChrootBaseDir string
	// NetNS is a network namespace handle to join (e.g. /run/netns/x).
	NetNS string
	// CgroupVersion is 1 or 2; 0 means 2 (the only version kibotos hosts use).
	CgroupVersion int
	ParentCgroup  string   // --parent-cgroup, relative
	Cgroups       []string // --cgroup <file>=<value>, each
	// ResourceLimits are --resource-limit <resource>=<value> (fsize, no-file).
	ResourceLimits []string
	NewPIDNS       bool
	// FirecrackerArgs follow "--" and go to Firecracker, whose paths are
	// then seen from inside the chroot. The jailer adds --id itself.
	FirecrackerArgs []string
}

var (
	jailIDRE = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)
	kvRE     = regexp.MustCompile(`^[A-Za-z0-9_.-]+=.+$`)
)

// JailerArgv is the jailer command line, binary first.
func JailerArgv(o JailerOptions) ([]string, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !filepath.IsAbs(o.Jailer) {
		bad("jailer binary %q: want an absolute path", o.Jailer)
	}
	if !filepath.IsAbs(o.ExecFile) {
		bad("exec file %q: want an absolute path", o.ExecFile)
	} else if !strings.Contains(filepath.Base(o.ExecFile), "firecracker") {
		bad("exec file %q: the jailer requires its name to contain \"firecracker\"", o.ExecFile)
	}
	if !jailIDRE.MatchString(o.ID) {
		bad("id %q: want 1 to 64 letters, digits or '-'", o.ID)
	}
	if o.UID <= 0 || o.GID <= 0 {
		bad("uid %d gid %d: want an unprivileged uid and gid for Firecracker to run as", o.UID, o.GID)
	}
	if o.ChrootBaseDir != "" && !filepath.IsAbs(o.ChrootBaseDir) {
		bad("chroot base dir %q: want an absolute path", o.ChrootBaseDir)
	}
	if o.NetNS != "" && !filepath.IsAbs(o.NetNS) {
		bad("netns %q: want an absolute path", o.NetNS)
	}
	cgv := o.CgroupVersion
	if cgv == 0 {
		cgv = 2
	}
	if cgv != 1 && cgv != 2 {
		bad("cgroup version %d: want 1 or 2", o.CgroupVersion)
	}
	if o.ParentCgroup != "" && (filepath.IsAbs(o.ParentCgroup) || strings.Contains(o.ParentCgroup, "..")) {
		bad("parent cgroup %q: want a relative path inside the hierarchy", o.ParentCgroup)
	}
	for _, c := range o.Cgroups {
		if !kvRE.MatchString(c) {
			bad("cgroup %q: want <cgroup_file>=<value>", c)
		}
	}
	for _, r := range o.ResourceLimits {
		if !kvRE.MatchString(r) {
			bad("resource limit %q: want <resource>=<value>", r)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("jailer argv: %w", errors.Join(errs...))
	}

	a := []string{o.Jailer,
		"--id", o.ID,
		"--exec-file", o.ExecFile,
		"--uid", strconv.Itoa(o.UID),
		"--gid", strconv.Itoa(o.GID),
		"--cgroup-version", strconv.Itoa(cgv),
	}
	if o.ParentCgroup != "" {
		a = append(a, "--parent-cgroup", o.ParentCgroup)
	}
	for _, c := range o.Cgroups {
		a = append(a, "--cgroup", c)
	}
	if o.ChrootBaseDir != "" {
		a = append(a, "--chroot-base-dir", o.ChrootBaseDir)
	}
	if o.NetNS != "" {
		a = append(a, "--netns", o.NetNS)
	}
	for _, r := range o.ResourceLimits {
		a = append(a, "--resource-limit", r)
	}
	if o.NewPIDNS {
		a = append(a, "--new-pid-ns")
	}
	if len(o.FirecrackerArgs) > 0 {
		a = append(append(a, "--"), o.FirecrackerArgs...)
	}
	return a, nil
}

// Jail is the chroot the jailer builds for one VM:
// <chroot-base>/<exec-file name>/<id>/root. The jailer creates it (doing
// nothing for directories that exist), copies the Firecracker binary into
// it, pivots into it and chowns it to uid:gid. Every file Firecracker opens
// (kernel, initrd, disks, the config file) must be hard-linked or copied
// into Root beforehand, and every path given to Firecracker (config file,
// --api-sock, uds_path) is then relative to Root: "/vmlinux" in the config
// is Root+"/vmlinux" on the host. The jailer never removes a jail.
type Jail struct {
	Base     string // chroot base dir
	ExecName string // base name of the exec file, e.g. "firecracker"
	ID       string
}

// JailOf is the jail that JailerArgv(o) makes.
func JailOf(o JailerOptions) Jail {
	base := o.ChrootBaseDir
	if base == "" {
		base = DefaultChrootBaseDir
	}
	return Jail{Base: base, ExecName: filepath.Base(o.ExecFile), ID: o.ID}
}

// Dir is <base>/<exec name>/<id>, what Remove deletes.
func (j Jail) Dir() string { return filepath.Join(j.Base, j.ExecName, j.ID) }

// Root is the chroot directory, "/" as the jailed Firecracker sees it.
func (j Jail) Root() string { return filepath.Join(j.Dir(), "root") }

// HostPath maps a path as Firecracker sees it ("/vmlinux") to the host.
func (j Jail) HostPath(inJail string) string {
	return filepath.Join(j.Root(), path.Clean("/"+inJail))
}

// ExecPath is the jailer's copy of the Firecracker binary: the executable
// of the VMM process once the jailer has exec'd (it does not exist before
// the jailer ran).
func (j Jail) ExecPath() string { return filepath.Join(j.Root(), j.ExecName) }

// Remove deletes the jail directory (after the VMM exited).
func (j Jail) Remove() error {
	if j.ID == "" || j.ExecName == "" || j.Base == "" {
		return fmt.Errorf("jail %+v: incomplete, not removing", j)
	}
	return os.RemoveAll(j.Dir())
}

// Link places the host file src at inJail inside the jail, as a hard link
// (same inode: writes by the guest reach src). If hard-linking fails
// because src is on another filesystem and copyOK, it copies instead —
// acceptable for read-only inputs like a kernel, never for a writable disk
// whose writes must land in src.
func (j Jail) Link(src, inJail string, copyOK bool) error {
	dst := j.HostPath(inJail)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("jail %s: %w", j.ID, err)
	}
	err := os.Link(src, dst)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.EXDEV) && copyOK {
		if err := copyFile(src, dst); err != nil {
			return fmt.Errorf("jail %s: copy %s: %w", j.ID, src, err)
		}
		return nil
	}
	if errors.Is(err, syscall.EXDEV) {
		return fmt.Errorf("jail %s: %s is on another filesystem than the chroot base %s and must be hard-linked, not copied: %w", j.ID, src, j.Base, err)
	}
	return fmt.Errorf("jail %s: link %s: %w", j.ID, src, err)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, st.Mode().Perm())
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
	}
	return err
}
