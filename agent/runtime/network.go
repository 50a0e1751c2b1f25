package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/agent/dnsfilter"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/units"
)

// Every Instance with a network has its own network namespace,
// kibotos-<instance>, holding the tap the VMM's virtio-net device uses and a
// veth to the node (netpol). The guest gets one address of the node's pool,
// and one of its IPv6 pool when it has one.
const guestIface = "eth0"

// NetNSName is the network namespace of an Instance.
func NetNSName(instanceID string) string { return "kibotos-" + instanceID }

// NetworkRecord is an Instance's network as launched: what takeover
// regenerates its rule table from and checks the namespace against.
type NetworkRecord struct {
	Namespace string     `json:"namespace"`
	Guest     netip.Addr `json:"guest_ipv4"`
	// Guest6 and Pool6 are the guest's IPv6 address and the node's
	// ipv6_pool at launch; absent (a node without ipv6_pool, or a record
	// of a build before IPv6) the guest has no IPv6.
	Guest6   netip.Addr     `json:"guest_ipv6,omitzero"`
	HostVeth string         `json:"host_veth"`
	Policy   NetworkPolicy  `json:"policy"`
	Pool     netip.Prefix   `json:"ipv4_pool"`
	Pool6    netip.Prefix   `json:"ipv6_pool,omitzero"`
	Uplink   string         `json:"uplink"`
	Resolver netip.AddrPort `json:"resolver"`
	// Management is the node's management_cidrs at launch.
	Management []netip.Prefix `json:"management_cidrs"`
	// TapMAC is the tap's hardware address (netpol.TapMAC); empty in a
	// record of a build whose taps had random ones.
	TapMAC string `json:"tap_mac,omitempty"`
	// Switch is set while UpdateNetwork applies Policy: written with it
	// before the rule table is replaced, removed once the table and the
	// egress routes follow it. A record that keeps it after the node
	// ended is a switch left half done (check-maintenance names it); the
	// next node's takeover finishes it.
	Switch *NetworkSwitch `json:"switch,omitempty"`
}

// nodeNetwork is the node side of every Instance network. Without a
// configuration (cfg nil) it can still take networks down.
type nodeNetwork struct {
	cfg    *netpol.Config
	ns     netpol.Namespaces
	hostNS netns.NsHandle

	mu sync.Mutex
	// assigned and assigned6 are the guest addresses of Instances whose
	// network exists.
	assigned, assigned6 map[string]netip.Addr

	// egressMu orders the egress process's routes and the node's table.
	egressMu sync.Mutex
	// warnings of the configuration check, logged once the log is up.
	warnings []string
	// names answers the DNS of guests whose policy has domain rules (nil
	// without a configuration, or namesErr when it could not start).
	names    *dnsfilter.Filter
	namesErr error
}

// openNodeNetwork prepares the node's namespace for guest traffic:
// forwarding on and its own rule table in place (with a configuration).
func openNodeNetwork(ctx context.Context, cfg *netpol.Config, hostNSPath string, t units.Target, log *slog.Logger) (*nodeNetwork, error) {
	n := &nodeNetwork{cfg: cfg, assigned: map[string]netip.Addr{}, assigned6: map[string]netip.Addr{},
		ns: netpol.Namespaces{Dir: netpol.DefaultNamespaceDir}}
	if t.NetNSDir != "" {
		// A private systemd's /run/netns is a host directory it shares.
		n.ns = netpol.Namespaces{Dir: t.NetNSDir, ManagerDir: netpol.DefaultNamespaceDir}
	} else if err := n.ns.EnsureShared(); err != nil {
		return nil, err
	}
	var err error
	if hostNSPath == "" {
		n.hostNS, err = netns.GetFromPath("/proc/self/ns/net")
	} else {
		n.hostNS, err = netns.GetFromPath(hostNSPath)
	}
	if err != nil {
		return nil, fmt.Errorf("runtime: the node's network namespace: %w", err)
	}
	if cfg == nil {
		return n, nil
	}
	warnings, err := cfg.CheckHost(n.hostNS)
	if err != nil {
		n.hostNS.Close()
		return nil, fmt.Errorf("runtime: %w", err)
	}
	n.warnings = warnings
	if err := netpol.EnableForwarding(n.hostNS); err != nil {
		n.hostNS.Close()
		return nil, err
	}
	if cfg.IPv6Pool.IsValid() {
		if err := netpol.EnableForwarding6(n.hostNS); err != nil {
			n.hostNS.Close()
			return nil, err
		}
	}
	if err := netpol.SetUpProxyRouting(n.hostNS); err != nil {
		n.hostNS.Close()
		return nil, err
	}
	// No guest is proxied until takeover and starts say so.
	if err := n.replaceHostTable(ctx, nil); err != nil {
		n.hostNS.Close()
		return nil, err
	}
	// Without its resolver the node still runs (and can take networks
	// down): only policies with domain rules are refused (tableSpec).
	if err := n.openNames(log); err != nil {
		n.namesErr = err
		n.warnings = append(n.warnings, err.Error()+"; Workspaces with domain rules cannot start here")
	}
	return n, nil
}

