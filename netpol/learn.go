package netpol

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Bounds of a learned element's life. An answer with a TTL of zero still
// has to carry the connect that follows it; one of days would keep an
// address reachable long after the name moved.
const (
	MinLearnedTimeout = time.Minute
	MaxLearnedTimeout = 24 * time.Hour
	// maxLearn bounds one call: a DNS answer holds far fewer addresses.
	maxLearn = 256
)

// LearnedTimeout is how long an address answered with ttl stays in a
// learned set.
func LearnedTimeout(ttl time.Duration) time.Duration {
	return min(max(ttl, MinLearnedTimeout), MaxLearnedTimeout)
}

// Learn puts addrs into a learned list of the namespace's table, the
// IPv4 ones into set (SetAllowNames or SetDenyNames) and the IPv6 ones
// into its IPv6 twin (SetAllowNames6, SetDenyNames6), each expiring after
// timeout (clamped to the bounds above) from now: an address there
// already gets the new timeout. It is one transaction, so a refresh never
// leaves an address out for a moment. A table without a set the
// addresses need (the policy changed, or the guest has no IPv6) is an
// error and changes nothing.
func Learn(ctx context.Context, nsFD int, set string, addrs []netip.Addr, timeout time.Duration) error {
	var set4, set6 string
	switch set {
	case SetAllowNames, SetAllowNames6:
		set4, set6 = SetAllowNames, SetAllowNames6
	case SetDenyNames, SetDenyNames6:
		set4, set6 = SetDenyNames, SetDenyNames6
	default:
		return fmt.Errorf("netpol: learn: %q is not a learned set", set)
	}
	if len(addrs) == 0 {
		return nil
	}
	if len(addrs) > maxLearn {
		return fmt.Errorf("netpol: learn into %s: %d addresses, at most %d", set, len(addrs), maxLearn)
	}
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		switch {
		case a.Is4():
			v4 = append(v4, a)
		case a.Is6() && !a.Is4In6() && a.Zone() == "":
			v6 = append(v6, a)
		default:
			return fmt.Errorf("netpol: learn into %s: %s is not an IPv4 or IPv6 address", set, a)
		}
	}
	ms := uint64(LearnedTimeout(timeout).Milliseconds())
	// Adding what exists changes nothing (no NLM_F_EXCL), so the delete
	// that follows finds every address, and the last add sets the timeout
	// afresh: together they create or refresh.
	var x txn
	for _, step := range []struct {
		msg     int
		timeout bool
	}{{unix.NFT_MSG_NEWSETELEM, true}, {unix.NFT_MSG_DELSETELEM, false}, {unix.NFT_MSG_NEWSETELEM, true}} {
		for _, part := range []struct {
			set   string
			addrs []netip.Addr
		}{{set4, v4}, {set6, v6}} {
			if len(part.addrs) == 0 {
				continue
			}
			if err := x.setElems(step.msg, part.set, part.addrs, step.timeout, ms); err != nil {
				return fmt.Errorf("netpol: learn into %s: %w", part.set, err)
			}
		}
	}
	if err := x.commit(ctx, nsFD); err != nil {
		return fmt.Errorf("netpol: namespace fd %d: learn into %s: %w", nsFD, set, err)
	}
	return nil
}

// setElems queues one message adding or deleting single-address elements
// of a set of the node's table.
func (x *txn) setElems(msg int, set string, addrs []netip.Addr, withTimeout bool, timeoutMS uint64) error {
	list := make([]netlink.Attribute, 0, len(addrs))
	for _, a := range addrs {
		key, err := nested(unix.NFTA_SET_ELEM_KEY, netlink.Attribute{Type: unix.NFTA_DATA_VALUE, Data: a.AsSlice()})
		if err != nil {
			return err
		}
		item := []netlink.Attribute{key}
		if withTimeout {
			item = append(item, netlink.Attribute{Type: unix.NFTA_SET_ELEM_TIMEOUT, Data: binary.BigEndian.AppendUint64(nil, timeoutMS)})
		}
		elem, err := nested(unix.NFTA_LIST_ELEM, item...)
		if err != nil {
			return err
		}
		list = append(list, elem)
	}
	elements, err := nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, list...)
	if err != nil {
		return err
	}
	what := "add elements"
	var flags netlink.HeaderFlags = netlink.Create
	if msg == unix.NFT_MSG_DELSETELEM {
		what, flags = "delete elements", 0
	}
	return x.add(msg, nftables.TableFamilyINet, flags, what,
		strAttr(unix.NFTA_SET_ELEM_LIST_TABLE, TableName), strAttr(unix.NFTA_SET_ELEM_LIST_SET, set), elements)
}
