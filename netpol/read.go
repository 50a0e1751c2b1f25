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
	all  []dumpedTable
	ours *Table
}

// readNamespace lists the namespace's tables and reads the table
// family/name in full.
func readNamespace(nsFD int, family nftables.TableFamily, name string) (namespaceTables, error) {
	var nt namespaceTables
	d, err := newDumper(nsFD)
	if err != nil {
		return nt, err
	}
	defer d.close()
	if nt.all, err = d.tables(); err != nil {
		return nt, fmt.Errorf("list tables: %w", err)
	}
	i := slices.IndexFunc(nt.all, func(t dumpedTable) bool { return t.family == family && t.name == name })
	if i < 0 {
		return nt, nil
	}
	t := &Table{Family: family, Name: name, Flags: nt.all[i].flags, Comment: nt.all[i].comment}
	kt := &nftables.Table{Family: family, Name: name}

	// Objects and set elements are read by the library, which decodes them
	// right.
	c, err := nftables.New(nftables.WithNetNSFd(nsFD), nftables.AsLasting())
	if err != nil {
		return nt, err
	}
	defer c.CloseLasting()
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

	if t.Sets, err = d.sets(kt); err != nil {
		return nt, fmt.Errorf("table %s: list sets: %w", name, err)
	}
	for _, s := range t.Sets {
		if (s.KeyType.Name != nftables.TypeIPAddr.Name && s.KeyType.Name != nftables.TypeIP6Addr.Name) || s.Flags&unix.NFT_SET_MAP != 0 {
			continue // not a set of addresses: its shape alone tells it from ours
		}
		elems, err := c.GetSetElements(&nftables.Set{Table: kt, Name: s.Name})
		if err != nil {
			return nt, fmt.Errorf("table %s: set %s: list elements: %w", name, s.Name, err)
		}
		if s.Flags&unix.NFT_SET_INTERVAL == 0 {
			s.Ranges, err = singleAddrs(elems, int(s.KeyType.Bytes))
		} else {
			s.Ranges, err = rangesFromElements(elems, int(s.KeyType.Bytes))
		}
		if err != nil {
			s.elemErr = err.Error()
		}
	}

	if t.Chains, err = d.chains(family, name); err != nil {
		return nt, fmt.Errorf("table %s: list chains: %w", name, err)
	}
	for _, ch := range t.Chains {
		if ch.Rules, err = d.rules(kt, ch.Name); err != nil {
			return nt, fmt.Errorf("table %s: chain %s: list rules: %w", name, ch.Name, err)
		}
	}
	nt.ours = t
	return nt, nil
}