// replaceHostTable puts the node's own table in place, TPROXYing the
// proxied guests' TCP to the egress process.
func (n *nodeNetwork) replaceHostTable(ctx context.Context, proxied []netip.Addr) error {
	cfg := n.cfg
	// The node's own DNS sockets count as resolvers: TCP DNS of proxied
	// guests goes to them, not into the egress proxy.
	resolvers := append(slices.Clone(cfg.Resolvers), EgressDNS, NamesDNS)
	host, err := netpol.BuildHost(netpol.HostSpec{Pools: cfg.Pools(), Management: cfg.ManagementCIDRs,
		UplinkIface: cfg.UplinkInterface(), UplinkAddr: cfg.UplinkAddr(), Resolvers: resolvers,
		Proxied: proxied, ProxyPort: EgressTCPPort})
	if err == nil {
		// The table must follow the routes the egress process was just
		// given even when the caller gave up (a failed start's or a
		// delete's sync): else TPROXY keeps sending a gone guest's
		// address to it. One replace takes about a millisecond.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err = netpol.ReplaceHost(rctx, int(n.hostNS), host)
		cancel()
	}
	if err != nil {
		return fmt.Errorf("runtime: the node's rule table: %w", err)
	}
	return nil
}

func (n *nodeNetwork) close() {
	if n.names != nil {
		n.names.Close()
	}
	n.hostNS.Close()
}

// reserve picks the guest addresses of a new Instance.
// A restored guest's addresses (prefer, nil for none) are given again
// where they are in the pools and free.
func (n *nodeNetwork) reserve(id string, p NetworkPolicy, prefer *SnapshotNetwork) (*NetworkRecord, error) {
	if n.cfg == nil {
		return nil, noNetworkConfig(id)
	}
	var want, want6 netip.Addr
	if prefer != nil {
		want, want6 = prefer.Guest, prefer.Guest6
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	addr, err := n.cfg.Allocate(slices.Collect(maps.Values(n.assigned)), want)
	if err != nil {
		return nil, fmt.Errorf("runtime: instance %s: %w", id, err)
	}
	nr := &NetworkRecord{
		Namespace: NetNSName(id), Guest: addr, HostVeth: netpol.HostVethName(id), Policy: p,
		Pool: n.cfg.IPv4Pool, Uplink: n.cfg.Uplink, Resolver: n.cfg.Resolvers[0],
		Management: slices.Clone(n.cfg.ManagementCIDRs), TapMAC: netpol.TapMAC,
	}
	if n.cfg.IPv6Pool.IsValid() {
		if nr.Guest6, err = n.cfg.Allocate6(slices.Collect(maps.Values(n.assigned6)), want6); err != nil {
			return nil, fmt.Errorf("runtime: instance %s: %w", id, err)
		}
		nr.Pool6 = n.cfg.IPv6Pool
		n.assigned6[id] = nr.Guest6
	}
	n.assigned[id] = addr
	return nr, nil
}

// hold marks a recorded network's addresses as taken (takeover, a start
// that replaces a stale namespace).
func (n *nodeNetwork) hold(id string, nr *NetworkRecord) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.assigned[id] = nr.Guest
	if nr.Guest6.IsValid() {
		n.assigned6[id] = nr.Guest6
	}
}

// rekey moves the addresses reserved for Instance from to Instance to.
func (n *nodeNetwork) rekey(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a, ok := n.assigned[from]; ok {
		n.assigned[to] = a
		delete(n.assigned, from)
	}
	if a, ok := n.assigned6[from]; ok {
		n.assigned6[to] = a
		delete(n.assigned6, from)
	}
}

func (n *nodeNetwork) release(id string) {
	n.mu.Lock()
	delete(n.assigned, id)
	delete(n.assigned6, id)
	n.mu.Unlock()
}

