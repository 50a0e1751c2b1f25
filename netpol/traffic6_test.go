package netpol

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

func addr6(a string) string { return "[" + a + "]:" + echoPort }

// IPv6: a guest without an IPv6 address reaches nothing over IPv6; with
// one, the IPv4 rules' twins hold: public egress is masqueraded to the
// node's IPv6 address and never reaches the node (nor an address of it
// the table does not name), management, denied or not-allowed ranges, or
// leaves from a source not the guest's; none lets no IPv6 out; IPv6 DNS
// goes nowhere; the node's table keeps management out by itself.
func TestTrafficEgress6(t *testing.T) {
	n := newLineNet(t)
	n.replace(t, n.spec)
	n.mustReach(t, worldPublic+":"+echoPort)
	n.mustBeDropped(t, "", addr6(worldPublic6))

	none := n.spec6
	none.Egress = EgressNone
	n.replace(t, none)
	// The guest may still be resolving its gateway, which the table before
	// did not let it: the connect leaves it late, then is refused and
	// counted.
	testenv.WaitFor(t, 5*time.Second, "the IPv6 connect refused", func() (bool, string) {
		c, err := n.dial(addr6(worldPublic6), 2*time.Second)
		if err == nil {
			c.c.Close()
			return false, fmt.Sprintf("guest connected to %s (seen as %s)", worldPublic6, c.seenAs)
		}
		return errors.Is(err, syscall.ECONNREFUSED), err.Error()
	})
	n.mustResolve(t)
	if denied(t, n.instance) == 0 {
		t.Error("the refused IPv6 connect was not counted as denied")
	}

	n.replace(t, n.spec6)
	c := n.mustReach(t, addr6(worldPublic6))
	if c.seenAs != nodeUplink6 {
		t.Errorf("world saw the guest as %s, want the node's uplink %s (masquerade)", c.seenAs, nodeUplink6)
	}
	n.mustReach(t, worldPublic+":"+echoPort)
	before := denied(t, n.instance)
	n.mustNotReach(t, addr6(worldManagement6), addr6(worldDenied6), addr6(worldNotAllowed6), addr6(nodeUplink6))
	n.mustBeDropped(t, "", addr6(nodeLater6))
	n.mustBeDropped(t, "fd6b:6b00:240::99", addr6(worldPublic6))
	// nodeLater6 is dropped by the node's table, not counted here
	if d := denied(t, n.instance) - before; d < 5 {
		t.Errorf("denied counter counted %d of five dropped IPv6 connects", d)
	}
	n.mustNotResolve6(t)

	// The node's table keeps management ranges out by itself.
	open := n.spec6
	open.Management, open.Allow = nil, nil
	n.replace(t, open)
	n.mustBeDropped(t, "", addr6(worldManagement6))
	n.mustReach(t, addr6(worldNotAllowed6))
}

// mustNotResolve6 sends a DNS-port datagram to a public IPv6 address that
// answers one, and expects no answer and the drop counted: DNS goes to
// the deployment resolver over IPv4 only.
func (n *lineNet) mustNotResolve6(t *testing.T) {
	t.Helper()
	var uc net.Conn
	if err := inNetns(n.guest, func() (err error) {
		uc, err = net.Dial("udp6", "["+worldPublic6+"]:53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	before := denied(t, n.instance)
	uc.SetDeadline(time.Now().Add(deniedDialTimeout))
	uc.Write([]byte("query"))
	if k, err := uc.Read(make([]byte, 64)); err == nil {
		t.Fatalf("IPv6 DNS got an answer of %d bytes", k)
	}
	if denied(t, n.instance) <= before {
		t.Error("IPv6 DNS was not counted as denied")
	}
}

// With a proxy, guest IPv6 TCP is reset at once (so a client falls back
// to IPv4 without waiting) and counted; IPv4 TCP leaves as before.
func TestTrafficProxy6(t *testing.T) {
	n := newLineNet(t)
	proxy := n.spec6
	proxy.Egress, proxy.Allow = EgressProxy, nil
	n.replace(t, proxy)
	n.mustReach(t, worldNotAllowed+":"+echoPort)
	before := denied(t, n.instance)
	var took time.Duration
	testenv.WaitFor(t, 10*time.Second, "an IPv6 connect refused at once", func() (bool, string) {
		t0 := time.Now()
		c, err := n.dial(addr6(worldPublic6), refusedDialTimeout)
		took = time.Since(t0)
		if err == nil {
			c.c.Close()
			return false, fmt.Sprintf("guest connected to %s (seen as %s)", worldPublic6, c.seenAs)
		}
		return errors.Is(err, syscall.ECONNREFUSED), err.Error()
	})
	// A drop would wait out the dial's timeout; well short of it is "at
	// once" even on a busy machine.
	if took > refusedDialTimeout/2 {
		t.Errorf("the refused IPv6 connect took %v", took)
	}
	if denied(t, n.instance) <= before {
		t.Error("the refused IPv6 connect was not counted")
	}
	n.mustNotReach(t, addr6(worldManagement6))
}

// Domain rules over IPv6: Learn puts each address into the set of its
// family in one call, only learned IPv6 addresses of allowed names pass
// besides Allow, and a table of a guest without IPv6 refuses IPv6
// addresses.
func TestTrafficLearnedNames6(t *testing.T) {
	n := newLineNet(t)
	ctx := context.Background()
	spec := n.spec6
	spec.Allow = pfx(worldPublic6 + "/128")
	spec.Deny = nil
	spec.AllowNames, spec.DenyNames = true, true
	n.replace(t, spec)
	n.mustReach(t, addr6(worldPublic6))
	n.mustNotReach(t, addr6(worldNotAllowed6), worldPublic+":"+echoPort)

	both := []netip.Addr{netip.MustParseAddr(worldNotAllowed6), netip.MustParseAddr(worldPublic)}
	if err := Learn(ctx, n.instance, SetAllowNames, both, time.Minute); err != nil {
		t.Fatal(err)
	}
	n.mustReach(t, addr6(worldNotAllowed6))
	n.mustReach(t, worldPublic+":"+echoPort)
	if err := Learn(ctx, n.instance, SetDenyNames6, []netip.Addr{netip.MustParseAddr(worldPublic6)}, 0); err != nil {
		t.Fatal(err)
	}
	n.mustNotReach(t, addr6(worldPublic6))
	got := readOurs(t, n.instance)
	if s := got.set(SetAllowNames6); s == nil || len(s.Ranges) != 1 || s.Ranges[0].String() != worldNotAllowed6 {
		t.Errorf("learned IPv6 allow set read back: %+v", s)
	}
	if s := got.set(SetAllowNames); s == nil || len(s.Ranges) != 1 || s.Ranges[0].String() != worldPublic {
		t.Errorf("learned IPv4 allow set read back: %+v", s)
	}
	if f, err := Inspect(n.instance, spec); err != nil || f.Verdict != VerdictMatch {
		t.Errorf("Inspect with learned IPv6 elements: %+v, %v; want match", f, err)
	}

	noV6 := n.spec
	noV6.AllowNames = true
	n.replace(t, noV6)
	if err := Learn(ctx, n.instance, SetAllowNames, both, time.Minute); err == nil {
		t.Error("Learn of an IPv6 address into the table of a guest without IPv6 succeeded")
	}
	if got := readOurs(t, n.instance).set(SetAllowNames); got == nil || len(got.Ranges) != 0 {
		t.Errorf("a refused Learn changed the IPv4 set: %+v", got)
	}
}
