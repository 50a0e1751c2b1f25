package netpol

import (
	"fmt"
	"slices"
	"strings"
)

// Verdict is what a node may do with a namespace it did not just set up.
type Verdict int

const (
	// VerdictMatch: the namespace holds exactly the table Build makes.
	VerdictMatch Verdict = iota
	// VerdictRewrite: the node's own table, with the spec's addresses, that
	// differs only where a regeneration (Replace with Build's table) fixes
	// it: rules of an older layout, a changed resolver, a missing rule.
	VerdictRewrite
	// VerdictIsolate: the namespace cannot be trusted to hold the policy;
	// Isolate it and do not run the Instance's network as it is.
	VerdictIsolate
)

func (v Verdict) String() string {
	switch v {
	case VerdictMatch:
		return "match"
	case VerdictRewrite:
		return "rewrite"
	case VerdictIsolate:
		return "isolate"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Finding is what Inspect concluded, with the lines an operator reads.
type Finding struct {
	Verdict Verdict
	// Reasons say why the namespace must be isolated, one line each; empty
	// unless Verdict is VerdictIsolate.
	Reasons []string
	// Differences say what a regeneration would change, one line each.
	Differences []string
}

func (f *Finding) reason(format string, args ...any) {
	f.Reasons = append(f.Reasons, fmt.Sprintf(format, args...))
}

func (f *Finding) diff(format string, args ...any) {
	f.Differences = append(f.Differences, fmt.Sprintf(format, args...))
}

func (f Finding) done() Finding {
	switch {
	case len(f.Reasons) > 0:
		f.Verdict = VerdictIsolate
	case len(f.Differences) > 0:
		f.Verdict = VerdictRewrite
	default:
		f.Verdict = VerdictMatch
	}
	return f
}

// Inspect reads every table of the namespace and classifies them against
// Build(spec). It changes nothing.
func Inspect(nsFD int, spec TableSpec) (Finding, error) {
	want, err := Build(spec)
	if err != nil {
		return Finding{}, fmt.Errorf("netpol: namespace fd %d: inspect: %w", nsFD, err)
	}
	nt, err := readNamespace(nsFD, want.Family, want.Name)
	if err != nil {
		return Finding{}, fmt.Errorf("netpol: namespace fd %d: inspect: %w", nsFD, err)
	}
	return classify(want, nt), nil
}

// classify compares what a namespace holds with the table it should hold.
func classify(want *Table, nt namespaceTables) Finding {
	var f Finding
	name := familyName(want.Family) + " " + want.Name
	for _, t := range nt.all {
		if t.family != want.Family || t.name != want.Name {
			f.reason("table %s %s is not the node's", familyName(t.family), t.name)
		}
	}
	got := nt.ours
	if got == nil {
		f.reason("no node table %s in the namespace", name)
		return f.done()
	}
	if isolated(got) {
		f.reason("the namespace is isolated: table %s drops everything", name)
		return f.done()
	}
	// A newer layout may mean rules this build cannot read the sense of:
	// comparing further would only guess.
	if v := newestLayout(got); v > layoutVersion {
		f.reason("cannot enforce: table %s was written by layout v%d, this build knows layouts up to v%d", name, v, layoutVersion)
		return f.done()
	}
	if _, n, ok := parseMarker(got.Comment); !ok || n != "table/"+got.Name {
		f.reason("table %s was not made by the node (no kibotos marker)", name)
	}
	if got.Flags != 0 {
		f.diff("table %s has flags %s", name, tableFlags(got.Flags))
	}
	// A table all of one older layout says so once; a mix says it per item.
	vs := layouts(got)
	mixed := len(vs) > 1
	if len(vs) == 1 && vs[0] != layoutVersion {
		f.diff("table %s was written by layout v%d, this build writes v%d", name, vs[0], layoutVersion)
	}
	compareObjects(&f, want, got)
	compareSets(&f, want, got, mixed)
	compareChains(&f, want, got, mixed)
	return f.done()
}

// isolated says whether t is the table Isolate writes.
func isolated(t *Table) bool {
	if _, name, ok := parseMarker(t.Comment); ok && strings.HasPrefix(name, isolateMarker) {
		return true
	}
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			if _, name, ok := parseMarker(r.Comment); ok && strings.HasPrefix(name, isolateMarker) {
				return true
			}
		}
	}
	return false
}

