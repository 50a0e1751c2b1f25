package netpol

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A txn is one nftables transaction: messages the kernel applies together
// or not at all. Batches are framed here rather than by the library's
// Conn.Flush, which asks an acknowledgement of every message and reads
// them one by one (two system calls each: a third of a replace's time,
// measured), has the kernel echo every rule back, and cannot write the
// comments of tables and chains. The library still encodes every
// expression.
type txn struct {
	msgs []netlink.Message
	// what names the object of each message, for errors.
	what []string
}

// Attributes newer than x/sys knows (uapi nf_tables.h): the comments of
// tables (Linux 5.13) and chains (5.10).
const (
	nftaTableUserdata = 6
	nftaChainUserdata = 12
)

// defaultTimeout bounds a transaction whose context has no deadline: the
// kernel answers a batch within the send, so waiting long means trouble.
const defaultTimeout = 10 * time.Second

// closing counts the sockets still closing behind a commit (see commit);
// Settle waits for them.
var closing sync.WaitGroup

// Settle returns once the netlink sockets of earlier commits are closed.
// Each closes behind its commit's return and ends by itself within an RCU
// grace period; whoever must know that none is left (a benchmark timing
// one write alone, a node runtime shutting down) waits here.
func Settle() { closing.Wait() }

func (x *txn) add(msgType int, family nftables.TableFamily, flags netlink.HeaderFlags, what string, attrs ...netlink.Attribute) error {
	size := 4
	for _, a := range attrs {
		size += 4 + (len(a.Data)+3)&^3
	}
	b := attrBuf{b: make([]byte, 0, size)}
	b.b = append(b.b, nfgenmsg(family, 0)...)
	for _, a := range attrs {
		b.attr(a.Type, a.Data)
	}
	if b.err != nil {
		return fmt.Errorf("%s: %w", what, b.err)
	}
	x.msgs = append(x.msgs, netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType), Flags: netlink.Request | flags},
		Data:   b.b,
	})
	x.what = append(x.what, what)
	return nil
}

// nfgenmsg is struct nfgenmsg: family, version, resource id (big endian).
func nfgenmsg(family nftables.TableFamily, resID uint16) []byte {
	return binary.BigEndian.AppendUint16([]byte{byte(family), unix.NFNETLINK_V0}, resID)
}

func strAttr(typ uint16, s string) netlink.Attribute {
	return netlink.Attribute{Type: typ, Data: []byte(s + "\x00")}
}

func u32Attr(typ uint16, v uint32) netlink.Attribute {
	return netlink.Attribute{Type: typ, Data: binary.BigEndian.AppendUint32(nil, v)}
}

// attrBuf encodes netlink attributes into one buffer, nested ones by
// patching their length once their content is written.
type attrBuf struct {
	b       []byte
	scratch [4]byte
	err     error
}

// attr appends an attribute: its header (length, type; host byte order),
// its data, padding to 4 bytes.
func (a *attrBuf) attr(typ uint16, data []byte) {
	n := 4 + len(data)
	if n > math.MaxUint16 && a.err == nil {
		a.err = fmt.Errorf("attribute of %d bytes: at most %d", n, math.MaxUint16)
	}
	a.b = binary.NativeEndian.AppendUint16(a.b, uint16(n))
	a.b = binary.NativeEndian.AppendUint16(a.b, typ)
	a.b = append(a.b, data...)
	for ; n%4 != 0; n++ {
		a.b = append(a.b, 0)
	}
}

// begin opens a nested attribute; end closes it.
func (a *attrBuf) begin(typ uint16) int {
	at := len(a.b)
	a.b = binary.NativeEndian.AppendUint16(a.b, 0)
	a.b = binary.NativeEndian.AppendUint16(a.b, typ|unix.NLA_F_NESTED)
	return at
}

func (a *attrBuf) end(at int) {
	n := len(a.b) - at
	if n > math.MaxUint16 && a.err == nil {
		a.err = fmt.Errorf("nested attribute of %d bytes: at most %d", n, math.MaxUint16)
	}
	binary.NativeEndian.PutUint16(a.b[at:], uint16(n))
}

