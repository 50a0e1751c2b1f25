package netpol

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Tables, chains, sets and rules are read from netlink here rather than
// through the library, which (v0.3.0) drops the UserData of tables, chains
// and sets, where their markers are, fails a whole rule dump on the
// one-byte conntrack direction the kernel sends for "ct original
// proto-dst", and silently leaves out expressions it does not know, so a
// hand-edited rule could read as ours.

// dumper is a netlink connection into one namespace for nftables dumps.
type dumper struct {
	conn *netlink.Conn
}

func newDumper(nsFD int) (*dumper, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFD})
	if err != nil {
		return nil, err
	}
	return &dumper{conn: conn}, nil
}

func (d *dumper) close() { d.conn.Close() }

// answer is one message of a dump: the family from its header, and its
// attributes.
type answer struct {
	family nftables.TableFamily
	*netlink.AttributeDecoder
}

// dump sends one nftables dump request and returns the answers.
func (d *dumper) dump(msgType int, family nftables.TableFamily, attrs []netlink.Attribute) ([]answer, error) {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return nil, err
	}
	msgs, err := d.conn.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType),
			Flags: netlink.Request | netlink.Dump,
		},
		// struct nfgenmsg: family, version, resource id
		Data: append([]byte{byte(family), unix.NFNETLINK_V0, 0, 0}, data...),
	})
	if err != nil {
		return nil, err
	}
	var out []answer
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, err
		}
		ad.ByteOrder = binary.BigEndian
		out = append(out, answer{family: nftables.TableFamily(m.Data[0]), AttributeDecoder: ad})
	}
	return out, nil
}

// dumpedTable is a table as listed: enough to name it, and its marker.
type dumpedTable struct {
	family  nftables.TableFamily
	name    string
	flags   uint32
	comment string
}

// tables lists every table of the namespace, of every family.
func (d *dumper) tables() ([]dumpedTable, error) {
	ads, err := d.dump(unix.NFT_MSG_GETTABLE, nftables.TableFamilyUnspecified, nil)
	if err != nil {
		return nil, err
	}
	var out []dumpedTable
	for _, ad := range ads {
		t := dumpedTable{family: ad.family}
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_TABLE_NAME:
				t.name = ad.String()
			case unix.NFTA_TABLE_FLAGS:
				t.flags = ad.Uint32()
			case nftaTableUserdata:
				t.comment, _ = udataString(ad.Bytes(), userdata.TypeComment)
			}
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// chains lists the chains of table family/name in order, without rules.
func (d *dumper) chains(family nftables.TableFamily, table string) ([]*Chain, error) {
	ads, err := d.dump(unix.NFT_MSG_GETCHAIN, family, []netlink.Attribute{strAttr(unix.NFTA_CHAIN_TABLE, table)})
	if err != nil {
		return nil, err
	}
	var out []*Chain
	for _, ad := range ads {
		c := &Chain{regular: true}
		var inTable string
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_CHAIN_TABLE:
				inTable = ad.String()
			case unix.NFTA_CHAIN_NAME:
				c.Name = ad.String()
			case unix.NFTA_CHAIN_TYPE:
				c.Type = nftables.ChainType(ad.String())
			case unix.NFTA_CHAIN_POLICY:
				c.Policy = nftables.ChainPolicy(ad.Uint32())
			case nftaChainUserdata:
				c.Comment, _ = udataString(ad.Bytes(), userdata.TypeComment)
			case unix.NFTA_CHAIN_HOOK:
				c.regular = false
				ad.Nested(func(nad *netlink.AttributeDecoder) error {
					for nad.Next() {
						switch nad.Type() {
						case unix.NFTA_HOOK_HOOKNUM:
							c.Hook = nftables.ChainHook(nad.Uint32())
						case unix.NFTA_HOOK_PRIORITY:
							c.Priority = nftables.ChainPriority(int32(nad.Uint32()))
						case unix.NFTA_HOOK_DEV:
							c.Device = nad.String()
						}
					}
					return nil
				})
			}
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		if inTable == table && ad.family == family {
			out = append(out, c)
		}
	}
	return out, nil
}

// sets lists the sets of table t with their comments.
func (d *dumper) sets(t *nftables.Table) ([]*Set, error) {
	ads, err := d.dump(unix.NFT_MSG_GETSET, t.Family, []netlink.Attribute{{Type: unix.NFTA_SET_TABLE, Data: []byte(t.Name + "\x00")}})
	if err != nil {
		return nil, err
	}
	var sets []*Set
	for _, ad := range ads {
		var s Set
		var keyType, keyLen uint32
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_SET_NAME:
				s.Name = ad.String()
			case unix.NFTA_SET_FLAGS:
				s.Flags = ad.Uint32()
			case unix.NFTA_SET_KEY_TYPE:
				keyType = ad.Uint32()
			case unix.NFTA_SET_KEY_LEN:
				keyLen = ad.Uint32()
			case unix.NFTA_SET_USERDATA:
				if c, ok := udataString(ad.Bytes(), udataSetComment); ok {
					s.Comment = c
				}
			}
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		s.KeyType = keyDatatype(keyType, keyLen)
		sets = append(sets, &s)
	}
	return sets, nil
}

// udataSetComment is NFTNL_UDATA_SET_COMMENT.
const udataSetComment = 7

