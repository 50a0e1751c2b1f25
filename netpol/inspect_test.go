package netpol

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
)

// replaced is a namespace holding Build(spec).
func replaced(t *testing.T, spec TableSpec) int {
	t.Helper()
	ns := testNetns(t)
	tbl, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := Replace(context.Background(), ns, tbl); err != nil {
		t.Fatal(err)
	}
	return ns
}

func inspect(t *testing.T, ns int, spec TableSpec) Finding {
	t.Helper()
	f, err := Inspect(ns, spec)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// expect checks the verdict and that some reason (for isolate) or
// difference (for rewrite) contains each of the given texts.
func expect(t *testing.T, f Finding, v Verdict, texts ...string) {
	t.Helper()
	lines := f.Differences
	if v == VerdictIsolate {
		lines = f.Reasons
	}
	if f.Verdict != v {
		t.Fatalf("verdict %s, want %s\nreasons: %q\ndifferences: %q", f.Verdict, v, f.Reasons, f.Differences)
	}
	for _, text := range texts {
		found := false
		for _, l := range lines {
			found = found || strings.Contains(l, text)
		}
		if !found {
			t.Errorf("no line contains %q: %q", text, lines)
		}
	}
	for _, l := range append(f.Reasons, f.Differences...) {
		if strings.Contains(l, "\n") {
			t.Errorf("line is not one line: %q", l)
		}
	}
	if v != VerdictIsolate && len(f.Reasons) > 0 {
		t.Errorf("reasons with verdict %s: %q", v, f.Reasons)
	}
}

func TestInspectMatch(t *testing.T) {
	for _, e := range []string{EgressNone, EgressPublic, EgressProxy} {
		spec := testSpec(e)
		spec.Allow = pfx("198.51.100.0/24")
		ns := replaced(t, spec)
		expect(t, inspect(t, ns, spec), VerdictMatch)
		spec6 := testSpec6(e)
		spec6.Allow = pfx("198.51.100.0/24", "2001:db8:77::/48")
		if e == EgressPublic {
			spec6.AllowNames, spec6.DenyNames = true, true
		}
		ns = replaced(t, spec6)
		expect(t, inspect(t, ns, spec6), VerdictMatch)
	}
}

// IPv6 sets are the spec's like IPv4 ones: a changed IPv6 management range
// or pool isolates, a table without the IPv6 part (or with one the spec
// does not have) does not hold the policy, and a hand-added element in an
// IPv6 set isolates.
func TestInspectIPv6(t *testing.T) {
	spec := testSpec6(EgressPublic)
	ns := replaced(t, spec)

	moved := spec
	moved.Management = pfx("10.10.0.0/16", "10.20.0.0/16", "10.21.0.0/16", "2001:db8:10::/48")
	expect(t, inspect(t, ns, moved), VerdictIsolate, "set management_v6 does not match the spec: unexpected fd00:10::/32")
	moved = spec
	moved.Pools = pfx("10.240.0.0/20", "fd6b:6b00:241::/64")
	moved.Guest6 = netip.MustParseAddr("fd6b:6b00:241::2")
	expect(t, inspect(t, ns, moved), VerdictIsolate, "set pools_v6 does not match the spec: missing fd6b:6b00:241::/64; unexpected fd6b:6b00:240::/64")

	expect(t, inspect(t, ns, testSpec(EgressPublic)), VerdictIsolate, "set host_v6 is not in layout v1")
	ns4 := replaced(t, testSpec(EgressPublic))
	expect(t, inspect(t, ns4, spec), VerdictIsolate, "set host_v6 is missing")

	nsRun(t, ns, "nft", "add", "element", "inet", "kibotos", "allow_v6", "{ 2001:db8:99::/48 }")
	expect(t, inspect(t, ns, spec), VerdictIsolate, "set allow_v6 does not match the spec: unexpected 2001:db8:99::/48")
}

func TestInspectIsolateCases(t *testing.T) {
	spec := testSpec(EgressPublic)
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, ns int)
		texts []string
	}{
		{"foreign table by nft", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "add", "table", "ip", "foo")
		}, []string{"table ip foo is not the node's"}},
		{"foreign table by Go", func(t *testing.T, ns int) {
			c, err := nftables.New(nftables.WithNetNSFd(ns))
			if err != nil {
				t.Fatal(err)
			}
			c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName})
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
		}, []string{"table ip kibotos is not the node's"}},
		{"hand-added rule", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "insert", "rule", "inet", "kibotos", "forward", "ip", "daddr", "10.10.0.9", "accept")
		}, []string{`chain forward: rule handle`, `added by hand: meta nfproto ipv4 ip daddr 10.10.0.9 accept`}},
		{"hand-added rule with a foreign comment", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "add", "rule", "inet", "kibotos", "input", "accept", "comment", `"debugging"`)
		}, []string{`accept comment "debugging"`}},
		{"hand-added chain", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "add", "chain", "inet", "kibotos", "sneaky", "{ type filter hook forward priority -10; policy accept; }")
		}, []string{"chain sneaky was added by hand (no kibotos marker)"}},
		{"hand-added chain with forged rule markers", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "add", "chain", "inet", "kibotos", "forged")
			nsRun(t, ns, "nft", "add", "rule", "inet", "kibotos", "forged", "accept", "comment", `"kibotos:v1:forged/x"`)
			nsRun(t, ns, "nft", "insert", "rule", "inet", "kibotos", "forward", "jump", "forged", "comment", `"kibotos:v1:forward/x"`)
		}, []string{"chain forged was added by hand (no kibotos marker)"}},
		{"table made by hand under our name", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "delete", "table", "inet", "kibotos")
			nsRun(t, ns, "nft", "add", "table", "inet", "kibotos")
		}, []string{"table inet kibotos was not made by the node (no kibotos marker)", "set host_v4 is missing"}},
		{"element added", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "add", "element", "inet", "kibotos", "pools_v4", "{ 192.168.5.0/24 }")
		}, []string{"set pools_v4 does not match the spec: unexpected 192.168.5.0/24"}},
		{"element deleted", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "delete", "element", "inet", "kibotos", "management_v4", "{ 10.10.0.0/16 }")
		}, []string{"set management_v4 does not match the spec: missing 10.10.0.0/16"}},
		{"hand-added set", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "add", "set", "inet", "kibotos", "extra", "{ type ipv4_addr; }")
		}, []string{"set extra was added by hand"}},
		{"hand-added quota", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "add", "quota", "inet", "kibotos", "q", "{ over 1 mbytes; }")
		}, []string{"quota q in the node's table was added by hand"}},
		{"table deleted", func(t *testing.T, ns int) {
			nsRun(t, ns, "nft", "delete", "table", "inet", "kibotos")
		}, []string{"no node table inet kibotos in the namespace"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns := replaced(t, spec)
			c.setup(t, ns)
			expect(t, inspect(t, ns, spec), VerdictIsolate, c.texts...)
		})
	}
}