// layouts are the layout versions marked anywhere in t, sorted.
func layouts(t *Table) []int {
	var vs []int
	add := func(comment string) {
		if v, _, ok := parseMarker(comment); ok && !slices.Contains(vs, v) {
			vs = append(vs, v)
		}
	}
	add(t.Comment)
	for _, s := range t.Sets {
		add(s.Comment)
	}
	for _, c := range t.Chains {
		add(c.Comment)
		for _, r := range c.Rules {
			add(r.Comment)
		}
	}
	slices.Sort(vs)
	return vs
}

// newestLayout is the highest layout version marked on t, -1 for none.
func newestLayout(t *Table) int {
	vs := layouts(t)
	if len(vs) == 0 {
		return -1
	}
	return vs[len(vs)-1]
}

// compareObjects: objects carry no marker, but the node only ever writes
// counters, so any other object was added by hand; a counter too many or
// too few is a layout's business.
func compareObjects(f *Finding, want, got *Table) {
	for _, o := range got.Objects {
		f.reason("%s %s in the node's table was added by hand", objTypeName(o.Type), o.Name)
	}
	for _, c := range want.Counters {
		if !slices.Contains(got.Counters, c) {
			f.diff("counter %s is missing", c)
		}
	}
	for _, c := range got.Counters {
		if !slices.Contains(want.Counters, c) {
			f.diff("counter %s is not in layout v%d", c, layoutVersion)
		}
	}
}

// compareSets: the sets hold the policy's addresses, so any set that does
// not hold exactly the spec's is a reason to isolate, not to rewrite.
func compareSets(f *Finding, want, got *Table, perItemVersions bool) {
	for _, g := range got.Sets {
		v, name, ok := parseMarker(g.Comment)
		w := want.set(g.Name)
		switch {
		case !ok || name != "set/"+g.Name:
			f.reason("set %s was added by hand (no kibotos marker)", g.Name)
			continue
		case w == nil:
			f.reason("set %s is not in layout v%d", g.Name, layoutVersion)
			continue
		case g.elemErr != "":
			f.reason("set %s: elements are not address ranges: %s", g.Name, g.elemErr)
			continue
		}
		// A learned set's elements are the resolver's answers, not the
		// spec's: only its shape is compared.
		if missing, unexpected := rangeDiff(w.Ranges, g.Ranges); !w.learned() && len(missing)+len(unexpected) > 0 {
			var parts []string
			if len(missing) > 0 {
				parts = append(parts, "missing "+strings.Join(missing, ", "))
			}
			if len(unexpected) > 0 {
				parts = append(parts, "unexpected "+strings.Join(unexpected, ", "))
			}
			f.reason("set %s does not match the spec: %s", g.Name, strings.Join(parts, "; "))
		}
		if g.KeyType.Name != w.KeyType.Name || g.Flags != w.Flags {
			f.diff("set %s is of type %s flags %s, layout v%d has %s flags %s",
				g.Name, g.KeyType.Name, setFlags(g.Flags), layoutVersion, w.KeyType.Name, setFlags(w.Flags))
		}
		if perItemVersions && v != layoutVersion {
			f.diff("set %s was written by layout v%d", g.Name, v)
		}
	}
	for _, w := range want.Sets {
		if got.set(w.Name) == nil {
			f.reason("set %s is missing", w.Name)
		}
	}
}