func nested(typ uint16, attrs ...netlink.Attribute) (netlink.Attribute, error) {
	data, err := netlink.MarshalAttributes(attrs)
	return netlink.Attribute{Type: typ | unix.NLA_F_NESTED, Data: data}, err
}

// commentUserData encodes a comment the way nft does for tables, chains
// and rules, so `nft list ruleset` shows our markers.
func commentUserData(comment string) []byte {
	return userdata.AppendString(nil, userdata.TypeComment, comment)
}

// dropTable queues the deletion of a table that may not exist: adding it
// first (no change if it exists) makes the delete valid either way.
func (x *txn) dropTable(family nftables.TableFamily, name string) error {
	if err := x.add(unix.NFT_MSG_NEWTABLE, family, netlink.Create, "table "+familyName(family)+" "+name,
		strAttr(unix.NFTA_TABLE_NAME, name), u32Attr(unix.NFTA_TABLE_FLAGS, 0)); err != nil {
		return err
	}
	return x.delTable(family, name)
}

func (x *txn) delTable(family nftables.TableFamily, name string) error {
	return x.add(unix.NFT_MSG_DELTABLE, family, 0, "delete table "+familyName(family)+" "+name,
		strAttr(unix.NFTA_TABLE_NAME, name))
}

// addTable queues the creation of t and everything in it.
func (x *txn) addTable(t *Table) error {
	what := "table " + familyName(t.Family) + " " + t.Name
	attrs := []netlink.Attribute{strAttr(unix.NFTA_TABLE_NAME, t.Name), u32Attr(unix.NFTA_TABLE_FLAGS, 0)}
	if t.Comment != "" {
		attrs = append(attrs, netlink.Attribute{Type: nftaTableUserdata, Data: commentUserData(t.Comment)})
	}
	if err := x.add(unix.NFT_MSG_NEWTABLE, t.Family, netlink.Create, what, attrs...); err != nil {
		return err
	}
	for _, name := range t.Counters {
		data, err := expr.MarshalExprData(byte(t.Family), &expr.Counter{})
		if err != nil {
			return fmt.Errorf("counter %s: %w", name, err)
		}
		if err := x.add(unix.NFT_MSG_NEWOBJ, t.Family, netlink.Create, "counter "+name,
			strAttr(unix.NFTA_OBJ_TABLE, t.Name), strAttr(unix.NFTA_OBJ_NAME, name),
			u32Attr(unix.NFTA_OBJ_TYPE, uint32(nftables.ObjTypeCounter)),
			netlink.Attribute{Type: unix.NFTA_OBJ_DATA | unix.NLA_F_NESTED, Data: data}); err != nil {
			return err
		}
	}
	for i, s := range t.Sets {
		// Build numbers its sets the same way for its lookups: within a
		// batch the kernel finds a new set by id.
		if err := x.addSet(t, s, uint32(i+1)); err != nil {
			return err
		}
	}
	// Every chain before any rule: a rule may jump to a chain listed later.
	for _, c := range t.Chains {
		if err := x.addChain(t, c); err != nil {
			return err
		}
	}
	for _, c := range t.Chains {
		for i, r := range c.Rules {
			if err := x.addRule(t, c, i, r); err != nil {
				return err
			}
		}
	}
	return nil
}