func TestInspectEmptyNamespace(t *testing.T) {
	ns := testNetns(t)
	expect(t, inspect(t, ns, testSpec(EgressNone)), VerdictIsolate, "no node table inet kibotos")
}

// The namespace is right, the spec moved on: new policy addresses are a
// reason to isolate, a new resolver is a rewrite.
func TestInspectSpecChanged(t *testing.T) {
	spec := testSpec(EgressPublic)
	ns := replaced(t, spec)

	moved := spec
	moved.Management = pfx("10.10.0.0/16")
	expect(t, inspect(t, ns, moved), VerdictIsolate, "set management_v4 does not match the spec: unexpected 10.20.0.0/15")

	moved = spec
	moved.Resolver = netip.MustParseAddrPort("10.10.0.54:53")
	f := inspect(t, ns, moved)
	expect(t, f, VerdictRewrite, "chain prerouting: rule prerouting/dns-udp is", "chain guest-forward: rule guest-forward/dns is")
	tbl, err := Build(moved)
	if err != nil {
		t.Fatal(err)
	}
	if err := Replace(context.Background(), ns, tbl); err != nil {
		t.Fatal(err)
	}
	expect(t, inspect(t, ns, moved), VerdictMatch)

	moved.Egress = EgressNone
	expect(t, inspect(t, ns, moved), VerdictRewrite, "chain guest-forward: rule guest-forward/egress-public is not in layout v1")
}

