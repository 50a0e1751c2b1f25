package netpol

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// String renders t in nft's list syntax. The text is stable (no handles,
// no counter values) and is what golden files hold and what Inspect
// compares: a rule read back from the kernel and the rule Build made render
// the same exactly when they do the same.
func (t *Table) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", familyName(t.Family), t.Name)
	if t.Comment != "" {
		fmt.Fprintf(&b, "\tcomment %q\n", t.Comment)
	}
	if t.Flags != 0 {
		fmt.Fprintf(&b, "\tflags %s\n", tableFlags(t.Flags))
	}
	for _, c := range t.Counters {
		fmt.Fprintf(&b, "\tcounter %s {\n\t}\n", c)
	}
	for _, o := range t.Objects {
		fmt.Fprintf(&b, "\t%s %s {\n\t}\n", objTypeName(o.Type), o.Name)
	}
	// a blank line between blocks, as nft prints them
	sep := t.Comment != "" || len(t.Counters)+len(t.Objects) > 0
	for _, s := range t.Sets {
		if sep {
			b.WriteString("\n")
		}
		s.render(&b)
		sep = true
	}
	for _, c := range t.Chains {
		if sep {
			b.WriteString("\n")
		}
		c.render(&b)
		sep = true
	}
	b.WriteString("}\n")
	return b.String()
}

func (s *Set) render(b *strings.Builder) {
	fmt.Fprintf(b, "\tset %s {\n\t\ttype %s\n", s.Name, s.KeyType.Name)
	if s.Flags != 0 {
		fmt.Fprintf(b, "\t\tflags %s\n", setFlags(s.Flags))
	}
	if s.Comment != "" {
		fmt.Fprintf(b, "\t\tcomment %q\n", s.Comment)
	}
	if s.elemErr != "" {
		fmt.Fprintf(b, "\t\t# elements not decoded: %s\n", s.elemErr)
	}
	if len(s.Ranges) > 0 {
		b.WriteString("\t\telements = {\n")
		for _, r := range s.Ranges {
			fmt.Fprintf(b, "\t\t\t%s,\n", r)
		}
		b.WriteString("\t\t}\n")
	}
	b.WriteString("\t}\n")
}

func (c *Chain) render(b *strings.Builder) {
	fmt.Fprintf(b, "\tchain %s {\n", c.Name)
	if h := c.header(); h != "" {
		fmt.Fprintf(b, "\t\t%s\n", h)
	}
	if c.Comment != "" {
		fmt.Fprintf(b, "\t\tcomment %q\n", c.Comment)
	}
	for _, r := range c.Rules {
		fmt.Fprintf(b, "\t\t%s\n", r)
	}
	b.WriteString("\t}\n")
}

// header is the base chain's declaration line, empty for a regular chain.
func (c *Chain) header() string {
	if c.regular {
		return ""
	}
	dev := ""
	if c.Device != "" {
		dev = fmt.Sprintf(" device %q", c.Device)
	}
	return fmt.Sprintf("type %s hook %s%s priority %s; policy %s;",
		c.Type, hookName(c.Hook), dev, priorityName(c.Priority), policyName(c.Policy))
}

// String renders the rule's statements and its comment.
func (r *Rule) String() string {
	s := renderExprs(r.Exprs)
	for _, u := range r.undecoded {
		s += " [" + u + " not decoded]"
	}
	switch {
	case r.UserData != nil:
		s += " userdata 0x" + hex.EncodeToString(r.UserData)
	case r.Comment != "":
		s += " comment " + strconv.Quote(r.Comment)
	}
	return s
}

// inetIngress is NF_INET_INGRESS: the ingress hook of an inet table (the
// library's ChainHookIngress is the netdev family's number, 0, which an inet
// table reads as prerouting).
const inetIngress nftables.ChainHook = 5

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return "family" + strconv.Itoa(int(f))
}

// tableFlagOwner is NFT_TABLE_F_OWNER (a table that goes with the socket
// that made it), newer than x/sys knows.
const tableFlagOwner = 0x2

func tableFlags(f uint32) string {
	var names []string
	if f&unix.NFT_TABLE_F_DORMANT != 0 {
		names = append(names, "dormant")
		f &^= unix.NFT_TABLE_F_DORMANT
	}
	if f&tableFlagOwner != 0 {
		names = append(names, "owner")
		f &^= tableFlagOwner
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("0x%x", f))
	}
	return strings.Join(names, ",")
}

func setFlags(f uint32) string {
	var names []string
	for _, n := range []struct {
		bit  uint32
		name string
	}{{unix.NFT_SET_ANONYMOUS, "anonymous"}, {unix.NFT_SET_CONSTANT, "constant"}, {unix.NFT_SET_INTERVAL, "interval"},
		{unix.NFT_SET_MAP, "map"}, {unix.NFT_SET_TIMEOUT, "timeout"}, {unix.NFT_SET_EVAL, "dynamic"}, {unix.NFT_SET_OBJECT, "object"}} {
		if f&n.bit != 0 {
			names = append(names, n.name)
			f &^= n.bit
		}
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("0x%x", f))
	}
	return strings.Join(names, ",")
}

func objTypeName(t nftables.ObjType) string {
	switch t {
	case nftables.ObjTypeCounter:
		return "counter"
	case nftables.ObjTypeQuota:
		return "quota"
	case nftables.ObjTypeLimit:
		return "limit"
	case nftables.ObjTypeConnLimit:
		return "ct count"
	case nftables.ObjTypeCtHelper:
		return "ct helper"
	case nftables.ObjTypeSecMark:
		return "secmark"
	case nftables.ObjTypeSynProxy:
		return "synproxy"
	}
	return "object" + strconv.Itoa(int(t))
}

func hookName(h nftables.ChainHook) string {
	switch h {
	case unix.NF_INET_PRE_ROUTING:
		return "prerouting"
	case unix.NF_INET_LOCAL_IN:
		return "input"
	case unix.NF_INET_FORWARD:
		return "forward"
	case unix.NF_INET_LOCAL_OUT:
		return "output"
	case unix.NF_INET_POST_ROUTING:
		return "postrouting"
	case inetIngress:
		return "ingress"
	}
	return strconv.Itoa(int(h))
}

func priorityName(p nftables.ChainPriority) string {
	switch p {
	case *nftables.ChainPriorityRaw:
		return "raw"
	case *nftables.ChainPriorityMangle:
		return "mangle"
	case *nftables.ChainPriorityNATDest:
		return "dstnat"
	case *nftables.ChainPriorityFilter:
		return "filter"
	case *nftables.ChainPrioritySecurity:
		return "security"
	case *nftables.ChainPriorityNATSource:
		return "srcnat"
	}
	return strconv.Itoa(int(p))
}

func policyName(p nftables.ChainPolicy) string {
	switch p {
	case nftables.ChainPolicyAccept:
		return "accept"
	case nftables.ChainPolicyDrop:
		return "drop"
	}
	return strconv.Itoa(int(p))
}
