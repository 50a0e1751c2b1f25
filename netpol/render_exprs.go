package netpol

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// valueKind says how a register's contents print.
type valueKind int

const (
	kindRaw valueKind = iota
	kindIfname
	kindNfproto
	kindL4proto
	kindIPv4
	kindIPv6
	kindICMPv6Type
	kindPort
	kindCtState
	kindCtStatus
	kindMark
)

// operand is what a register holds while a rule is decompiled.
type operand struct {
	what string // nft's name of the loaded field, e.g. "ip daddr"
	kind valueKind
	imm  []byte // an immediate value
	// mask is set when a bitwise and (without xor) was applied.
	mask []byte
}

// renderExprs decompiles expressions into nft's statement syntax. It knows
// the sequences the node writes and the common ones nft writes; anything
// else prints as the library's struct, so a rule never renders like one it
// is not.
func renderExprs(exprs []expr.Any) string {
	regs := map[uint32]operand{}
	var out []string
	// icmpv6 is set once the rule matched the ICMPv6 protocol: then the
	// transport header's first byte is its type.
	icmpv6 := false
	get := func(r uint32) operand {
		if op, ok := regs[r]; ok {
			return op
		}
		return operand{what: "reg " + strconv.Itoa(int(r))}
	}
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			if e.SourceRegister {
				v := get(e.Register)
				val := v.value()
				if e.Key == expr.MetaKeyMARK && len(v.imm) == 4 {
					val = fmt.Sprintf("%#x", binary.NativeEndian.Uint32(v.imm)) // host byte order
				}
				out = append(out, fmt.Sprintf("%s set %s", metaName(e.Key), val))
				continue
			}
			regs[e.Register] = metaOperand(e.Key)
		case *expr.Payload:
			if e.OperationType == expr.PayloadWrite {
				out = append(out, fmt.Sprintf("%s set %s csum %d,%d,%d", payloadField(e.Base, e.Offset, e.Len), get(e.SourceRegister).value(), e.CsumType, e.CsumOffset, e.CsumFlags))
				continue
			}
			regs[e.DestRegister] = payloadOperand(e.Base, e.Offset, e.Len, icmpv6)
		case *expr.Ct:
			if e.SourceRegister {
				out = append(out, fmt.Sprintf("ct key %d set %s", e.Key, get(e.Register).value()))
				continue
			}
			regs[e.Register] = ctOperand(e.Key, e.Direction)
		case *expr.Bitwise:
			op := get(e.SourceRegister)
			if op.mask == nil && isZero(e.Xor) {
				op.mask = e.Mask
			} else {
				op = operand{what: fmt.Sprintf("(%s & 0x%x ^ 0x%x)", op.what, e.Mask, e.Xor)}
			}
			regs[e.DestRegister] = op
		case *expr.Immediate:
			regs[e.Register] = operand{what: "0x" + hex.EncodeToString(e.Data), imm: e.Data}
		case *expr.Cmp:
			op := get(e.Register)
			if op.kind == kindL4proto && e.Op == expr.CmpOpEq && len(e.Data) == 1 && e.Data[0] == unix.IPPROTO_ICMPV6 && op.mask == nil {
				icmpv6 = true
			}
			out = append(out, op.compare(e.Op, e.Data))
		case *expr.Lookup:
			op := get(e.SourceRegister)
			not := ""
			if e.Invert {
				not = "!= "
			}
			s := fmt.Sprintf("%s %s@%s", op.what, not, e.SetName)
			if e.IsDestRegSet {
				s = fmt.Sprintf("%s map %s@%s => reg %d", op.what, not, e.SetName, e.DestRegister)
			}
			out = append(out, s)
		case *expr.NAT:
			out = append(out, renderNAT(e, get))
		case *expr.Redir:
			s := "redirect"
			if e.RegisterProtoMin != 0 {
				s += " to :" + get(e.RegisterProtoMin).portValue()
				if e.RegisterProtoMax != 0 && e.RegisterProtoMax != e.RegisterProtoMin {
					s += "-" + get(e.RegisterProtoMax).portValue()
				}
			}
			// the kernel adds "proto specified" itself when a port is given
			if f := e.Flags &^ unix.NF_NAT_RANGE_PROTO_SPECIFIED; f != 0 {
				s += fmt.Sprintf(" flags 0x%x", f)
			}
			out = append(out, s)
		case *expr.TProxy:
			s := "tproxy"
			if e.Family == unix.NFPROTO_IPV4 {
				s += " ip"
			}
			if e.RegAddr != 0 {
				s += " to " + get(e.RegAddr).value()
			} else {
				s += " to "
			}
			out = append(out, s+":"+get(e.RegPort).portValue())
		case *expr.Reject:
			switch {
			case e.Type == unix.NFT_REJECT_TCP_RST:
				out = append(out, "reject with tcp reset")
			case e.Type == unix.NFT_REJECT_ICMPX_UNREACH && e.Code == unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED:
				out = append(out, "reject with icmpx admin-prohibited")
			default:
				out = append(out, fmt.Sprintf("reject type %d code %d", e.Type, e.Code))
			}
		case *expr.Masq:
			s := "masquerade"
			if e.ToPorts {
				s += " to :" + get(e.RegProtoMin).portValue()
				if e.RegProtoMax != 0 && e.RegProtoMax != e.RegProtoMin {
					s += "-" + get(e.RegProtoMax).portValue()
				}
			}
			s += natFlags(e.Random, e.FullyRandom, e.Persistent, false)
			out = append(out, s)
		case *expr.Counter:
			out = append(out, "counter") // values change; the statement does not
		case *expr.Objref:
			if e.Type == int(nftables.ObjTypeCounter) {
				out = append(out, fmt.Sprintf("counter name %q", e.Name))
			} else {
				out = append(out, fmt.Sprintf("objref type %d name %q", e.Type, e.Name))
			}
		case *expr.Verdict:
			out = append(out, verdictName(e))
		default:
			out = append(out, fmt.Sprintf("[%T %+v]", e, e))
		}
	}
	return strings.Join(out, " ")
}

