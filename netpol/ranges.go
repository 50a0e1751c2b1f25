package netpol

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// addrRange is an inclusive range of IPv4 addresses: the unit an interval
// set stores. Prefixes from the spec are turned into ranges and merged, so
// two overlapping prefixes (the kernel refuses overlapping intervals) and
// a set read back after someone added an adjacent element compare equal
// when they cover the same addresses.
type addrRange struct {
	from, to uint32
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func addr4(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func rangeOf(p netip.Prefix) addrRange {
	p = p.Masked()
	from := u32(p.Addr())
	host := uint32(1<<(32-p.Bits()) - 1) // 1<<32 wraps to 0 for /0: all ones
	return addrRange{from: from, to: from | host}
}

// rangesOf turns IPv4 prefixes into merged, sorted ranges. Callers have
// validated the prefixes and dropped IPv6 ones.
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
		return cmp.Or(cmp.Compare(a.from, b.from), cmp.Compare(a.to, b.to))
	})
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 && (r.from <= out[n-1].to || r.from == out[n-1].to+1) {
			out[n-1].to = max(out[n-1].to, r.to)
			continue
		}
		out = append(out, r)
	}
	return out
}

// prefixBits is the prefix length when r is exactly one prefix, else -1.
func (r addrRange) prefixBits() int {
	size := uint64(r.to) - uint64(r.from) + 1
	if size&(size-1) != 0 {
		return -1
	}
	hostBits := bits.TrailingZeros64(size)
	if hostBits < 32 && r.from&(1<<hostBits-1) != 0 {
		return -1
	}
	return 32 - hostBits
}

// String renders r the way nft lists an interval element.
func (r addrRange) String() string {
	switch n := r.prefixBits(); {
	case n == 32:
		return addr4(r.from).String()
	case n >= 0:
		return netip.PrefixFrom(addr4(r.from), n).String()
	}
	return addr4(r.from).String() + "-" + addr4(r.to).String()
}

// setElements encodes ranges as the kernel's interval elements: a start
// element and an end element one past the range, which is left out when the
// range runs to 255.255.255.255 (nft does the same).
func setElements(rs []addrRange) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: addr4(r.from).AsSlice()})
		if r.to != ^uint32(0) {
			out = append(out, nftables.SetElement{Key: addr4(r.to + 1).AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// rangesFromElements decodes interval elements as the kernel lists them
// (in any order; a start without an end runs to the top of the space; an
// end without a start, as older nft versions wrote at 0.0.0.0, is nothing).
func rangesFromElements(elems []nftables.SetElement) ([]addrRange, error) {
	type edge struct {
		at  uint32
		end bool
	}
	edges := make([]edge, 0, len(elems))
	for _, e := range elems {
		if len(e.Key) != 4 {
			return nil, fmt.Errorf("element key of %d bytes, want an IPv4 address", len(e.Key))
		}
		edges = append(edges, edge{at: binary.BigEndian.Uint32(e.Key), end: e.IntervalEnd})
	}
	// at equal addresses an end closes the range before a start opens the next
	slices.SortFunc(edges, func(a, b edge) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
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
	open, start := false, uint32(0)
	for _, e := range edges {
		switch {
		case !e.end && !open:
			open, start = true, e.at
		case !e.end && open:
			return nil, fmt.Errorf("two interval starts without an end at %s", addr4(e.at))
		case e.end && open:
			if e.at == start {
				return nil, fmt.Errorf("empty interval at %s", addr4(e.at))
			}
			out = append(out, addrRange{from: start, to: e.at - 1})
			open = false
		}
	}
	if open {
		out = append(out, addrRange{from: start, to: ^uint32(0)})
	}
	return mergeRanges(out), nil
}

// singleAddrs decodes the elements of a set without intervals: one address
// each.
func singleAddrs(elems []nftables.SetElement) ([]addrRange, error) {
	var out []addrRange
	for _, e := range elems {
		if len(e.Key) != 4 {
			return nil, fmt.Errorf("element key of %d bytes, want an IPv4 address", len(e.Key))
		}
		a := binary.BigEndian.Uint32(e.Key)
		out = append(out, addrRange{from: a, to: a})
	}
	return mergeRanges(out), nil
}