func (x *txn) addSet(t *Table, s *Set, id uint32) error {
	what := "set " + s.Name
	if s.Flags != unix.NFT_SET_INTERVAL && s.Flags != unix.NFT_SET_TIMEOUT && s.Flags != 0 {
		return fmt.Errorf("%s: flags %s: only interval sets and learned (timeout) sets are written", what, setFlags(s.Flags))
	}
	if s.learned() && len(s.Ranges) > 0 {
		return fmt.Errorf("%s: a learned set is written empty (Learn fills it)", what)
	}
	// As nft writes it: the key's byte order (big endian), then the comment.
	ud := userdata.AppendUint32(nil, userdata.NFTNL_UDATA_SET_KEYBYTEORDER, 2)
	if s.Comment != "" {
		ud = userdata.AppendString(ud, udataSetComment, s.Comment)
	}
	if err := x.add(unix.NFT_MSG_NEWSET, t.Family, netlink.Create, what,
		strAttr(unix.NFTA_SET_TABLE, t.Name), strAttr(unix.NFTA_SET_NAME, s.Name),
		u32Attr(unix.NFTA_SET_FLAGS, s.Flags),
		u32Attr(unix.NFTA_SET_KEY_TYPE, s.KeyType.GetNFTMagic()), u32Attr(unix.NFTA_SET_KEY_LEN, s.KeyType.Bytes),
		u32Attr(unix.NFTA_SET_ID, id),
		netlink.Attribute{Type: unix.NFTA_SET_USERDATA, Data: ud}); err != nil {
		return err
	}
	edges := intervalEdges(s.Ranges)
	if len(edges) == 0 {
		return nil
	}
	// Encoded here in one buffer: through the library's attribute
	// values, a set of a few hundred ranges was a fifth of a replace's
	// allocations.
	var b attrBuf
	for _, e := range edges {
		elem := b.begin(unix.NFTA_LIST_ELEM)
		key := b.begin(unix.NFTA_SET_ELEM_KEY)
		if e.at.Is4() {
			a := e.at.As4()
			b.attr(unix.NFTA_DATA_VALUE, a[:])
		} else {
			a := e.at.As16()
			b.attr(unix.NFTA_DATA_VALUE, a[:])
		}
		b.end(key)
		if e.end {
			b.attr(unix.NFTA_SET_ELEM_FLAGS, binary.BigEndian.AppendUint32(b.scratch[:0], unix.NFT_SET_ELEM_INTERVAL_END))
		}
		b.end(elem)
	}
	if b.err != nil {
		return fmt.Errorf("%s: %w", what, b.err)
	}
	elements := netlink.Attribute{Type: unix.NFTA_SET_ELEM_LIST_ELEMENTS | unix.NLA_F_NESTED, Data: b.b}
	return x.add(unix.NFT_MSG_NEWSETELEM, t.Family, netlink.Create, what+" elements",
		strAttr(unix.NFTA_SET_ELEM_LIST_TABLE, t.Name), strAttr(unix.NFTA_SET_ELEM_LIST_SET, s.Name),
		u32Attr(unix.NFTA_SET_ELEM_LIST_SET_ID, id), elements)
}

func (x *txn) addChain(t *Table, c *Chain) error {
	attrs := []netlink.Attribute{strAttr(unix.NFTA_CHAIN_TABLE, t.Name), strAttr(unix.NFTA_CHAIN_NAME, c.Name)}
	if !c.regular {
		hook := []netlink.Attribute{
			u32Attr(unix.NFTA_HOOK_HOOKNUM, uint32(c.Hook)),
			u32Attr(unix.NFTA_HOOK_PRIORITY, uint32(c.Priority)),
		}
		if c.Device != "" {
			hook = append(hook, strAttr(unix.NFTA_HOOK_DEV, c.Device))
		}
		h, err := nested(unix.NFTA_CHAIN_HOOK, hook...)
		if err != nil {
			return fmt.Errorf("chain %s: %w", c.Name, err)
		}
		attrs = append(attrs, h, u32Attr(unix.NFTA_CHAIN_POLICY, uint32(c.Policy)), strAttr(unix.NFTA_CHAIN_TYPE, string(c.Type)))
	}
	if c.Comment != "" {
		attrs = append(attrs, netlink.Attribute{Type: nftaChainUserdata, Data: commentUserData(c.Comment)})
	}
	return x.add(unix.NFT_MSG_NEWCHAIN, t.Family, netlink.Create, "chain "+c.Name, attrs...)
}