func renderNAT(e *expr.NAT, get func(uint32) operand) string {
	kind, fam := "snat", "ip"
	if e.Type == expr.NATTypeDestNAT {
		kind = "dnat"
	}
	if e.Family == unix.NFPROTO_IPV6 {
		fam = "ip6"
	}
	s := kind + " " + fam
	if e.RegAddrMin != 0 {
		s += " to " + get(e.RegAddrMin).value()
		// the kernel fills an unset maximum with the minimum's register
		if e.RegAddrMax != 0 && e.RegAddrMax != e.RegAddrMin {
			s += "-" + get(e.RegAddrMax).value()
		}
	} else if e.RegProtoMin != 0 {
		s += " to "
	}
	if e.RegProtoMin != 0 {
		s += ":" + get(e.RegProtoMin).portValue()
		if e.RegProtoMax != 0 && e.RegProtoMax != e.RegProtoMin {
			s += "-" + get(e.RegProtoMax).portValue()
		}
	}
	return s + natFlags(e.Random, e.FullyRandom, e.Persistent, e.Prefix)
}

func natFlags(random, fullyRandom, persistent, prefix bool) string {
	s := ""
	for _, f := range []struct {
		on   bool
		name string
	}{{random, "random"}, {fullyRandom, "fully-random"}, {persistent, "persistent"}, {prefix, "prefix"}} {
		if f.on {
			s += " " + f.name
		}
	}
	return s
}

func verdictName(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictContinue:
		return "continue"
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictGoto:
		return "goto " + v.Chain
	}
	return fmt.Sprintf("verdict %d", v.Kind)
}

func metaName(k expr.MetaKey) string {
	switch k {
	case expr.MetaKeyIIFNAME:
		return "iifname"
	case expr.MetaKeyOIFNAME:
		return "oifname"
	case expr.MetaKeyIIF:
		return "iif"
	case expr.MetaKeyOIF:
		return "oif"
	case expr.MetaKeyNFPROTO:
		return "meta nfproto"
	case expr.MetaKeyL4PROTO:
		return "meta l4proto"
	case expr.MetaKeyMARK:
		return "meta mark"
	case expr.MetaKeySKUID:
		return "meta skuid"
	}
	return "meta key " + strconv.Itoa(int(k))
}

