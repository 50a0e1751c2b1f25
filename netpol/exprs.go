package netpol

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The match and statement fragments rules are made of, each the expression
// sequence nft itself emits for the same text, so `nft list ruleset` prints
// our tables legibly and our renderer reads nft-written rules the same way.
// Every match loads into register 1; NAT uses register 2 for the port.

const (
	reg1 = unix.NFT_REG_1
	reg2 = unix.NFT_REG_2
)

// ifnameData pads an interface name to IFNAMSIZ for an exact match.
func ifnameData(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func metaCmp(key expr.MetaKey, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg1},
		&expr.Cmp{Op: op, Register: reg1, Data: data},
	}
}

func iifname(name string) []expr.Any {
	return metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpEq, ifnameData(name))
}

func oifname(name string) []expr.Any {
	return metaCmp(expr.MetaKeyOIFNAME, expr.CmpOpEq, ifnameData(name))
}

// iifnamePrefix matches names starting with prefix, as nft's "kb-*": the
// comparison is over the prefix's bytes only.
func iifnamePrefix(prefix string) []expr.Any {
	return metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpEq, []byte(prefix))
}

func oifnamePrefix(prefix string, op expr.CmpOp) []expr.Any {
	return metaCmp(expr.MetaKeyOIFNAME, op, []byte(prefix))
}

// ipv4 guards every IPv4 header match: in an inet table a payload load
// reads whatever header the packet has.
func ipv4() []expr.Any {
	return metaCmp(expr.MetaKeyNFPROTO, expr.CmpOpEq, []byte{unix.NFPROTO_IPV4})
}

func ipv6() []expr.Any {
	return metaCmp(expr.MetaKeyNFPROTO, expr.CmpOpEq, []byte{unix.NFPROTO_IPV6})
}

func l4proto(p byte) []expr.Any {
	return metaCmp(expr.MetaKeyL4PROTO, expr.CmpOpEq, []byte{p})
}

// Offsets of the IPv4 and IPv6 header fields and of the destination port,
// which is at the same place in the TCP and UDP headers (nft's "th
// dport"); the ICMPv6 type is the transport header's first byte.
const (
	offIPv4Saddr = 12
	offIPv4Daddr = 16
	offIPv6Saddr = 8
	offIPv6Daddr = 24
	offThDport   = 2
	offICMPType  = 0
)

// ICMPv6 neighbour discovery messages (RFC 4861).
const (
	icmpv6NeighborSolicit = 135
	icmpv6NeighborAdvert  = 136
)

func payload(base expr.PayloadBase, offset, length uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg1, Base: base, Offset: offset, Len: length}
}

// ipAddrCmp compares the address at offset of the network header, of
// a's length, with a.
func ipAddrCmp(offset uint32, op expr.CmpOp, a netip.Addr) []expr.Any {
	data := a.AsSlice()
	return []expr.Any{
		payload(expr.PayloadBaseNetworkHeader, offset, uint32(len(data))),
		&expr.Cmp{Op: op, Register: reg1, Data: data},
	}
}

func ipDaddr(a netip.Addr) []expr.Any { return ipAddrCmp(offIPv4Daddr, expr.CmpOpEq, a) }

func ipSaddrNot(a netip.Addr) []expr.Any { return ipAddrCmp(offIPv4Saddr, expr.CmpOpNeq, a) }

func ip6SaddrNot(a netip.Addr) []expr.Any { return ipAddrCmp(offIPv6Saddr, expr.CmpOpNeq, a) }

// ipAddrLookup looks the address of length bytes at offset up in s.
func ipAddrLookup(offset, length uint32, s *Set, invert bool) []expr.Any {
	return []expr.Any{
		payload(expr.PayloadBaseNetworkHeader, offset, length),
		&expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.id, Invert: invert},
	}
}

func ipDaddrIn(s *Set) []expr.Any { return ipAddrLookup(offIPv4Daddr, 4, s, false) }

func ipDaddrNotIn(s *Set) []expr.Any { return ipAddrLookup(offIPv4Daddr, 4, s, true) }

