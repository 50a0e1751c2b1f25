package guest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// FIFREEZE and FITHAW are _IOWR('X', 119/120, int); x/sys does not carry them.
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

func freeze(path string, on bool) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	req, what := uint(ioctlFIFREEZE), "freeze"
	if !on {
		req, what = ioctlFITHAW, "thaw"
	}
	if err := unix.IoctlSetInt(fd, req, 0); err != nil {
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	return nil
}

func syncAll() { unix.Sync() }

// setTime sets CLOCK_REALTIME (a restored guest's is behind).
func setTime(r guestproto.SetTimeRequest) error {
	if r.UnixNano <= 0 {
		return &guestproto.Error{Code: guestproto.CodeInvalid, Message: "set-time: no time given"}
	}
	ts := unix.NsecToTimespec(r.UnixNano)
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("set the clock: %w", err)
	}
	return nil
}

// configure applies hostname, DNS, mounts and network. Network setup runs
// the Platform's `ip` (busybox) so the agent needs no netlink code.
func (a *agent) configure(ctx context.Context, req guestproto.ConfigureRequest) error {
	if req.Env != nil {
		if err := checkWorkspaceEnv(req.Env); err != nil {
			return err
		}
	}
	if req.Hostname != "" {
		if err := unix.Sethostname([]byte(req.Hostname)); err != nil {
			return fmt.Errorf("set hostname %q: %w", req.Hostname, err)
		}
	}
	if len(req.DNS) > 0 {
		var b strings.Builder
		for _, s := range req.DNS {
			fmt.Fprintf(&b, "nameserver %s\n", s)
		}
		// In place (truncate and write), never a new file renamed over
		// it: a Workspace root bind-mounts this inode.
		if err := os.WriteFile(a.opts.ResolvConf, []byte(b.String()), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", a.opts.ResolvConf, err)
		}
	}
	for _, m := range req.Mounts {
		if err := a.mount(ctx, m); err != nil {
			return err
		}
	}
	for _, ifc := range req.Interfaces {
		if err := configureInterface(ifc); err != nil {
			return err
		}
	}
	if req.Env != nil {
		// Last: a configure that failed before leaves the one kept.
		a.setWorkspaceEnv(req.Env)
	}
	return nil
}

// configureInterface brings one interface up with its addresses and
// routes, as `ip link set up`, `ip addr flush scope global`, `ip addr
// replace` and `ip route replace` would, over netlink: each `ip` run is a
// process start, and under TCG the five of a guest's network took about
// 0.2 s of every start and resume.
func configureInterface(ifc guestproto.Interface) error {
	name := ifc.Name
	if name == "" {
		return &guestproto.Error{Code: guestproto.CodeInvalid, Message: "interface without a name"}
	}
	fail := func(what string, err error) error { return fmt.Errorf("interface %s: %s: %w", name, what, err) }
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fail("find it", err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fail("set it up", err)
	}
	if ifc.Flush {
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return fail("list addresses", err)
		}
		for _, a := range addrs {
			if a.Scope == unix.RT_SCOPE_UNIVERSE {
				if err := netlink.AddrDel(l, &a); err != nil {
					return fail("remove address "+a.IPNet.String(), err)
				}
			}
		}
	}
	if ifc.MTU > 0 {
		if err := netlink.LinkSetMTU(l, ifc.MTU); err != nil {
			return fail(fmt.Sprintf("set MTU %d", ifc.MTU), err)
		}
	}
	for _, s := range ifc.Addresses {
		a, err := netlink.ParseAddr(s)
		if err != nil {
			return &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("interface %s: address %q: %v", name, s, err)}
		}
		if a.IP.To4() == nil {
			// The node's namespace and this guest are alone on the
			// link: duplicate address detection would only keep the
			// address unusable for a second or two after configure.
			if err := noDAD(name); err != nil {
				return fail("IPv6 address "+s, err)
			}
		}
		if err := netlink.AddrReplace(l, a); err != nil {
			return fail("address "+s, err)
		}
	}
	for _, r := range ifc.Routes {
		route, err := guestRoute(l.Attrs().Index, r)
		if err != nil {
			return &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("interface %s: %v", name, err)}
		}
		if err := netlink.RouteReplace(route); err != nil {
			return fail(fmt.Sprintf("route %s via %q", r.Destination, r.Gateway), err)
		}
	}
	return nil
}

// guestRoute is r on the link: "default" or a prefix, through a gateway
// or, without one, on the link itself.
func guestRoute(link int, r guestproto.Route) (*netlink.Route, error) {
	route := &netlink.Route{LinkIndex: link, Scope: netlink.SCOPE_UNIVERSE}
	if r.Gateway != "" {
		gw, err := netip.ParseAddr(r.Gateway)
		if err != nil {
			return nil, fmt.Errorf("route %s: gateway %q: %v", r.Destination, r.Gateway, err)
		}
		route.Gw = gw.AsSlice()
	} else {
		route.Scope = netlink.SCOPE_LINK
	}
	dst := r.Destination
	if dst == "default" {
		dst = "0.0.0.0/0"
		if route.Gw != nil && route.Gw.To4() == nil {
			dst = "::/0"
		}
	}
	p, err := netip.ParsePrefix(dst)
	if err != nil {
		return nil, fmt.Errorf("route destination %q: give default or a prefix: %v", r.Destination, err)
	}
	if route.Gw != nil && (route.Gw.To4() == nil) != p.Addr().Is6() {
		return nil, fmt.Errorf("route %s: gateway %s is of the other address family", r.Destination, r.Gateway)
	}
	route.Dst = &net.IPNet{IP: p.Masked().Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
	return route, nil
}

// noDAD turns off IPv6 duplicate address detection on an interface.
func noDAD(ifname string) error {
	if ifname == "." || ifname == ".." || strings.Contains(ifname, "/") {
		return &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("interface name %q", ifname)}
	}
	f, err := os.OpenFile("/proc/sys/net/ipv6/conf/"+ifname+"/accept_dad", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("turn off duplicate address detection: %w", err)
	}
	_, err = f.WriteString("0")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("turn off duplicate address detection: %w", err)
	}
	return nil
}