func metaOperand(k expr.MetaKey) operand {
	op := operand{what: metaName(k)}
	switch k {
	case expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME:
		op.kind = kindIfname
	case expr.MetaKeyNFPROTO:
		op.kind = kindNfproto
	case expr.MetaKeyL4PROTO:
		op.kind = kindL4proto
	case expr.MetaKeyMARK:
		op.kind = kindMark
	}
	return op
}

func payloadField(base expr.PayloadBase, offset, length uint32) string {
	switch {
	case base == expr.PayloadBaseNetworkHeader && offset == offIPv4Saddr && length == 4:
		return "ip saddr"
	case base == expr.PayloadBaseNetworkHeader && offset == offIPv4Daddr && length == 4:
		return "ip daddr"
	case base == expr.PayloadBaseNetworkHeader && offset == offIPv6Saddr && length == 16:
		return "ip6 saddr"
	case base == expr.PayloadBaseNetworkHeader && offset == offIPv6Daddr && length == 16:
		return "ip6 daddr"
	case base == expr.PayloadBaseTransportHeader && offset == 0 && length == 2:
		return "th sport"
	case base == expr.PayloadBaseTransportHeader && offset == offThDport && length == 2:
		return "th dport"
	}
	names := map[expr.PayloadBase]string{
		expr.PayloadBaseLLHeader:        "@ll",
		expr.PayloadBaseNetworkHeader:   "@nh",
		expr.PayloadBaseTransportHeader: "@th",
	}
	name, ok := names[base]
	if !ok {
		name = "@base" + strconv.Itoa(int(base))
	}
	return fmt.Sprintf("%s,%d,%d", name, offset*8, length*8)
}

func payloadOperand(base expr.PayloadBase, offset, length uint32, icmpv6 bool) operand {
	if icmpv6 && base == expr.PayloadBaseTransportHeader && offset == offICMPType && length == 1 {
		return operand{what: "icmpv6 type", kind: kindICMPv6Type}
	}
	op := operand{what: payloadField(base, offset, length)}
	switch op.what {
	case "ip saddr", "ip daddr":
		op.kind = kindIPv4
	case "ip6 saddr", "ip6 daddr":
		op.kind = kindIPv6
	case "th sport", "th dport":
		op.kind = kindPort
	}
	return op
}

