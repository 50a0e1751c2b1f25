package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Every Instance with a network has its own network namespace,
// kibotos-<instance>, holding one tap that the VMM's virtio-net device uses.
// The namespaces are isolated from each other, so every one uses the same
// link-local /30: the node end of the tap and the guest.
const (
	TapName      = "kt0"
	HostTapAddr  = "169.254.100.1/30"
	GuestAddr    = "169.254.100.2/30"
	GuestGateway = "169.254.100.1"
	guestIface   = "eth0"
)

// NetNSName is the network namespace of an Instance.
func NetNSName(instanceID string) string { return "kibotos-" + instanceID }

// netnsPath is where the namespace is mounted in the unit manager's mount
// namespace (NetworkNamespacePath of the VMM unit).
func netnsPath(instanceID string) string { return "/run/netns/" + NetNSName(instanceID) }

// managerView turns a path of the unit manager's mount namespace into one
// this process can open: a private systemd has its own /run.
func (rt *Runtime) managerView(path string) string {
	if pid := rt.units.Target().ManagerPID; pid > 1 {
		return filepath.Join("/proc", strconv.Itoa(pid), "root", path)
	}
	return path
}

// inManagerNS runs ip(8) in the unit manager's mount namespace, where the
// VMM unit resolves NetworkNamespacePath (recipe: inside a private systemd,
// `ip netns` needs its mount and pid namespaces).
func (rt *Runtime) inManagerNS(ctx context.Context, args ...string) error {
	argv := append([]string{"ip"}, args...)
	if pid := rt.units.Target().ManagerPID; pid > 1 {
		argv = append([]string{"nsenter", "-t", strconv.Itoa(pid), "-m", "-p", "--"}, argv...)
	}
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// createNetwork makes the Instance's namespace with its tap up and
// addressed. A namespace left by an interrupted start is replaced.
func (rt *Runtime) createNetwork(ctx context.Context, id string, owner *vmmAccount) error {
	ns := NetNSName(id)
	if _, err := os.Stat(rt.managerView(netnsPath(id))); err == nil {
		if err := rt.inManagerNS(ctx, "netns", "del", ns); err != nil {
			return fmt.Errorf("runtime: instance %s: remove stale network namespace: %w", id, err)
		}
	}
	// The tap belongs to the VMM account, so QEMU running as it may attach
	// to it (TUNSETIFF on a persistent tap checks its owner) without
	// CAP_NET_ADMIN.
	tuntap := []string{"-n", ns, "tuntap", "add", "dev", TapName, "mode", "tap"}
	if owner != nil {
		tuntap = append(tuntap, "user", strconv.Itoa(owner.uid), "group", strconv.Itoa(owner.gid))
	}
	steps := [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		tuntap,
		{"-n", ns, "addr", "add", HostTapAddr, "dev", TapName},
		{"-n", ns, "link", "set", TapName, "up"},
	}
	for _, s := range steps {
		if err := rt.inManagerNS(ctx, s...); err != nil {
			return errors.Join(fmt.Errorf("runtime: instance %s: network: %w", id, err), rt.deleteNetwork(context.WithoutCancel(ctx), id))
		}
	}
	return nil
}

// deleteNetwork removes the Instance's namespace (and with it the tap);
// a namespace that is already gone is fine.
func (rt *Runtime) deleteNetwork(ctx context.Context, id string) error {
	if _, err := os.Stat(rt.managerView(netnsPath(id))); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := rt.inManagerNS(ctx, "netns", "del", NetNSName(id)); err != nil {
		return fmt.Errorf("runtime: instance %s: remove network namespace: %w", id, err)
	}
	return nil
}

// netnsMismatch says how the VMM's network namespace differs from the
// recorded one, or "".
func (rt *Runtime) netnsMismatch(hostPID int, recorded string) string {
	if recorded == "" {
		return ""
	}
	var want, got unix.Stat_t
	if err := unix.Stat(rt.managerView(recorded), &want); err != nil {
		return fmt.Sprintf("network namespace %s unreadable: %v", recorded, err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", hostPID), &got); err != nil {
		return fmt.Sprintf("network namespace of host PID %d unreadable: %v", hostPID, err)
	}
	if want.Ino != got.Ino || want.Dev != got.Dev {
		return fmt.Sprintf("network namespace inode %d, recorded %s (inode %d)", got.Ino, recorded, want.Ino)
	}
	return ""
}

// guestNetwork is the guest side of the Instance's link.
func guestNetwork() guestproto.ConfigureRequest {
	return guestproto.ConfigureRequest{Interfaces: []guestproto.Interface{{
		Name: guestIface, Addresses: []string{GuestAddr},
		Routes: []guestproto.Route{{Destination: "default", Gateway: GuestGateway}},
	}}}
}