func ipSaddrIn(s *Set) []expr.Any { return ipAddrLookup(offIPv4Saddr, 4, s, false) }

func ip6DaddrIn(s *Set) []expr.Any { return ipAddrLookup(offIPv6Daddr, 16, s, false) }

func ip6DaddrNotIn(s *Set) []expr.Any { return ipAddrLookup(offIPv6Daddr, 16, s, true) }

func ip6SaddrIn(s *Set) []expr.Any { return ipAddrLookup(offIPv6Saddr, 16, s, false) }

// icmpv6Type matches the ICMPv6 type; the caller has matched the protocol.
func icmpv6Type(t byte) []expr.Any {
	return []expr.Any{
		payload(expr.PayloadBaseTransportHeader, offICMPType, 1),
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{t}},
	}
}

func port(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }

func thDport(op expr.CmpOp, p uint16) []expr.Any {
	return []expr.Any{
		payload(expr.PayloadBaseTransportHeader, offThDport, 2),
		&expr.Cmp{Op: op, Register: reg1, Data: port(p)},
	}
}

// Conntrack state and status bits (uapi nf_conntrack_common.h). Both are
// host-endian 32-bit words in the register.
const (
	ctStateInvalid     = expr.CtStateBitINVALID
	ctStateEstablished = expr.CtStateBitESTABLISHED
	ctStateRelated     = expr.CtStateBitRELATED
	ctStatusDNAT       = 1 << 5 // IPS_DST_NAT
)

// ctBits matches when any of bits is set, as nft's "ct state a,b".
func ctBits(key expr.CtKey, bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: key, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}
}

func ctState(bits uint32) []expr.Any  { return ctBits(expr.CtKeySTATE, bits) }
func ctStatus(bits uint32) []expr.Any { return ctBits(expr.CtKeySTATUS, bits) }

// ctDirOriginal is IP_CT_DIR_ORIGINAL: the direction the connection was
// opened in.
const ctDirOriginal = 0

// ctOriginalDport is the destination port the connection had before NAT.
// The library encodes the direction in 4 bytes where the kernel reads one,
// the first: right for the original direction (0), not for the reply.
func ctOriginalDport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyPROTODST, Register: reg1, Direction: ctDirOriginal},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: port(p)},
	}
}

func countDenied() []expr.Any {
	return []expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: CounterDenied}}
}

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

func goTo(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}
}

func accept() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}} }
func drop() []expr.Any   { return []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}} }

func dnat(to netip.AddrPort) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg1, Data: to.Addr().AsSlice()},
		&expr.Immediate{Register: reg2, Data: port(to.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: reg1, RegProtoMin: reg2},
	}
}

func snat(to netip.Addr) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg1, Data: to.AsSlice()},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: reg1},
	}
}

// tproxy hands the packet to the node's transparent listener at port p
// (the socket keeps the original destination) and marks it, so the policy
// route of the mark delivers it locally.
func tproxy(p uint16, mark uint32) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg1, Data: binaryutil.NativeEndian.PutUint32(mark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
		&expr.Immediate{Register: reg1, Data: port(p)},
		&expr.TProxy{Family: unix.NFPROTO_IPV4, TableFamily: unix.NFPROTO_INET, RegPort: reg1},
	}
}

// metaMarkNot matches packets whose mark is not m.
func metaMarkNot(m uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(m)},
	}
}

// refuse answers a denied guest IPv4 packet with "administratively
// prohibited": the guest's connect fails at once with "No route to
// host" instead of retrying SYNs for minutes, and the error cannot be
// taken for a peer's refusal (a reset), so it says the policy stopped it.
func refuse() []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}
}

// refuse6 is refuse for IPv6: a TCP reset, since a connecting Linux
// socket was measured to wait out its timeout despite the ICMPv6
// administratively-prohibited error (the guest counts it as received);
// other IPv6 packets it matches are dropped, as before.
func refuse6() []expr.Any { return tcpReset() }

// tcpReset rejects with a TCP reset, so a connect fails at once.
func tcpReset() []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}
}

func masquerade() []expr.Any { return []expr.Any{&expr.Masq{}} }

// seq joins fragments into one rule's expressions.
func seq(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