// mount mounts one of configure's Mounts. The option "bind" bind-mounts
// Source (a path of the agent's root) on Target and takes no other; the
// Target of a file is made an empty regular file first, replacing a
// symlink, which mount(2) would follow from the agent's root rather than
// from the root the Target is in. A Source "serial:SERIAL" is a disk
// mounted as mountDisk says.
func (a *agent) mount(ctx context.Context, m guestproto.Mount) error {
	var flags uintptr
	var data []string
	grow := false
	for _, o := range m.Options {
		switch o {
		case "bind":
			flags |= unix.MS_BIND
		case guestproto.MountOptGrow:
			grow = true
		default:
			data = append(data, o)
		}
	}
	if grow && (flags&unix.MS_BIND != 0 || m.FSType != "ext4") {
		what := fmt.Sprintf("fstype %q", m.FSType)
		if flags&unix.MS_BIND != 0 {
			what = "a bind mount"
		}
		return &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("mount %s: option %s grows ext4 only, not %s", m.Target, guestproto.MountOptGrow, what)}
	}
	if serial, ok := strings.CutPrefix(m.Source, guestproto.MountSerialPrefix); ok {
		if flags&unix.MS_BIND != 0 {
			return &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("mount %s on %s: a disk is not bind-mounted", m.Source, m.Target)}
		}
		return a.mountDisk(ctx, serial, m.Target, m.FSType, strings.Join(data, ","), grow)
	}
	isFile := false
	if flags&unix.MS_BIND != 0 {
		if len(data) > 0 {
			return &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("mount %s: a bind mount takes no other options (%s)", m.Target, strings.Join(data, ","))}
		}
		fi, err := os.Stat(m.Source)
		if err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.Source, m.Target, err)
		}
		isFile = !fi.IsDir()
	}
	if isFile {
		if err := fileMountPoint(m.Target); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.Source, m.Target, err)
		}
	} else if err := os.MkdirAll(m.Target, 0o755); err != nil {
		return fmt.Errorf("mount %s: %w", m.Target, err)
	}
	if err := unix.Mount(m.Source, m.Target, m.FSType, flags, strings.Join(data, ",")); err != nil {
		return fmt.Errorf("mount %s on %s (%s): %w", m.Source, m.Target, m.FSType, err)
	}
	if flags&unix.MS_BIND == 0 && strings.HasPrefix(m.Source, "/dev/vd") {
		a.retain(m.Target) // an older node's Workspace root: /dev/vda
	}
	if grow {
		if _, err := a.growFS(ctx, guestproto.GrowFSRequest{Path: m.Target}); err != nil {
			return fmt.Errorf("mount %s on %s: mounted, but not grown to its device: %w", m.Source, m.Target, err)
		}
	}
	return nil
}

// fileMountPoint makes path a regular file to mount a file on: one that
// is there stays; a symlink or nothing becomes an empty file.
func fileMountPoint(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode().IsRegular():
		return nil
	case err == nil && fi.Mode()&os.ModeSymlink != 0:
		if err := os.Remove(path); err != nil {
			return err
		}
	case err == nil:
		return fmt.Errorf("%s is a %v, not a file", path, fi.Mode().Type())
	case !os.IsNotExist(err):
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// runQuiet runs a helper through the reaper, collecting its output.
func (a *agent) runQuiet(ctx context.Context, name string, args ...string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		if path, err = lookPath("", name, nil); err != nil {
			return "", err
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return "", err
	}
	defer r.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		w.Close()
		return "", err
	}
	defer null.Close()
	p, exited, err := a.reaper.start(path, append([]string{name}, args...), &os.ProcAttr{
		Env: []string{"PATH=" + defaultPath}, Files: []*os.File{null, w, w}})
	w.Close()
	if err != nil {
		return "", err
	}
	out := make(chan string, 1)
	go func() {
		var b strings.Builder
		buf := make([]byte, 4096)
		for b.Len() < 64<<10 {
			n, err := r.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		out <- b.String()
	}()
	var ws unix.WaitStatus
	select {
	case ws = <-exited:
	case <-ctx.Done():
		p.Kill()
		ws = <-exited
	}
	p.Release()
	r.Close()
	text := <-out
	if !ws.Exited() || ws.ExitStatus() != 0 {
		return text, fmt.Errorf("exit status %d", ws.ExitStatus())
	}
	return text, nil
}
