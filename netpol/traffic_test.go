package netpol

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

func TestTrafficEgress(t *testing.T) {
	n := newLineNet(t)
	addr := func(a string) string { return a + ":" + echoPort }

	none := n.spec
	none.Egress = EgressNone
	n.replace(t, none)
	// The namespace itself (the guest's gateway) refuses as well.
	n.mustNotReach(t, addr(worldPublic), addr("10.240.0.1"))
	// DNS works without egress, to a resolver in a management range
	n.mustResolve(t)
	if denied(t, n.instance) == 0 {
		t.Error("denied counter did not count the dropped connect")
	}

	n.replace(t, n.spec)
	c := n.mustReach(t, addr(worldPublic))
	if c.seenAs != nodeUplink {
		t.Errorf("world saw the guest as %s, want the node's uplink %s (masquerade)", c.seenAs, nodeUplink)
	}
	n.mustNotReach(t, addr(worldManagement), addr(worldDenied), addr(worldNotAllowed), addr(nodeUplink))
	n.mustResolve(t)
	if d := denied(t, n.instance); d < 4 {
		t.Errorf("denied counter = %d after four dropped connects", d)
	}

	// The node's table keeps management ranges out by itself.
	open := n.spec
	open.Management, open.Allow = nil, nil
	n.replace(t, open)
	n.mustBeDropped(t, "", addr(worldManagement))
	n.mustReach(t, addr(worldPublic))
}

// An established connection survives a Replace (conntrack is kept), and
// dies with Isolate.
func TestTrafficEstablishedSurvivesReplace(t *testing.T) {
	n := newLineNet(t)
	n.replace(t, n.spec)
	c := n.mustReach(t, worldPublic+":"+echoPort)
	for i := range 3 {
		n.replace(t, n.spec)
		if err := c.echo(fmt.Sprintf("after replace %d", i), 5*time.Second); err != nil {
			t.Fatalf("established connection after Replace %d: %v", i, err)
		}
	}
	if err := Isolate(t.Context(), n.instance); err != nil {
		t.Fatal(err)
	}
	if err := c.echo("after isolate", deniedDialTimeout); err == nil {
		t.Fatal("established connection still works after Isolate")
	}
}

// With a proxy, guest TCP leaves the namespace unchanged whatever its
// destination (the node TPROXYs it; egress tests cover that part), but
// never to a blocked range.
func TestTrafficProxy(t *testing.T) {
	n := newLineNet(t)
	proxy := n.spec
	proxy.Egress, proxy.Allow = EgressProxy, nil
	n.replace(t, proxy)
	n.mustReach(t, worldNotAllowed+":"+echoPort)
	n.mustNotReach(t, worldManagement+":"+echoPort)
	n.mustResolve(t)
	// What is not TCP or DNS goes nowhere, and is counted.
	var uc net.Conn
	if err := inNetns(n.guest, func() (err error) {
		uc, err = net.Dial("udp4", worldPublic+":9")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	before := denied(t, n.instance)
	uc.Write([]byte("x"))
	testenv.WaitFor(t, 5*time.Second, "a guest UDP datagram is counted as denied", func() (bool, string) {
		got := denied(t, n.instance)
		return got > before, fmt.Sprintf("%d denied, %d before", got, before)
	})
}

// Domain rules: only addresses the resolver learned for an allowed name
// pass (besides Allow), a learned denied address is dropped even inside
// Allow, and Inspect still calls the table the node's with learned
// elements in it.
func TestTrafficLearnedNames(t *testing.T) {
	n := newLineNet(t)
	addr := func(a string) string { return a + ":" + echoPort }
	spec := n.spec
	spec.Allow = pfx(worldPublic + "/32")
	spec.Deny = nil
	spec.AllowNames, spec.DenyNames = true, true
	n.replace(t, spec)
	n.mustReach(t, addr(worldPublic))
	n.mustNotReach(t, addr(worldNotAllowed), addr(worldDenied))

	ctx := context.Background()
	if err := Learn(ctx, n.instance, SetAllowNames, []netip.Addr{netip.MustParseAddr(worldNotAllowed)}, time.Second); err != nil {
		t.Fatal(err)
	}
	n.mustReach(t, addr(worldNotAllowed))
	n.mustNotReach(t, addr(worldDenied))
	// Learning again refreshes; a denied name's address wins over Allow.
	if err := Learn(ctx, n.instance, SetAllowNames, []netip.Addr{netip.MustParseAddr(worldNotAllowed)}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := Learn(ctx, n.instance, SetDenyNames, []netip.Addr{netip.MustParseAddr(worldPublic)}, 0); err != nil {
		t.Fatal(err)
	}
	n.mustNotReach(t, addr(worldPublic))
	n.mustReach(t, addr(worldNotAllowed))
	got := readOurs(t, n.instance).set(SetAllowNames)
	if got == nil || len(got.Ranges) != 1 || got.Ranges[0].String() != worldNotAllowed {
		t.Errorf("learned allow set read back: %+v", got)
	}
	if f, err := Inspect(n.instance, spec); err != nil || f.Verdict != VerdictMatch {
		t.Errorf("Inspect with learned elements: %+v, %v; want match", f, err)
	}

	// A table without learned sets refuses the element, and keeps itself.
	n.replace(t, n.spec)
	if err := Learn(ctx, n.instance, SetAllowNames, []netip.Addr{netip.MustParseAddr(worldNotAllowed)}, time.Minute); err == nil {
		t.Error("Learn into a table without the set succeeded")
	}
	if err := Learn(ctx, n.instance, "pools_v4", []netip.Addr{netip.MustParseAddr(worldNotAllowed)}, time.Minute); err == nil {
		t.Error("Learn into a set of configured addresses succeeded")
	}
}
