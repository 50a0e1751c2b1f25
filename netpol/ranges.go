package netpol

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// addrRange is an inclusive range of addresses of one family: the unit an
// interval set stores. Prefixes from the spec are turned into ranges and
// merged, so two overlapping prefixes (the kernel refuses overlapping
// intervals) and a set read back after someone added an adjacent element
// compare equal when they cover the same addresses.
type addrRange struct {
	from, to netip.Addr
}

func rangeOf(p netip.Prefix) addrRange {
	p = p.Masked()
	return addrRange{from: p.Addr(), to: lastAddr(p)}
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// rangesOf turns prefixes of one family into merged, sorted ranges.
// Callers have validated the prefixes and split them by family.
func rangesOf(ps ...[]netip.Prefix) []addrRange {
	var rs []addrRange
	for _, list := range ps {
		for _, p := range list {
			rs = append(rs, rangeOf(p))
		}
	}
	return mergeRanges(rs)
}

// mergeRanges sorts and joins overlapping and adjacent ranges: the one
// canonical form both sides of a comparison are brought to.
func mergeRanges(rs []addrRange) []addrRange {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b addrRange) int {
		if c := a.from.Compare(b.from); c != 0 {
			return c
		}
		return a.to.Compare(b.to)
	})
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 && r.from.BitLen() == out[n-1].to.BitLen() &&
			(r.from.Compare(out[n-1].to) <= 0 || r.from == out[n-1].to.Next()) {
			if r.to.Compare(out[n-1].to) > 0 {
				out[n-1].to = r.to
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// prefixBits is the prefix length when r is exactly one prefix, else -1.
func (r addrRange) prefixBits() int {
	for bits := 0; bits <= r.from.BitLen(); bits++ {
		p := netip.PrefixFrom(r.from, bits)
		if p.Masked().Addr() == r.from && lastAddr(p) == r.to {
			return bits
		}
	}
	return -1
}

// String renders r the way nft lists an interval element.
func (r addrRange) String() string {
	switch n := r.prefixBits(); {
	case n == r.from.BitLen():
		return r.from.String()
	case n >= 0:
		return netip.PrefixFrom(r.from, n).String()
	}
	return r.from.String() + "-" + r.to.String()
}

// edge is one interval element of a set: the first address of a range,
// or (end) the first address past it.
type edge struct {
	at  netip.Addr
	end bool
}

// intervalEdges are ranges as the kernel's interval elements: a start
// element and an end element one past the range, which is left out when the
// range runs to the top of its address space (nft does the same).
func intervalEdges(rs []addrRange) []edge {
	out := make([]edge, 0, 2*len(rs))
	for _, r := range rs {
		out = append(out, edge{at: r.from})
		if next := r.to.Next(); next.IsValid() {
			out = append(out, edge{at: next, end: true})
		}
	}
	return out
}

// elementAddr decodes a set element's key of keyLen bytes (4 or 16).
func elementAddr(key []byte, keyLen int) (netip.Addr, error) {
	if len(key) != keyLen || (keyLen != 4 && keyLen != 16) {
		return netip.Addr{}, fmt.Errorf("element key of %d bytes, want an address of %d", len(key), keyLen)
	}
	a, _ := netip.AddrFromSlice(key)
	return a, nil
}

// topAddr is the highest address of the family of a.
func topAddr(a netip.Addr) netip.Addr {
	return lastAddr(netip.PrefixFrom(a, 0))
}

// rangesFromElements decodes interval elements of keys of keyLen bytes as
// the kernel lists them (in any order; a start without an end runs to the
// top of the space; an end without a start, as older nft versions wrote at
// the bottom of the space, is nothing).
func rangesFromElements(elems []nftables.SetElement, keyLen int) ([]addrRange, error) {
	edges := make([]edge, 0, len(elems))
	for _, e := range elems {
		a, err := elementAddr(e.Key, keyLen)
		if err != nil {
			return nil, err
		}
		edges = append(edges, edge{at: a, end: e.IntervalEnd})
	}
	// at equal addresses an end closes the range before a start opens the next
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		switch {
		case a.end == b.end:
			return 0
		case a.end:
			return -1
		}
		return 1
	})
	var out []addrRange
	open, start := false, netip.Addr{}
	for _, e := range edges {
		switch {
		case !e.end && !open:
			open, start = true, e.at
		case !e.end && open:
			return nil, fmt.Errorf("two interval starts without an end at %s", e.at)
		case e.end && open:
			if e.at == start {
				return nil, fmt.Errorf("empty interval at %s", e.at)
			}
			out = append(out, addrRange{from: start, to: e.at.Prev()})
			open = false
		}
	}
	if open {
		out = append(out, addrRange{from: start, to: topAddr(start)})
	}
	return mergeRanges(out), nil
}

// singleAddrs decodes the elements of a set without intervals: one address
// of keyLen bytes each.
func singleAddrs(elems []nftables.SetElement, keyLen int) ([]addrRange, error) {
	var out []addrRange
	for _, e := range elems {
		a, err := elementAddr(e.Key, keyLen)
		if err != nil {
			return nil, err
		}
		out = append(out, addrRange{from: a, to: a})
	}
	return mergeRanges(out), nil
}
