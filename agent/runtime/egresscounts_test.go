package runtime

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"testing"

	"github.com/kibotos/kibotos/agent/egress"
)

// fakeEgress is an EgressRouter that counts by guest.
type fakeEgress map[netip.Addr]egress.GuestStats

func (fakeEgress) Apply(context.Context, egress.Config) error { return nil }

func (f fakeEgress) GuestTotals(context.Context) map[netip.Addr]egress.GuestStats { return f }

// The egress counters by guest become counters by Instance, for the
// running or starting Instances the egress process routes only.
func TestEgressByInstance(t *testing.T) {
	proxied := NetworkPolicy{Proxy: &EgressProxy{Name: "e1", Revision: 1, SOCKS5: "192.0.2.9:1080"}}
	inst := func(id string, st State, guest string, p NetworkPolicy) *instance {
		return &instance{id: id, state: st, rec: &LaunchRecord{Network: &NetworkRecord{Guest: netip.MustParseAddr(guest), Policy: p}}}
	}
	counts := fakeEgress{}
	for i, g := range []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"} {
		counts[netip.MustParseAddr(g)] = egress.GuestStats{Guest: netip.MustParseAddr(g), Accepted: uint64(i + 1)}
	}
	rt := &Runtime{cfg: Config{Egress: counts}, instances: map[string]*instance{
		"running":  inst("running", StateRunning, "10.0.0.2", proxied),
		"starting": inst("starting", StateStarting, "10.0.0.3", proxied),
		"stopped":  inst("stopped", StateStopped, "10.0.0.4", proxied),
		"direct":   inst("direct", StateRunning, "10.0.0.5", NetworkPolicy{}),
	}}
	got, ok := rt.EgressByInstance(context.Background())
	want := map[string]egress.GuestStats{"running": counts[netip.MustParseAddr("10.0.0.2")], "starting": counts[netip.MustParseAddr("10.0.0.3")]}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("by Instance %+v (%v), want %+v", got, ok, want)
	}
	if _, ok := (&Runtime{}).EgressByInstance(context.Background()); ok {
		t.Fatal("a node without an egress process has counters")
	}
}

// A node that could not prepare its egress process refuses a policy that
// needs it with why, not a guess.
func TestEgressPolicyRefusedWithWhy(t *testing.T) {
	why := errors.New("egress: account kibotos-egress (uid 995) cannot execute /root/kibotos/bin/kibotos: /root (mode 0710, owner 0:0, an ACL without it) denies it")
	rt := &Runtime{cfg: Config{EgressUnavailable: why}}
	err := rt.checkEgressPolicy("inst-1", NetworkPolicy{Egress: EgressProxyMode, Proxy: &EgressProxy{Name: "e1", Revision: 1, SOCKS5: "192.0.2.9:1080"}})
	if err == nil || err.Error() != "runtime: instance inst-1: its policy needs the egress process, which this node cannot run: "+why.Error() {
		t.Fatalf("refusal: %v", err)
	}
}
