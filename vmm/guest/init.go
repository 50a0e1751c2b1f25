package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// RunOptions configure Run, the entry point of `kibotos guest-agent`.
type RunOptions struct {
	PortName string // virtio-serial port of the node, e.g. "kibotos.agent"
	// DataPortName is the data plane's port (guestproto.DataPortName); ""
	// serves the node's port alone. A VM whose host gave it no such port
	// (an older launch) still serves the node: the data port's open just
	// keeps waiting for it.
	DataPortName string
	DeviceDir    string // where udev links named ports; /dev/virtio-ports
	// Init forces the PID 1 duties when the agent is not PID 1.
	Init         bool
	AgentVersion string
	Logger       *slog.Logger
}

// Run is the guest agent process. As PID 1 (or with Init) it first mounts
// the pseudo filesystems and loads the modules of /modules.list, reaps all
// orphans and powers the VM off on Stop; PID 1 never returns.
func Run(ctx context.Context, o RunOptions) error {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	pid1 := os.Getpid() == 1
	opts := Options{AgentVersion: o.AgentVersion, Logger: log}
	if pid1 || o.Init {
		if err := mountPseudoFS(); err != nil {
			log.Error("guest agent mounts failed", "err", err)
		}
		if con, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil && o.Logger == nil {
			log = slog.New(slog.NewTextHandler(con, nil))
			opts.Logger = log
		}
		if err := loadModules("/modules.list", log); err != nil {
			log.Error("guest agent module loading failed", "err", err)
		}
		// A Workspace root bind-mounts the resolv.conf configure
		// writes, before the node may have sent any DNS servers.
		if err := ensureFile(guestproto.ResolvConf); err != nil {
			log.Error("guest agent could not create resolv.conf", "err", err)
		}
		unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
		opts.ReapOrphans = true
		opts.KillAll = pid1
		opts.PowerOff = powerOff
	}
	if pid1 || o.Init {
		// port-forward's default target is the guest's 127.0.0.1, and
		// nothing else in a bare initramfs brings lo up.
		if err := loopbackUp(); err != nil {
			log.Error("guest agent could not bring up lo", "err", err)
		}
	}
	port := func(name string) Opener {
		return func(ctx context.Context) (io.ReadWriteCloser, error) { return openPort(ctx, o.DeviceDir, name) }
	}
	var data Opener
	if o.DataPortName != "" {
		data = port(o.DataPortName)
	}
	err := ServeChannels(ctx, opts, port(o.PortName), data)
	if pid1 {
		// PID 1 must not exit (the kernel would panic): power off instead.
		log.Error("guest agent exited as PID 1, powering off", "err", err)
		unix.Sync()
		for {
			powerOff()
			time.Sleep(time.Second)
		}
	}
	return err
}

// ensureFile creates path empty unless it exists.
func ensureFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// loopbackUp sets lo up (SIOCSIFFLAGS); the kernel gives it 127.0.0.1.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

func powerOff() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// mountPseudoFS mounts what a bare initramfs lacks. Already mounted
// filesystems (EBUSY) are fine.
func mountPseudoFS() error {
	var errs []error
	for _, m := range []struct{ src, dst, fstype, data string }{
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"devpts", "/dev/pts", "devpts", "gid=5,mode=620,ptmxmode=666"},
		{"tmpfs", "/run", "tmpfs", "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", "mode=1777"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID, m.data); err != nil && err != unix.EBUSY {
			errs = append(errs, fmt.Errorf("mount %s: %w", m.dst, err))
		}
	}
	return errors.Join(errs...)
}

// loadModules loads the modules listed (paths, in dependency order) with
// finit_module; already loaded ones are fine.
func loadModules(list string, log *slog.Logger) error {
	b, err := os.ReadFile(list)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, path := range strings.Fields(string(b)) {
		f, err := os.Open(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && err != unix.EEXIST {
			errs = append(errs, fmt.Errorf("load module %s: %w", path, err))
			continue
		}
		log.Debug("guest agent loaded module", "module", filepath.Base(path))
	}
	return errors.Join(errs...)
}

// openPort opens the named virtio-serial port, waiting for it to appear.
// Without udev there is no /dev/virtio-ports link, so sysfs is searched too.
func openPort(ctx context.Context, dir, name string) (io.ReadWriteCloser, error) {
	delay := 5 * time.Millisecond
	for {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			path = findPortBySysfs(name)
		}
		if path != "" {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err == nil {
				return f, nil
			}
			if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.EBUSY) {
				return nil, fmt.Errorf("open virtio port %s: %w", path, err)
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

func findPortBySysfs(name string) string {
	names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err == nil && strings.TrimSpace(string(b)) == name {
			return "/dev/" + filepath.Base(filepath.Dir(n))
		}
	}
	return ""
}
