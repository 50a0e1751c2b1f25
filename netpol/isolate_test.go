package netpol

import (
	"context"
	"strings"
	"testing"
)

func TestIsolate(t *testing.T) {
	spec := testSpec(EgressPublic)
	ns := replaced(t, spec)
	l := links(t, ns)
	l.veth(TapName, l, "p-"+TapName) // (no dummy module on every test kernel)
	l.veth(VethName, l, "p-"+VethName)
	nsRun(t, ns, "nft", "add", "table", "ip", "foo")
	nsRun(t, ns, "nft", "add", "table", "netdev", "bar")

	if err := Isolate(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	out := nsRun(t, ns, "nft", "list", "ruleset")
	if n := strings.Count(out, "table "); n != 1 || !strings.Contains(out, "table inet kibotos") {
		t.Fatalf("after Isolate nft lists %d tables:\n%s", n, out)
	}
	for _, want := range []string{
		`type filter hook ingress device "kt0" priority filter; policy drop;`,
		`type filter hook ingress device "ve0" priority filter; policy drop;`,
		"type filter hook prerouting priority filter; policy drop;",
		"type filter hook input priority filter; policy drop;",
		"type filter hook forward priority filter; policy drop;",
		"type filter hook output priority filter; policy drop;",
		"type filter hook postrouting priority filter; policy drop;",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("isolation table lacks %q:\n%s", want, out)
		}
	}
	expect(t, inspect(t, ns, spec), VerdictIsolate, "the namespace is isolated")

	// Isolating twice is fine, and a Replace undoes it.
	if err := Isolate(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	tbl, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := Replace(context.Background(), ns, tbl); err != nil {
		t.Fatal(err)
	}
	expect(t, inspect(t, ns, spec), VerdictMatch)
}

// A namespace without the links (half set up) is isolated all the same.
func TestIsolateWithoutLinks(t *testing.T) {
	ns := testNetns(t)
	if err := Isolate(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	out := nsRun(t, ns, "nft", "list", "ruleset")
	if strings.Contains(out, "ingress") || !strings.Contains(out, "hook forward") {
		t.Fatalf("isolation table without links:\n%s", out)
	}
}
