package netpol

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// isolateMarker starts the marker name of the isolation table's rules,
// which is how Inspect knows an isolated namespace.
const isolateMarker = "isolate/"

// Isolate replaces every table of the namespace, the node's and anyone
// else's, with one table that drops everything in every hook, ingress of
// both links included, in one batch. It is what a node does with a
// namespace it cannot trust: nothing goes in or out until a Replace.
func Isolate(ctx context.Context, nsFD int) error {
	devices, err := presentLinks(nsFD, TapName, VethName)
	if err != nil {
		return fmt.Errorf("netpol: namespace fd %d: isolate: %w", nsFD, err)
	}
	d, err := newDumper(nsFD)
	if err != nil {
		return fmt.Errorf("netpol: namespace fd %d: isolate: %w", nsFD, err)
	}
	tables, err := d.tables()
	d.close()
	if err != nil {
		return fmt.Errorf("netpol: namespace fd %d: isolate: list tables: %w", nsFD, err)
	}
	t := isolationTable(devices)
	var x txn
	for _, ft := range tables {
		if ft.family != t.Family || ft.name != t.Name {
			if err := x.delTable(ft.family, ft.name); err != nil {
				return fmt.Errorf("netpol: namespace fd %d: isolate: %w", nsFD, err)
			}
		}
	}
	// A table added after the listing survives, but cannot accept what
	// our chains drop: a drop in any table is final.
	err = x.dropTable(t.Family, t.Name)
	if err == nil {
		err = x.addTable(t)
	}
	if err != nil {
		return fmt.Errorf("netpol: namespace fd %d: isolate: %w", nsFD, err)
	}
	if err := x.commit(ctx, nsFD); err != nil {
		return fmt.Errorf("netpol: namespace fd %d: isolate (tables unchanged): %w", nsFD, err)
	}
	return nil
}

// isolationTable drops everything: one policy-drop chain per hook, and an
// ingress chain for each of devices (the kernel refuses an ingress chain on
// a device that does not exist, so the caller passes those present).
func isolationTable(devices []string) *Table {
	b := newBuilder(layoutVersion)
	b.t.Counters = nil
	b.t.Comment = marker(b.v, isolateMarker+"table")
	add := func(name string, hook nftables.ChainHook, device string) {
		c := &Chain{Name: name, Type: nftables.ChainTypeFilter, Hook: hook, Comment: marker(b.v, isolateMarker+name),
			Priority: *nftables.ChainPriorityFilter, Policy: nftables.ChainPolicyDrop, Device: device}
		b.t.Chains = append(b.t.Chains, c)
		// The rule repeats the policy; it is there to carry the marker.
		c.Rules = append(c.Rules, &Rule{Comment: marker(b.v, isolateMarker+name), Exprs: drop()})
	}
	for _, d := range devices {
		add("ingress-"+d, inetIngress, d)
	}
	for _, h := range []struct {
		name string
		hook nftables.ChainHook
	}{
		{"prerouting", unix.NF_INET_PRE_ROUTING},
		{"input", unix.NF_INET_LOCAL_IN},
		{"forward", unix.NF_INET_FORWARD},
		{"output", unix.NF_INET_LOCAL_OUT},
		{"postrouting", unix.NF_INET_POST_ROUTING},
	} {
		add(h.name, h.hook, "")
	}
	return b.t
}

// presentLinks returns those of names that exist in the namespace.
func presentLinks(nsFD int, names ...string) ([]string, error) {
	h, err := netlink.NewHandleAt(netns.NsHandle(nsFD), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	var present []string
	for _, name := range names {
		_, err := h.LinkByName(name)
		var notFound netlink.LinkNotFoundError
		switch {
		case err == nil:
			present = append(present, name)
		case errors.As(err, &notFound):
		default:
			return nil, fmt.Errorf("link %s: %w", name, err)
		}
	}
	return present, nil
}
