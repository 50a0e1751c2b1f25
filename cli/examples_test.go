package cli

import (
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// Every visible verb has an example, and every example parses: a flag
// renamed or removed breaks this test, not a user's first try.
func TestEveryVerbHasAWorkingExample(t *testing.T) {
	newParser := func() *kong.Kong {
		var root CLI
		p, err := newKong(&root, kong.Name("kibo"), kong.Exit(func(int) {}))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		if n.Leaf() && !n.Hidden && n.Type == kong.CommandNode {
			if len(examples[n.Path()]) == 0 {
				t.Errorf("%s has no example (cli/examples.go)", n.Path())
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(newParser().Model.Node)
	for path, exs := range examples {
		for _, ex := range exs {
			args := splitExample(ex)
			if len(args) < 2 || (args[0] != "kibo" && args[0] != "kibotos") {
				t.Errorf("%s: example %q does not start with kibo or kibotos", path, ex)
				continue
			}
			if strings.HasPrefix(ex, "kibo enrollment grant") && path == "join" {
				continue // the grant step shown beside join
			}
			ctx, err := newParser().Parse(args[1:])
			if err != nil && strings.Contains(err.Error(), "no such file or directory") {
				continue // a path of the user's (serve --config /etc/kibotos/kibotos.toml)
			}
			if err != nil {
				t.Errorf("%s: example %q does not parse: %v", path, ex, err)
				continue
			}
			if got := ctx.Selected().Path(); got != path {
				t.Errorf("example %q is listed under %s but runs %s", ex, path, got)
			}
		}
	}
}

// splitExample splits an example as a shell would (single quotes, no
// escapes) and drops a trailing # comment.
func splitExample(s string) []string {
	var out []string
	var cur strings.Builder
	inQuote, have := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			inQuote, have = !inQuote, true
		case r == '#' && !inQuote && !have:
			return out
		case r == ' ' && !inQuote:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}

// Every list verb takes -q (ids or names only, one per line) besides the
// global --json, as workspace list does.
func TestEveryListTakesQuiet(t *testing.T) {
	var root CLI
	p, err := newKong(&root, kong.Name("kibo"), kong.Exit(func(int) {}))
	if err != nil {
		t.Fatal(err)
	}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		if n.Type == kong.CommandNode && n.Name == "list" && !n.Hidden {
			quiet := false
			for _, f := range n.Flags {
				quiet = quiet || (f.Name == "quiet" && f.Short == 'q')
			}
			if !quiet {
				t.Errorf("%s has no -q/--quiet", n.Path())
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(p.Model.Node)
}
