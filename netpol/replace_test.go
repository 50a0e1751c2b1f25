package netpol

import (
	"context"
	"strings"
	"testing"

	"github.com/google/nftables"
)

func readOurs(t *testing.T, nsFD int) *Table {
	t.Helper()
	nt, err := readNamespace(nsFD, nftables.TableFamilyINet, TableName)
	if err != nil {
		t.Fatal(err)
	}
	if nt.ours == nil {
		t.Fatal("no table inet kibotos in the namespace")
	}
	return nt.ours
}

// Replacing twice leaves one table, and the table read back renders like
// the one generated: the renderer and the reader agree with the kernel.
func TestReplaceTwiceAndReadBack(t *testing.T) {
	ns := testNetns(t)
	for _, egress := range []string{EgressNone, EgressProxy, EgressPublic} {
		spec := testSpec(egress)
		spec.Allow = pfx("198.51.100.0/24", "203.0.113.0/24")
		spec.Deny = pfx("203.0.113.9/32")
		want, err := Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := Replace(context.Background(), ns, want); err != nil {
				t.Fatal(err)
			}
		}
		got := readOurs(t, ns)
		if got.String() != want.String() {
			t.Fatalf("egress %s: table read back differs from the generated one:\n%s", egress, lineDiff(want.String(), got.String()))
		}
	}
	// nft itself lists one table with our markers as comments
	out := nsRun(t, ns, "nft", "list", "ruleset")
	if n := strings.Count(out, "table "); n != 1 {
		t.Errorf("nft lists %d tables after two replaces:\n%s", n, out)
	}
	for _, want := range []string{`comment "kibotos:v1:guest-forward/blocked-management"`, `comment "kibotos:v1:set/management_v4"`,
		`comment "kibotos:v1:table/kibotos"`, `comment "kibotos:v1:chain/forward"`, "counter denied"} {
		if !strings.Contains(out, want) {
			t.Errorf("nft list ruleset lacks %s:\n%s", want, out)
		}
	}
}

// A batch the kernel refuses leaves the old table.
func TestReplaceFailedBatchKeepsOldTable(t *testing.T) {
	ns := testNetns(t)
	old, err := Build(testSpec(EgressNone))
	if err != nil {
		t.Fatal(err)
	}
	if err := Replace(context.Background(), ns, old); err != nil {
		t.Fatal(err)
	}
	bad, err := Build(testSpec(EgressPublic))
	if err != nil {
		t.Fatal(err)
	}
	fwd := bad.chain(chainForward)
	fwd.Rules = append(fwd.Rules, &Rule{Comment: marker(layoutVersion, "forward/bad"), Exprs: seq(
		ipDaddrIn(&Set{Name: "no_such_set"}), drop())})
	err = Replace(context.Background(), ns, bad)
	if err == nil || !strings.Contains(err.Error(), "old table kept") || !strings.Contains(err.Error(), "rule forward/bad: no such file or directory") {
		t.Fatalf("Replace with a rule on a missing set = %v, want a refused batch naming the rule", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
	if got := readOurs(t, ns); got.String() != old.String() {
		t.Fatalf("after a refused batch the table changed:\n%s", lineDiff(old.String(), got.String()))
	}
}

// A cancelled context writes nothing.
func TestReplaceCancelled(t *testing.T) {
	ns := testNetns(t)
	tbl, err := Build(testSpec(EgressNone))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Replace(ctx, ns, tbl); err == nil {
		t.Fatal("Replace with a cancelled context succeeded")
	}
	nt, err := readNamespace(ns, nftables.TableFamilyINet, TableName)
	if err != nil || nt.ours != nil {
		t.Fatalf("after a cancelled Replace: %v, table %v", err, nt.ours)
	}
}
