package arrows

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kibotos/kibotos"

// rule forbids the packages matching from (a module path, with "/..."
// for a subtree) to depend on any package matching one of never, with
// no package between (direct) or through any chain of imports.
type rule struct {
	why    string
	from   string
	never  []string
	direct bool
}

var rules = []rule{
	// (api's client speaks HTTP; fsm uses api's types only.)
	{why: "the state machine is deterministic: it speaks no network itself", from: module + "/fsm", direct: true,
		never: []string{"net/http", "net/rpc", "github.com/hashicorp/raft/...", "github.com/hashicorp/memberlist"}},
	{why: "the state machine knows no server, node or VMM code", from: module + "/fsm",
		never: []string{module + "/cluster/...", module + "/agent/...", module + "/cli/...", module + "/vmm/...", "github.com/hashicorp/raft/...", "github.com/hashicorp/memberlist"}},
	{why: "the node acts on commands and reports; it never reads the state machine or the server", from: module + "/agent/...",
		never: []string{module + "/fsm/...", module + "/cluster/...", module + "/cli/...", "github.com/hashicorp/raft/..."}},
	{why: "the protocol's types are shared by clients: no server code", from: module + "/api/...",
		never: []string{module + "/cluster/...", module + "/agent/...", module + "/fsm/...", module + "/ctrl/...", module + "/cli/...", module + "/vmm/..."}},
	{why: "the VMM layer knows nothing of consensus or of the node above it", from: module + "/vmm/...",
		never: []string{module + "/cluster/...", module + "/fsm/...", module + "/ctrl/...", module + "/agent/...", module + "/cli/...", "github.com/hashicorp/raft/...", "github.com/hashicorp/memberlist"}},
	{why: "the leader's services reach the member through an interface: no server or CLI code", from: module + "/ctrl/...",
		never: []string{module + "/cluster/...", module + "/cli/..."}},
	{why: "fsm imports placement and ctrl imports fsm: placement stays below ctrl", from: module + "/ctrl/placement/...",
		never: []string{module + "/ctrl"}},
	{why: "certificates and credentials are libraries of their own", from: module + "/trust/...",
		never: []string{module + "/cluster/...", module + "/agent/...", module + "/fsm/...", module + "/cli/..."}},
	{why: "the member's composition root is imported by the CLI only", from: module + "/cluster/...", never: []string{module + "/member/..."}},
	{why: "the member's composition root is imported by the CLI only", from: module + "/agent/...", never: []string{module + "/member/..."}},
	{why: "the member's composition root is imported by the CLI only", from: module + "/ctrl/...", never: []string{module + "/member/..."}},
	{why: "certificates and credentials are libraries of their own", from: module + "/credential/...",
		never: []string{module + "/cluster/...", module + "/agent/...", module + "/fsm/...", module + "/cli/..."}},
	{why: "the SDK is linked into applications: the API's types and the data plane's client, no server or CLI code", from: module + "/sdk/...",
		never: []string{module + "/cluster/...", module + "/fsm/...", module + "/ctrl/...", module + "/cli/...", module + "/member/...", module + "/agent", module + "/agent/runtime/..."}},
}

func matches(pattern, path string) bool {
	if p, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == p || strings.HasPrefix(path, p+"/")
	}
	return path == pattern
}

// imports is every package of the module (and what they import, not
// counting tests) as `go list` sees it.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		if filepath.Dir(dir) == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = filepath.Dir(dir)
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	g := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		g[f[0]] = f[1:]
	}
	return g
}

// chain is a shortest import chain from pkg to a package matching one of
// never (direct: one step only), nil if there is none.
func chain(g map[string][]string, pkg string, never []string, direct bool) []string {
	bad := func(p string) bool { return slices.ContainsFunc(never, func(n string) bool { return matches(n, p) }) }
	prev := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, q := range g[p] {
			if _, seen := prev[q]; seen {
				continue
			}
			prev[q] = p
			if bad(q) {
				var c []string
				for x := q; x != ""; x = prev[x] {
					c = append([]string{x}, c...)
				}
				return c
			}
			if !direct {
				queue = append(queue, q)
			}
		}
	}
	return nil
}

func TestNoForbiddenArrow(t *testing.T) {
	g := imports(t)
	checked := 0
	for _, r := range rules {
		for pkg := range g {
			if !matches(r.from, pkg) {
				continue
			}
			checked++
			if c := chain(g, pkg, r.never, r.direct); c != nil {
				t.Errorf("%s imports %s (%s): %s", pkg, c[len(c)-1], r.why, strings.Join(c, " → "))
			}
		}
	}
	if checked < len(rules) {
		t.Fatalf("only %d packages matched %d rules: the module path or the layout changed", checked, len(rules))
	}
}

// The check itself finds an arrow through a chain and names it.
func TestChainFindsIndirectArrows(t *testing.T) {
	g := map[string][]string{"a": {"b"}, "b": {"c/d"}, "c/d": nil}
	if c := chain(g, "a", []string{"c/..."}, false); strings.Join(c, " ") != "a b c/d" {
		t.Fatalf("chain %v, want a b c/d", c)
	}
	if c := chain(g, "a", []string{"c/..."}, true); c != nil {
		t.Fatalf("direct chain %v, want none", c)
	}
	if c := chain(g, "a", []string{"cd"}, false); c != nil {
		t.Fatalf("chain to cd %v: c/d is not cd", c)
	}
}