func (x *txn) addRule(t *Table, c *Chain, i int, r *Rule) error {
	what := fmt.Sprintf("chain %s rule %d", c.Name, i)
	if _, name, ok := parseMarker(r.Comment); ok {
		what = "rule " + name
	}
	list := make([]netlink.Attribute, 0, len(r.Exprs))
	for _, e := range r.Exprs {
		data, err := expr.Marshal(byte(t.Family), e)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		list = append(list, netlink.Attribute{Type: unix.NFTA_LIST_ELEM | unix.NLA_F_NESTED, Data: data})
	}
	exprs, err := nested(unix.NFTA_RULE_EXPRESSIONS, list...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	attrs := []netlink.Attribute{strAttr(unix.NFTA_RULE_TABLE, t.Name), strAttr(unix.NFTA_RULE_CHAIN, c.Name), exprs}
	ud := r.UserData
	if ud == nil && r.Comment != "" {
		ud = commentUserData(r.Comment)
	}
	if ud != nil {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_RULE_USERDATA, Data: ud})
	}
	return x.add(unix.NFT_MSG_NEWRULE, t.Family, netlink.Create|netlink.Append, what, attrs...)
}

// commit sends the transaction to the namespace. Only the last message
// asks for an acknowledgement: the kernel reports every failing message
// anyway, handles the whole batch inside the send, and acknowledges the
// last message after all errors, so that answer ends the reading.
func (x *txn) commit(ctx context.Context, nsFD int) error {
	if len(x.msgs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFD})
	if err != nil {
		return err
	}
	// Closing a netfilter socket waits until the kernel has freed what the
	// last batch deleted, an RCU grace period (12 ms measured on a loaded
	// 2-core host, where the batch itself takes 0.1 ms). The transaction is
	// in force once acknowledged, so the close runs behind the return;
	// until it is done the kernel holds the namespace's nftables lock,
	// which delays only another write to the same namespace.
	closing.Add(1)
	defer func() {
		go func() {
			defer closing.Done()
			conn.Close()
		}()
	}()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultTimeout)
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	// Errors carry only their message's header, not the whole message back.
	if err := conn.SetOption(netlink.CapAcknowledge, true); err != nil {
		return err
	}

	msgs := make([]netlink.Message, 0, len(x.msgs)+2)
	msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_BEGIN, Flags: netlink.Request},
		Data: nfgenmsg(nftables.TableFamilyUnspecified, unix.NFNL_SUBSYS_NFTABLES)})
	msgs = append(msgs, x.msgs...)
	msgs[len(msgs)-1].Header.Flags |= netlink.Acknowledge
	msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_END, Flags: netlink.Request},
		Data: nfgenmsg(nftables.TableFamilyUnspecified, unix.NFNL_SUBSYS_NFTABLES)})
	sent, err := conn.SendMessages(msgs)
	if err != nil {
		return err
	}
	begin, last := sent[0].Header.Sequence, sent[len(sent)-2].Header.Sequence
	what := make(map[uint32]string, len(x.what))
	for i, w := range x.what {
		what[sent[i+1].Header.Sequence] = w
	}
	return readAcks(conn, begin, last, what)
}

// readAcks reads the kernel's answers to a batch until the last message's
// acknowledgement (or an error about the batch itself) and joins the
// errors, each naming its object. It reads the socket directly because the
// netlink package turns an error answer into an error without the sequence
// number that says which message failed.
// ackBufs are readAcks' receive buffers, one a replace otherwise.
var ackBufs = sync.Pool{New: func() any { b := make([]byte, 1<<16); return &b }}

func readAcks(conn *netlink.Conn, begin, last uint32, what map[uint32]string) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	bp := ackBufs.Get().(*[]byte)
	defer ackBufs.Put(bp)
	buf := *bp
	var errs []error
	for {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
			return rerr != unix.EAGAIN
		}); err != nil {
			return errors.Join(append(errs, fmt.Errorf("waiting for the kernel's answer: %w", err))...)
		}
		if rerr != nil {
			return errors.Join(append(errs, fmt.Errorf("receive: %w", rerr))...)
		}
		replies, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("receive: %w", err))...)
		}
		for _, m := range replies {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			seq := m.Header.Seq
			if code := int32(binaryutil.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				obj, ok := what[seq]
				if !ok {
					obj = "batch"
				}
				errs = append(errs, fmt.Errorf("%s: %w", obj, unix.Errno(-code)))
			}
			if seq == last || seq == begin {
				return errors.Join(errs...)
			}
		}
	}
}
