package netpol

import (
	"context"
	"fmt"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Replace puts t in place of the namespace's table of the same name in one
// netlink batch: the old table's deletion and the new table's creation
// commit together or not at all, so no packet ever meets a namespace
// without rules, and a batch the kernel refuses leaves the old table as it
// was. Conntrack entries are not part of a table, so established
// connections survive. Counters start again from zero.
func Replace(ctx context.Context, nsFD int, t *Table) error {
	c, err := dial(ctx, nsFD)
	if err != nil {
		return fmt.Errorf("netpol: namespace fd %d: replace table %s: %w", nsFD, t.Name, err)
	}
	// Closing a netfilter socket waits until the kernel has freed what the
	// last batch deleted, an RCU grace period (12 ms measured on a loaded
	// 2-core host, where the batch itself takes 0.1 ms). The table is in
	// force once the batch is acknowledged, so the close runs behind the
	// return; until it is done the kernel holds the namespace's nftables
	// lock, which delays only another write to the same namespace.
	closing.Add(1)
	defer func() {
		go func() {
			defer closing.Done()
			c.CloseLasting()
		}()
	}()
	nt := &nftables.Table{Family: t.Family, Name: t.Name}
	// Adding the table first makes the delete valid when there is none
	// yet; adding an existing table is no change.
	c.AddTable(nt)
	c.DelTable(nt)
	if err := t.addTo(c); err != nil {
		return fmt.Errorf("netpol: namespace fd %d: replace table %s: %w", nsFD, t.Name, err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netpol: namespace fd %d: replace table %s (old table kept): %w", nsFD, t.Name, err)
	}
	return nil
}

// closing counts the sockets still closing behind a Replace, so a
// benchmark can time one replace without the previous one's close.
var closing sync.WaitGroup

// dial opens a lasting nftables connection (one socket for every request,
// closed by CloseLasting) into the namespace; the socket gives up at ctx's
// deadline.
func dial(ctx context.Context, nsFD int) (*nftables.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	opts := []nftables.ConnOption{nftables.WithNetNSFd(nsFD), nftables.AsLasting()}
	if dl, ok := ctx.Deadline(); ok {
		opts = append(opts, nftables.WithSockOptions(func(nc *netlink.Conn) error { return nc.SetDeadline(dl) }))
	}
	return nftables.New(opts...)
}

// addTo queues the creation of t and everything in it on c.
func (t *Table) addTo(c *nftables.Conn) error {
	nt := c.AddTable(&nftables.Table{Family: t.Family, Name: t.Name})
	for _, name := range t.Counters {
		c.AddObj(&nftables.NamedObj{Table: nt, Name: name, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
	}
	for i, s := range t.Sets {
		if s.Flags&^unix.NFT_SET_INTERVAL != 0 {
			return fmt.Errorf("set %s: flags %s: only interval sets are written", s.Name, setFlags(s.Flags))
		}
		ns := &nftables.Set{
			Table:    nt,
			Name:     s.Name,
			ID:       uint32(i + 1), // Build numbers its sets the same way for its lookups
			KeyType:  s.KeyType,
			Interval: s.Flags&unix.NFT_SET_INTERVAL != 0,
			Comment:  s.Comment,
		}
		if err := c.AddSet(ns, setElements(s.Ranges)); err != nil {
			return fmt.Errorf("set %s: %w", s.Name, err)
		}
	}
	// Every chain before any rule: a rule may jump to a chain listed later.
	chains := make([]*nftables.Chain, len(t.Chains))
	for i, ch := range t.Chains {
		nc := &nftables.Chain{Name: ch.Name, Table: nt}
		if !ch.regular {
			hook, prio, policy := ch.Hook, ch.Priority, ch.Policy
			nc.Type, nc.Hooknum, nc.Priority, nc.Policy, nc.Device = ch.Type, &hook, &prio, &policy, ch.Device
		}
		chains[i] = c.AddChain(nc)
	}
	for i, ch := range t.Chains {
		for _, r := range ch.Rules {
			ud := r.UserData
			if ud == nil && r.Comment != "" {
				ud = ruleUserData(r.Comment)
			}
			c.AddRule(&nftables.Rule{Table: nt, Chain: chains[i], Exprs: r.Exprs, UserData: ud})
		}
	}
	return nil
}
