package netpol

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// namespaceTables is what a namespace holds: every table's family and name,
// and the node's own table read whole (nil when there is none).
type namespaceTables struct {
	all  []*nftables.Table
	ours *Table
}

// readNamespace reads the namespace's tables and, in full, the table
// family/name.
func readNamespace(nsFD int, family nftables.TableFamily, name string) (namespaceTables, error) {
	var nt namespaceTables
	c, err := nftables.New(nftables.WithNetNSFd(nsFD), nftables.AsLasting())
	if err != nil {
		return nt, err
	}
	defer c.CloseLasting()
	if nt.all, err = c.ListTables(); err != nil {
		return nt, fmt.Errorf("list tables: %w", err)
	}
	var kt *nftables.Table
	for _, t := range nt.all {
		if t.Family == family && t.Name == name {
			kt = t
		}
	}
	if kt == nil {
		return nt, nil
	}
	t := &Table{Family: kt.Family, Name: kt.Name, Flags: kt.Flags}

	objs, err := c.GetNamedObjects(kt)
	if err != nil {
		return nt, fmt.Errorf("table %s: list objects: %w", name, err)
	}
	for _, o := range objs {
		if no, ok := o.(*nftables.NamedObj); ok {
			if no.Type == nftables.ObjTypeCounter {
				t.Counters = append(t.Counters, no.Name)
			} else {
				t.Objects = append(t.Objects, Object{Name: no.Name, Type: no.Type})
			}
		}
	}
	slices.Sort(t.Counters)
	slices.SortFunc(t.Objects, func(a, b Object) int { return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Type, b.Type)) })

	d, err := newDumper(nsFD)
	if err != nil {
		return nt, err
	}
	defer d.close()
	if t.Sets, err = d.sets(kt); err != nil {
		return nt, fmt.Errorf("table %s: list sets: %w", name, err)
	}
	for _, s := range t.Sets {
		if s.KeyType.Name != nftables.TypeIPAddr.Name || s.Flags&unix.NFT_SET_MAP != 0 {
			continue // not a set of addresses: its shape alone tells it from ours
		}
		elems, err := c.GetSetElements(&nftables.Set{Table: kt, Name: s.Name})
		if err != nil {
			return nt, fmt.Errorf("table %s: set %s: list elements: %w", name, s.Name, err)
		}
		if s.Flags&unix.NFT_SET_INTERVAL == 0 {
			s.Ranges, err = singleAddrs(elems)
		} else {
			s.Ranges, err = rangesFromElements(elems)
		}
		if err != nil {
			s.elemErr = err.Error()
		}
	}

	chains, err := c.ListChainsOfTableFamily(family)
	if err != nil {
		return nt, fmt.Errorf("table %s: list chains: %w", name, err)
	}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != name {
			continue
		}
		rc := &Chain{Name: ch.Name, Type: ch.Type, regular: ch.Hooknum == nil}
		if ch.Hooknum != nil {
			rc.Hook = *ch.Hooknum
		}
		if ch.Priority != nil {
			rc.Priority = *ch.Priority
		}
		if ch.Policy != nil {
			rc.Policy = *ch.Policy
		}
		if rc.Rules, err = d.rules(kt, ch.Name); err != nil {
			return nt, fmt.Errorf("table %s: chain %s: list rules: %w", name, ch.Name, err)
		}
		t.Chains = append(t.Chains, rc)
	}
	nt.ours = t
	return nt, nil
}