// tableSpec is the rule table of a recorded network under the node's
// current configuration.
func (n *nodeNetwork) tableSpec(nr *NetworkRecord) (netpol.TableSpec, error) {
	if n.cfg == nil {
		return netpol.TableSpec{}, errors.New("the node has no [network] configuration")
	}
	egress := nr.Policy.Egress
	switch egress {
	case netpol.EgressNone, netpol.EgressPublic:
	case netpol.EgressProxy:
		if nr.Policy.Proxy == nil {
			return netpol.TableSpec{}, errors.New("egress proxy without the Egress it names")
		}
	case "":
		egress = netpol.EgressNone
	default:
		return netpol.TableSpec{}, fmt.Errorf("egress %q cannot be enforced by this build", egress)
	}
	resolver := n.cfg.Resolvers[0]
	names := hasNames(nr.Policy)
	switch {
	case names && nr.Policy.Resolver != nil:
		return netpol.TableSpec{}, errors.New("domain rules with a Resolver cannot be enforced: the node's resolver learns the addresses")
	case names && n.names == nil:
		return netpol.TableSpec{}, fmt.Errorf("domain rules cannot be enforced: the node's resolver for them is not running (%v)", n.namesErr)
	case names:
		if err := checkNames(nr.Policy); err != nil {
			return netpol.TableSpec{}, err
		}
		resolver = NamesDNS
	case nr.Policy.Resolver != nil:
		resolver = EgressDNS
	}
	if nr.Guest6.IsValid() && !n.cfg.IPv6Pool.Contains(nr.Guest6) {
		return netpol.TableSpec{}, fmt.Errorf("guest IPv6 address %s is not of the node's ipv6_pool %s", nr.Guest6, poolOrNone(n.cfg.IPv6Pool))
	}
	hostAddrs, err := netpol.HostAddrs(n.hostNS)
	if err != nil {
		return netpol.TableSpec{}, err
	}
	return netpol.TableSpec{
		Guest: nr.Guest, Guest6: nr.Guest6, Egress: egress, Resolver: resolver,
		HostAddrs: hostAddrs, Management: n.cfg.ManagementCIDRs, Pools: n.cfg.Pools(),
		Allow: nr.Policy.Allow, Deny: nr.Policy.Deny,
		AllowNames: len(nr.Policy.AllowNames) > 0, DenyNames: len(nr.Policy.DenyNames) > 0,
	}, nil
}

// createNetwork makes the Instance's namespace, links and rule table. A
// namespace left by an interrupted start is replaced.
func (rt *Runtime) createNetwork(ctx context.Context, id string, owner *vmmAccount, nr *NetworkRecord) error {
	n := rt.net
	if n.ns.Exists(nr.Namespace) {
		if err := rt.deleteNetwork(ctx, id, nr); err != nil {
			return fmt.Errorf("runtime: instance %s: remove stale network namespace: %w", id, err)
		}
		n.hold(id, nr)
	}
	err := n.ns.Create(nr.Namespace)
	if err == nil {
		err = rt.setUpNetwork(ctx, id, owner, nr)
	}
	if err != nil {
		return errors.Join(fmt.Errorf("runtime: instance %s: network: %w", id, err), rt.deleteNetwork(context.WithoutCancel(ctx), id, nr))
	}
	return nil
}

func (rt *Runtime) setUpNetwork(ctx context.Context, id string, owner *vmmAccount, nr *NetworkRecord) error {
	n := rt.net
	ns, err := n.ns.Open(nr.Namespace)
	if err != nil {
		return err
	}
	defer ns.Close()
	link := netpol.Link{Guest: nr.Guest, Guest6: nr.Guest6, HostVeth: nr.HostVeth, TapOwner: -1, TapGroup: -1}
	if owner != nil {
		link.TapOwner, link.TapGroup = owner.uid, owner.gid
	}
	if err := netpol.Connect(n.hostNS, ns, link); err != nil {
		return err
	}
	spec, err := n.tableSpec(nr)
	if err != nil {
		return err
	}
	table, err := netpol.Build(spec)
	if err != nil {
		return err
	}
	if err := netpol.Replace(ctx, int(ns), table); err != nil {
		return err
	}
	n.registerNames(ctx, id, nr)
	return nil
}

// deleteNetwork removes the Instance's namespace (and with it the tap and
// its veth end) and the node-side veth; gone already is fine.
func (rt *Runtime) deleteNetwork(ctx context.Context, id string, nr *NetworkRecord) error {
	if nr == nil {
		return nil
	}
	n := rt.net
	n.forgetNames(nr.Guest)
	err := errors.Join(netpol.Disconnect(n.hostNS, nr.HostVeth), n.ns.Delete(nr.Namespace))
	if err != nil {
		return fmt.Errorf("runtime: instance %s: remove its network: %w", id, err)
	}
	n.release(id)
	return nil
}