// rangeDiff lists the ranges only want has and those only got has.
func rangeDiff(want, got []addrRange) (missing, unexpected []string) {
	for _, r := range want {
		if !slices.Contains(got, r) {
			missing = append(missing, r.String())
		}
	}
	for _, r := range got {
		if !slices.Contains(want, r) {
			unexpected = append(unexpected, r.String())
		}
	}
	return missing, unexpected
}

// compareChains: a chain or rule is the node's when it carries our marker.
func compareChains(f *Finding, want, got *Table, perItemVersions bool) {
	for _, g := range got.Chains {
		for _, r := range g.Rules {
			if !ours(r) {
				f.reason("chain %s: rule handle %d was added by hand: %s", g.Name, r.Handle, r)
			}
		}
		v, name, ok := parseMarker(g.Comment)
		w := want.chain(g.Name)
		switch {
		case !ok || name != "chain/"+g.Name:
			f.reason("chain %s was added by hand (no kibotos marker)", g.Name)
			continue
		case w == nil:
			f.diff("chain %s is not in layout v%d", g.Name, layoutVersion)
			continue
		}
		if perItemVersions && v != layoutVersion {
			f.diff("chain %s was written by layout v%d", g.Name, v)
		}
		if gh, wh := g.header(), w.header(); gh != wh {
			f.diff("chain %s: %q, layout v%d has %q", g.Name, gh, layoutVersion, wh)
		}
		compareRules(f, w, g, perItemVersions)
	}
	for _, w := range want.Chains {
		if got.chain(w.Name) == nil {
			f.diff("chain %s is missing", w.Name)
		}
	}
}

// ours says whether a rule carries our marker and nothing we did not write.
func ours(r *Rule) bool {
	_, _, ok := parseMarker(r.Comment)
	return ok && r.UserData == nil && r.undecoded == nil
}

// markedRule is a rule of ours, named by its marker.
type markedRule struct {
	version int
	name    string
	stmts   string
}

func markedRules(c *Chain) []markedRule {
	var out []markedRule
	for _, r := range c.Rules {
		if v, name, ok := parseMarker(r.Comment); ok && ours(r) {
			out = append(out, markedRule{version: v, name: name, stmts: renderExprs(r.Exprs)})
		}
	}
	return out
}

// compareRules lists how the marked rules of got differ from want's.
func compareRules(f *Finding, want, got *Chain, perItemVersions bool) {
	w, g := markedRules(want), markedRules(got)
	if slices.Equal(w, g) {
		return
	}
	byName := map[string]markedRule{}
	count := map[string]int{}
	for _, r := range g {
		if count[r.name] == 0 {
			byName[r.name] = r
		}
		count[r.name]++
	}
	wantNames := map[string]bool{}
	for _, wr := range w {
		wantNames[wr.name] = true
		gr, ok := byName[wr.name]
		switch {
		case !ok:
			f.diff("chain %s: rule %s is missing", got.Name, wr.name)
			continue
		case count[wr.name] > 1:
			f.diff("chain %s: rule %s is there %d times", got.Name, wr.name, count[wr.name])
		}
		if perItemVersions && gr.version != wr.version {
			f.diff("chain %s: rule %s was written by layout v%d", got.Name, wr.name, gr.version)
		}
		if gr.stmts != wr.stmts {
			f.diff("chain %s: rule %s is `%s`, regenerated `%s`", got.Name, wr.name, gr.stmts, wr.stmts)
		}
	}
	var extra, order []string
	for _, gr := range g {
		if !wantNames[gr.name] {
			extra = append(extra, gr.name)
		} else {
			order = append(order, gr.name)
		}
	}
	for _, name := range extra {
		f.diff("chain %s: rule %s is not in layout v%d", got.Name, name, layoutVersion)
	}
	var wantOrder []string
	for _, wr := range w {
		if count[wr.name] > 0 {
			wantOrder = append(wantOrder, wr.name)
		}
	}
	if len(order) == len(wantOrder) && !slices.Equal(order, wantOrder) {
		f.diff("chain %s: the rules are in another order", got.Name)
	}
}