func keyDatatype(magic, length uint32) nftables.SetDatatype {
	for _, ip := range []nftables.SetDatatype{nftables.TypeIPAddr, nftables.TypeIP6Addr} {
		if magic == ip.GetNFTMagic() && length == ip.Bytes {
			return ip
		}
	}
	dt := nftables.SetDatatype{Name: fmt.Sprintf("type-%d-len-%d", magic, length), Bytes: length}
	dt.SetNFTMagic(magic)
	return dt
}

// rules lists the rules of a chain of table t in order.
func (d *dumper) rules(t *nftables.Table, chain string) ([]*Rule, error) {
	ads, err := d.dump(unix.NFT_MSG_GETRULE, t.Family, []netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(t.Name + "\x00")},
		{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain + "\x00")},
	})
	if err != nil {
		return nil, err
	}
	var rules []*Rule
	for _, ad := range ads {
		r := &Rule{}
		var ud []byte
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_RULE_HANDLE:
				r.Handle = ad.Uint64()
			case unix.NFTA_RULE_USERDATA:
				ud = ad.Bytes()
			case unix.NFTA_RULE_EXPRESSIONS:
				ad.Nested(func(nad *netlink.AttributeDecoder) error {
					for i := 0; nad.Next(); i++ {
						e, name, err := decodeExpr(byte(t.Family), nad.Bytes())
						if err != nil {
							return fmt.Errorf("expression %d (%s): %w", i, name, err)
						}
						if e == nil {
							r.undecoded = append(r.undecoded, fmt.Sprintf("expression %d %q", i, name))
							continue
						}
						r.Exprs = append(r.Exprs, e)
					}
					return nil
				})
			}
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
		var only bool
		if r.Comment, only = ruleComment(ud); !only {
			r.UserData = ud
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// decodeExpr decodes one NFTA_LIST_ELEM of a rule's expressions. An
// expression it has no type for comes back nil with its name.
func decodeExpr(fam byte, b []byte) (expr.Any, string, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, "", err
	}
	ad.ByteOrder = binary.BigEndian
	var name string
	var data []byte
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_EXPR_NAME:
			name = ad.String()
		case unix.NFTA_EXPR_DATA:
			data = ad.Bytes()
		}
	}
	if err := ad.Err(); err != nil {
		return nil, name, err
	}
	if name == "ct" {
		e, err := decodeCt(data)
		return e, name, err
	}
	e := newExpr(name)
	if e == nil {
		return nil, name, nil
	}
	if _, ok := e.(*expr.Notrack); ok {
		return e, name, nil // no data
	}
	if err := expr.Unmarshal(fam, data, e); err != nil {
		return nil, name, err
	}
	// A verdict is an immediate into the verdict register.
	if imm, ok := e.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
		v := &expr.Verdict{}
		if err := expr.Unmarshal(fam, data, v); err != nil {
			return nil, name, err
		}
		e = v
	}
	return e, name, nil
}

// decodeCt decodes a conntrack expression; the direction is one byte.
func decodeCt(data []byte) (expr.Any, error) {
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return nil, err
	}
	ad.ByteOrder = binary.BigEndian
	e := &expr.Ct{}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_CT_KEY:
			e.Key = expr.CtKey(ad.Uint32())
		case unix.NFTA_CT_DREG:
			e.Register = ad.Uint32()
		case unix.NFTA_CT_SREG:
			e.Register, e.SourceRegister = ad.Uint32(), true
		case unix.NFTA_CT_DIRECTION:
			e.Direction = uint32(ad.Uint8())
		}
	}
	return e, ad.Err()
}

// newExpr is the library's expression type for a kernel expression name.
func newExpr(name string) expr.Any {
	switch name {
	case "meta":
		return &expr.Meta{}
	case "cmp":
		return &expr.Cmp{}
	case "payload":
		return &expr.Payload{}
	case "lookup":
		return &expr.Lookup{}
	case "immediate":
		return &expr.Immediate{}
	case "bitwise":
		return &expr.Bitwise{}
	case "byteorder":
		return &expr.Byteorder{}
	case "counter":
		return &expr.Counter{}
	case "objref":
		return &expr.Objref{}
	case "nat":
		return &expr.NAT{}
	case "redir":
		return &expr.Redir{}
	case "masq":
		return &expr.Masq{}
	case "range":
		return &expr.Range{}
	case "limit":
		return &expr.Limit{}
	case "quota":
		return &expr.Quota{}
	case "log":
		return &expr.Log{}
	case "reject":
		return &expr.Reject{}
	case "dynset":
		return &expr.Dynset{}
	case "exthdr":
		return &expr.Exthdr{}
	case "fib":
		return &expr.Fib{}
	case "numgen":
		return &expr.Numgen{}
	case "hash":
		return &expr.Hash{}
	case "connlimit":
		return &expr.Connlimit{}
	case "queue":
		return &expr.Queue{}
	case "notrack":
		return &expr.Notrack{}
	case "rt":
		return &expr.Rt{}
	case "socket":
		return &expr.Socket{}
	case "tproxy":
		return &expr.TProxy{}
	case "dup":
		return &expr.Dup{}
	case "flow_offload":
		return &expr.FlowOffload{}
	case "match":
		return &expr.Match{}
	case "target":
		return &expr.Target{}
	}
	return nil
}
