package netpol

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/nftables"
)

func TestRemoveHost(t *testing.T) {
	n := testNamespaces(t)
	ns := openNew(t, n, "node")
	host, err := BuildHost(HostSpec{Pools: []netip.Prefix{netip.MustParsePrefix("10.213.0.0/24")}, UplinkIface: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ReplaceHost(ctx, int(ns), host); err != nil {
		t.Fatal(err)
	}
	tables := func() int {
		t.Helper()
		nt, err := readNamespace(int(ns), nftables.TableFamilyINet, TableName)
		if err != nil {
			t.Fatal(err)
		}
		return len(nt.all)
	}
	if got := tables(); got != 1 {
		t.Fatalf("%d tables after ReplaceHost, want 1", got)
	}
	for i := 0; i < 2; i++ { // the second finds none, which is fine
		if err := RemoveHost(ctx, int(ns)); err != nil {
			t.Fatal(err)
		}
		if got := tables(); got != 0 {
			t.Fatalf("%d tables after RemoveHost, want 0", got)
		}
	}
}