// managerView turns a path of the unit manager's mount namespace into one
// this process can open: a private systemd has its own /run.
func (rt *Runtime) managerView(path string) string {
	if pid := rt.units.Target().ManagerPID; pid > 1 {
		return filepath.Join("/proc", strconv.Itoa(pid), "root", path)
	}
	return path
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

// guestNetwork is the guest side of the Instance's link: its address, the
// namespace as gateway and nameserver (DNS to it is DNATed to the resolver);
// with IPv6, its IPv6 address and the namespace's link-local address as
// its IPv6 gateway (DNS stays IPv4).
func guestNetwork(nr *NetworkRecord) guestproto.ConfigureRequest {
	ifc := guestproto.Interface{
		Name: guestIface, Addresses: []string{netip.PrefixFrom(nr.Guest, 32).String()},
		Routes: []guestproto.Route{
			{Destination: netpol.TapAddr + "/32"},
			{Destination: "default", Gateway: netpol.TapAddr},
		},
	}
	if nr.Guest6.IsValid() {
		ifc.Addresses = append(ifc.Addresses, netip.PrefixFrom(nr.Guest6, 128).String())
		ifc.Routes = append(ifc.Routes, guestproto.Route{Destination: "::/0", Gateway: netpol.TapAddr6})
	}
	return guestproto.ConfigureRequest{Interfaces: []guestproto.Interface{ifc}, DNS: []string{netpol.TapAddr}}
}

// noNetworkConfig is the error of a start that needs a network on a node
// without [network] configuration.
func noNetworkConfig(id string) error {
	return fmt.Errorf("runtime: instance %s needs a network, but the node has no [network] configuration: set ipv4_pool, management_cidrs, resolvers and uplink in its config file", id)
}

// checkNetwork is takeover's look at a running Instance's namespace: its
// table is regenerated from the record and the current configuration. It
// returns what was rewritten, or why the network was isolated instead
// (then the Instance is FAILED with its VMM left running).
func (rt *Runtime) checkNetwork(ctx context.Context, rec *LaunchRecord) (rewritten []string, isolated string) {
	nr := rec.Network
	n := rt.net
	if nr == nil {
		return nil, ""
	}
	ns, err := n.ns.Open(nr.Namespace)
	if err != nil {
		return nil, fmt.Sprintf("network namespace %s cannot be opened: %v", nr.Namespace, err)
	}
	defer ns.Close()
	isolate := func(why string) (rewritten []string, isolated string) {
		n.forgetNames(nr.Guest)
		if err := netpol.Isolate(int(ns)); err != nil {
			why += fmt.Sprintf(" (isolating the network failed: %v)", err)
		}
		return nil, why
	}
	if n.cfg == nil {
		return isolate("the node has no [network] configuration any more, so its rule table cannot be checked")
	}
	var changed []string
	if !slices.Equal(nr.Management, n.cfg.ManagementCIDRs) {
		changed = append(changed, fmt.Sprintf("management_cidrs changed since launch (recorded %s, now %s)", prefixes(nr.Management), prefixes(n.cfg.ManagementCIDRs)))
	}
	if nr.Uplink != n.cfg.Uplink {
		changed = append(changed, fmt.Sprintf("uplink changed since launch (recorded %q, now %q)", nr.Uplink, n.cfg.Uplink))
	}
	if nr.Pool != n.cfg.IPv4Pool {
		changed = append(changed, fmt.Sprintf("ipv4_pool changed since launch (recorded %s, now %s)", nr.Pool, n.cfg.IPv4Pool))
	}
	// A guest launched without IPv6 stays without it under a node that
	// has an ipv6_pool now: its table drops IPv6 as it did.
	if nr.Guest6.IsValid() && nr.Pool6 != n.cfg.IPv6Pool {
		changed = append(changed, fmt.Sprintf("ipv6_pool changed since launch (recorded %s, now %s)", poolOrNone(nr.Pool6), poolOrNone(n.cfg.IPv6Pool)))
	}
	if len(changed) > 0 {
		return isolate(strings.Join(changed, "; "))
	}
	spec, err := n.tableSpec(nr)
	if err != nil {
		return isolate(err.Error())
	}
	f, err := netpol.Inspect(int(ns), spec)
	if err != nil {
		return isolate(fmt.Sprintf("rule table of network namespace %s unreadable: %v", nr.Namespace, err))
	}
	switch f.Verdict {
	case netpol.VerdictMatch:
		n.registerNames(ctx, rec.InstanceID, nr)
		return nil, ""
	case netpol.VerdictRewrite:
		table, err := netpol.Build(spec)
		if err == nil {
			err = netpol.Replace(ctx, int(ns), table)
		}
		if err != nil {
			return isolate(fmt.Sprintf("rule table of network namespace %s could not be rewritten: %v", nr.Namespace, err))
		}
		n.registerNames(ctx, rec.InstanceID, nr)
		return f.Differences, ""
	default:
		return isolate(strings.Join(f.Reasons, "; "))
	}
}

func poolOrNone(p netip.Prefix) string {
	if !p.IsValid() {
		return "none"
	}
	return p.String()
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}