// An older layout (stood for by version 0 and a rule it did not have yet)
// is rewritten; a newer one cannot be enforced.
func TestInspectLayoutVersions(t *testing.T) {
	spec := testSpec(EgressNone)
	ns := testNetns(t)
	old, err := buildLayout(spec, layoutVersion-1)
	if err != nil {
		t.Fatal(err)
	}
	fwd := old.chain(chainForward)
	fwd.Rules = fwd.Rules[:1+copy(fwd.Rules[1:], fwd.Rules[2:])] // the older layout had no "invalid" rule
	if err := Replace(context.Background(), ns, old); err != nil {
		t.Fatal(err)
	}
	expect(t, inspect(t, ns, spec), VerdictRewrite,
		"chain forward: rule forward/invalid is missing",
		"table inet kibotos was written by layout v0, this build writes v1")

	// a table partly of an older layout names the older items
	mixed, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	mixed.chain(chainInput).Rules[1].Comment = marker(layoutVersion-1, "input/loopback")
	mixed.set(setPools).Comment = marker(layoutVersion-1, "set/"+setPools)
	if err := Replace(context.Background(), ns, mixed); err != nil {
		t.Fatal(err)
	}
	expect(t, inspect(t, ns, spec), VerdictRewrite,
		"chain input: rule input/loopback was written by layout v0",
		"set pools_v4 was written by layout v0")

	newer, err := buildLayout(spec, layoutVersion+1)
	if err != nil {
		t.Fatal(err)
	}
	if err := Replace(context.Background(), ns, newer); err != nil {
		t.Fatal(err)
	}
	expect(t, inspect(t, ns, spec), VerdictIsolate, "cannot enforce: table inet kibotos was written by layout v2")
}

// Pure checks of the classification on tables that never saw a kernel.
func TestClassify(t *testing.T) {
	spec := testSpec(EgressPublic)
	want, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	got := func(change func(*Table)) namespaceTables {
		g, err := Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		change(g)
		return namespaceTables{all: []dumpedTable{{family: g.Family, name: g.Name}}, ours: g}
	}
	expect(t, classify(want, got(func(*Table) {})), VerdictMatch)
	expect(t, classify(want, got(func(g *Table) { g.Flags = 1 })), VerdictRewrite, "has flags dormant")
	expect(t, classify(want, got(func(g *Table) {
		g.chain(chainForward).Policy = nftables.ChainPolicyAccept
	})), VerdictRewrite, `chain forward: "type filter hook forward priority filter; policy accept;"`)
	expect(t, classify(want, got(func(g *Table) {
		r := g.chain(chainForward).Rules
		r[0], r[1] = r[1], r[0]
	})), VerdictRewrite, "chain forward: the rules are in another order")
	expect(t, classify(want, got(func(g *Table) {
		c := g.chain(chainInput)
		c.Rules = append(c.Rules, c.Rules[0])
	})), VerdictRewrite, "rule input/established is there 2 times")
	expect(t, classify(want, got(func(g *Table) {
		g.chain(chainInput).Rules[0].UserData = []byte{0, 200, 1}
	})), VerdictIsolate, "chain input: rule handle 0 was added by hand")
	expect(t, classify(want, got(func(g *Table) {
		g.Chains = append(g.Chains, &Chain{Name: "old", regular: true, Comment: marker(0, "chain/old"), Rules: []*Rule{{Comment: marker(0, "old/x"), Exprs: accept()}}})
	})), VerdictRewrite, "chain old is not in layout v1")
	expect(t, classify(want, got(func(g *Table) {
		g.Chains = append(g.Chains, &Chain{Name: "forged", regular: true, Rules: []*Rule{{Comment: marker(1, "forged/x"), Exprs: accept()}}})
	})), VerdictIsolate, "chain forged was added by hand")
	expect(t, classify(want, got(func(g *Table) { g.Comment = "" })), VerdictIsolate, "table inet kibotos was not made by the node")
	expect(t, classify(want, got(func(g *Table) { g.Counters = nil })), VerdictRewrite, "counter denied is missing")
	expect(t, classify(want, got(func(g *Table) { g.Sets = g.Sets[1:] })), VerdictIsolate, "set host_v4 is missing")
	expect(t, classify(want, got(func(g *Table) {
		g.chain(chainInput).Rules[0].Comment = marker(layoutVersion, isolateMarker+"input")
	})), VerdictIsolate, "the namespace is isolated")
}

func TestRuleCommentMalformed(t *testing.T) {
	for _, ud := range [][]byte{{0}, {0, 5, 'a'}, {0, 2, 'a', 0, 9}} {
		if c, only := ruleComment(ud); only {
			t.Errorf("ruleComment(%v) = %q, only", ud, c)
		}
	}
	if c, only := ruleComment(commentUserData("kibotos:v1:x/y")); !only || c != "kibotos:v1:x/y" {
		t.Errorf("round trip = %q %v", c, only)
	}
	for _, bad := range []string{"kibotos:v:x", "kibotos:v01:x", "kibotos:v1:", "kibotos:v-1:x", "other"} {
		if _, _, ok := parseMarker(bad); ok {
			t.Errorf("parseMarker(%q) ok", bad)
		}
	}
}