func ctOperand(k expr.CtKey, dir uint32) operand {
	dirName := "original"
	if dir != ctDirOriginal {
		dirName = "reply"
	}
	switch k {
	case expr.CtKeySTATE:
		return operand{what: "ct state", kind: kindCtState}
	case expr.CtKeySTATUS:
		return operand{what: "ct status", kind: kindCtStatus}
	case expr.CtKeyMARK:
		return operand{what: "ct mark"}
	case expr.CtKeyPROTODST:
		return operand{what: "ct " + dirName + " proto-dst", kind: kindPort}
	case expr.CtKeyPROTOSRC:
		return operand{what: "ct " + dirName + " proto-src", kind: kindPort}
	case expr.CtKeySRC:
		return operand{what: "ct " + dirName + " saddr"}
	case expr.CtKeyDST:
		return operand{what: "ct " + dirName + " daddr"}
	}
	return operand{what: "ct key " + strconv.Itoa(int(k))}
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

var cmpOps = map[expr.CmpOp]string{
	expr.CmpOpEq:  "",
	expr.CmpOpNeq: "!= ",
	expr.CmpOpLt:  "< ",
	expr.CmpOpLte: "<= ",
	expr.CmpOpGt:  "> ",
	expr.CmpOpGte: ">= ",
}

// compare renders "<field> <op> <value>", nft's way.
func (op operand) compare(cmpOp expr.CmpOp, data []byte) string {
	sym, ok := cmpOps[cmpOp]
	if !ok {
		sym = fmt.Sprintf("cmp%d ", cmpOp)
	}
	if op.mask != nil {
		// "ct state established,related" is "state & mask != 0"
		if cmpOp == expr.CmpOpNeq && isZero(data) && len(op.mask) == 4 {
			if names, ok := bitNames(op.kind, binaryutil.NativeEndian.Uint32(op.mask)); ok {
				return op.what + " " + names
			}
		}
		return fmt.Sprintf("%s & 0x%x %s0x%x", op.what, op.mask, sym, data)
	}
	return op.what + " " + sym + op.format(data)
}

// value renders a register used as a statement's argument.
func (op operand) value() string {
	if op.imm == nil {
		return op.what
	}
	if len(op.imm) == 4 || len(op.imm) == 16 {
		a, _ := netip.AddrFromSlice(op.imm)
		return a.String()
	}
	return "0x" + hex.EncodeToString(op.imm)
}

func (op operand) portValue() string {
	if len(op.imm) == 2 {
		return strconv.Itoa(int(binary.BigEndian.Uint16(op.imm)))
	}
	return op.value()
}

func (op operand) format(data []byte) string {
	switch op.kind {
	case kindIfname:
		if i := strings.IndexByte(string(data), 0); i >= 0 {
			if isZero(data[i:]) && len(data) == unix.IFNAMSIZ {
				return strconv.Quote(string(data[:i]))
			}
		} else {
			return strconv.Quote(string(data) + "*")
		}
	case kindNfproto:
		if len(data) == 1 {
			switch data[0] {
			case unix.NFPROTO_IPV4:
				return "ipv4"
			case unix.NFPROTO_IPV6:
				return "ipv6"
			}
			return strconv.Itoa(int(data[0]))
		}
	case kindL4proto:
		if len(data) == 1 {
			switch data[0] {
			case unix.IPPROTO_TCP:
				return "tcp"
			case unix.IPPROTO_UDP:
				return "udp"
			case unix.IPPROTO_ICMP:
				return "icmp"
			case unix.IPPROTO_ICMPV6:
				return "ipv6-icmp"
			}
			return strconv.Itoa(int(data[0]))
		}
	case kindIPv4:
		if len(data) == 4 {
			return netip.AddrFrom4([4]byte(data)).String()
		}
	case kindIPv6:
		if len(data) == 16 {
			return netip.AddrFrom16([16]byte(data)).String()
		}
	case kindICMPv6Type:
		if len(data) == 1 {
			switch data[0] {
			case icmpv6NeighborSolicit:
				return "nd-neighbor-solicit"
			case icmpv6NeighborAdvert:
				return "nd-neighbor-advert"
			}
			return strconv.Itoa(int(data[0]))
		}
	case kindPort:
		if len(data) == 2 {
			return strconv.Itoa(int(binary.BigEndian.Uint16(data)))
		}
	case kindMark:
		if len(data) == 4 {
			return fmt.Sprintf("%#x", binary.NativeEndian.Uint32(data)) // host byte order
		}
	}
	return "0x" + hex.EncodeToString(data)
}

// bitNames names the conntrack state or status bits of mask, nft's way.
func bitNames(kind valueKind, mask uint32) (string, bool) {
	var table []struct {
		bit  uint32
		name string
	}
	switch kind {
	case kindCtState:
		table = []struct {
			bit  uint32
			name string
		}{{ctStateInvalid, "invalid"}, {ctStateEstablished, "established"}, {ctStateRelated, "related"},
			{expr.CtStateBitNEW, "new"}, {expr.CtStateBitUNTRACKED, "untracked"}}
	case kindCtStatus:
		table = []struct {
			bit  uint32
			name string
		}{{1 << 0, "expected"}, {1 << 1, "seen-reply"}, {1 << 2, "assured"}, {1 << 3, "confirmed"},
			{1 << 4, "snat"}, {ctStatusDNAT, "dnat"}, {1 << 9, "dying"}}
	default:
		return "", false
	}
	var names []string
	for _, t := range table {
		if mask&t.bit != 0 {
			names = append(names, t.name)
			mask &^= t.bit
		}
	}
	if mask != 0 || len(names) == 0 {
		return "", false
	}
	return strings.Join(names, ","), true
}
