package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// Every `kibo ...` and `kibotos ...` command written in README.md and
// docs/ parses against the CLI: a renamed verb or flag breaks this test,
// not a reader's copy and paste.
//
// Commands are taken from fenced code blocks (sh, bash, console or no
// language; output blocks are marked text) and from inline code spans
// that start with `kibo ` or `kibotos `. A leading `$ `/`# ` prompt,
// trailing `# comments`, redirections, `sudo`, VAR=value assignments and
// `$(...)`/`<(...)` wrapping are removed, `\` continuations and synopsis
// lines continued on an indented `[...]` line are joined, and `&&`, `;`
// and pipes split a line into commands.
//
//   - An example (concrete words) must parse with kong's parser exactly,
//     without running: placeholders such as WS or NODE are fine as values.
//   - A synopsis (`[...]`, `A | B`, `ARGS...`, `<arg>`) is checked loosely: its
//     command path exists and every flag it names is a flag of that
//     command or of a command above it.
//   - A mention, an inline span of command words and maybe flags without
//     values (`kibo workspace exec`, `kibotos serve --config`), names a
//     command that exists and flags of it.
func TestDocsCommandsParse(t *testing.T) {
	files := []string{filepath.Join("..", "README.md")}
	err := filepath.WalkDir(filepath.Join("..", "docs"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	model := docsParser(t).Model.Node
	counts := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(filepath.ToSlash(f), "../")
		for _, c := range docCommands(string(b)) {
			kind, err := checkDocCommand(t, model, c)
			counts[kind]++
			if err != nil {
				t.Errorf("%s:%d: %s %q: %v", name, c.line, kind, strings.Join(c.args, " "), err)
			}
		}
	}
	total := counts["example"] + counts["synopsis"] + counts["mention"]
	t.Logf("checked %d commands in %d files: %d examples parsed, %d synopses, %d mentions",
		total, len(files), counts["example"], counts["synopsis"], counts["mention"])
	if total < 100 {
		t.Errorf("only %d commands found in the docs: is the extraction broken?", total)
	}
}

// docsParser is the CLI's kong parser as the binary builds it, except
// that existingfile/existingdir values (serve --config /etc/...) need not
// exist on the test machine, and help and exit do nothing.
func docsParser(t *testing.T) *kong.Kong {
	var root CLI
	anyPath := kong.MapperFunc(func(ctx *kong.DecodeContext, target reflect.Value) error {
		var s string
		if err := ctx.Scan.PopValueInto("path", &s); err != nil {
			return err
		}
		target.SetString(s)
		return nil
	})
	p, err := newKong(&root, kong.Name("kibo"),
		kong.Exit(func(int) {}),
		kong.Writers(io.Discard, io.Discard),
		kong.NamedMapper("existingfile", anyPath),
		kong.NamedMapper("existingdir", anyPath),
	)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type docCommand struct {
	line   int
	args   []string // after the program name
	inline bool     // an inline code span, not a line of a code block
}

var inlineCode = regexp.MustCompile("`([^`]+)`")

// docCommands finds the kibo/kibotos commands of a Markdown text.
func docCommands(md string) []docCommand {
	var out []docCommand
	lines := strings.Split(md, "\n")
	var prose strings.Builder // text outside fences, line structure kept
	inFence, checkFence := false, false
	fence := ""
	prevCmd := -1 // index in out of the previous line's last command, for indented continuations
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		trim := strings.TrimSpace(l)
		if !inFence && (strings.HasPrefix(trim, "```") || strings.HasPrefix(trim, "~~~")) {
			inFence, fence = true, trim[:3]
			lang := strings.TrimSpace(strings.TrimLeft(trim, "`~"))
			checkFence = lang == "" || lang == "sh" || lang == "bash" || lang == "shell" || lang == "console"
			prose.WriteString("\n")
			prevCmd = -1
			continue
		}
		if inFence {
			prose.WriteString("\n")
			if strings.HasPrefix(trim, fence) {
				inFence = false
				continue
			}
			if !checkFence {
				continue
			}
			start := i + 1
			for strings.HasSuffix(l, "\\") && i+1 < len(lines) {
				i++
				prose.WriteString("\n")
				l = strings.TrimSuffix(l, "\\") + " " + lines[i]
			}
			if prevCmd >= 0 && l != strings.TrimLeft(l, " \t") && (strings.HasPrefix(trim, "[") || strings.HasPrefix(trim, "-")) {
				// A synopsis continued on an indented line.
				words := shellWords(stripComment(trim))
				out[prevCmd].args = append(out[prevCmd].args, words...)
				continue
			}
			prevCmd = -1
			for _, args := range commandsOfLine(l) {
				out = append(out, docCommand{line: start, args: args})
				prevCmd = len(out) - 1
			}
			continue
		}
		prose.WriteString(l + "\n")
	}
	// Inline code spans of the prose (they may run over a line break).
	text := prose.String()
	for _, m := range inlineCode.FindAllStringSubmatchIndex(text, -1) {
		span := strings.Join(strings.Fields(text[m[2]:m[3]]), " ")
		if !strings.HasPrefix(span, "kibo ") && !strings.HasPrefix(span, "kibotos ") {
			continue
		}
		line := 1 + strings.Count(text[:m[0]], "\n")
		for _, args := range commandsOfLine(span) {
			out = append(out, docCommand{line: line, args: args, inline: true})
		}
	}
	return out
}

// commandsOfLine returns the arguments of each kibo/kibotos command on a
// shell line.
func commandsOfLine(l string) [][]string {
	l = strings.TrimSpace(l)
	for _, p := range []string{"$ ", "# "} {
		l = strings.TrimPrefix(l, p)
	}
	l = stripComment(l)
	var out [][]string
	// $(...) and <(...) hold commands of their own.
	for {
		i := strings.Index(l, "$(")
		if j := strings.Index(l, "<("); j >= 0 && (i < 0 || j < i) {
			i = j
		}
		if i < 0 {
			break
		}
		depth, end := 0, -1
		for k := i + 1; k < len(l); k++ {
			if l[k] == '(' {
				depth++
			} else if l[k] == ')' {
				depth--
				if depth == 0 {
					end = k
					break
				}
			}
		}
		if end < 0 {
			break
		}
		out = append(out, commandsOfLine(l[i+2:end])...)
		l = l[:i] + "SUBST" + l[end+1:]
	}
	for _, seg := range splitOperators(shellWords(l)) {
		if args, ok := kiboArgs(seg); ok {
			out = append(out, args)
		}
	}
	return out
}

// stripComment drops a # comment (a # after a space, outside quotes).
func stripComment(l string) string {
	quote := rune(0)
	for i, r := range l {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || l[i-1] == ' ' || l[i-1] == '\t'):
			return strings.TrimSpace(l[:i])
		}
	}
	return strings.TrimSpace(l)
}

// shellWords splits a line as a shell would (quotes removed, no
// expansion); a quoted word is marked with a leading \x00 so that
// operators inside quotes are not taken for operators.
func shellWords(l string) []string {
	var out []string
	var cur strings.Builder
	have, quoted := false, false
	quote := rune(0)
	flush := func() {
		if have {
			w := cur.String()
			if quoted {
				w = "\x00" + w
			}
			out = append(out, w)
		}
		cur.Reset()
		have, quoted = false, false
	}
	for _, r := range l {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, have, quoted = r, true, true
		case r == ' ' || r == '\t':
			flush()
		case r == ';':
			flush()
			out = append(out, ";")
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	flush()
	return out
}

// splitOperators splits words at && || ; and & and removes redirections.
// A pipe stays a word: whether `A | B` is a pipe or a synopsis's
// alternative is for checkDocCommand to tell.
func splitOperators(words []string) [][]string {
	var out [][]string
	var cur []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "&&" || w == "||" || w == ";" || w == "&":
			out = append(out, cur)
			cur = nil
		case w == ">" || w == ">>" || w == "<" || w == "2>" || w == "&>":
			i++ // and its target
		case strings.HasPrefix(w, "<") && strings.HasSuffix(w, ">"): // a synopsis's <argument>
			cur = append(cur, w)
		case strings.HasPrefix(w, ">") || strings.HasPrefix(w, "2>") || strings.HasPrefix(w, "&>") || strings.HasPrefix(w, "<"):
		default:
			cur = append(cur, w)
		}
	}
	return append(out, cur)
}

var kiboProgram = regexp.MustCompile(`^(.*/)?kibo(tos)?(-next)?$`)

// kiboArgs returns the arguments of a kibo/kibotos command (after sudo
// and VAR=value assignments), and whether the words are one.
func kiboArgs(seg []string) ([]string, bool) {
	for len(seg) > 0 && (seg[0] == "sudo" || (strings.Contains(seg[0], "=") && !strings.HasPrefix(seg[0], "-") && !strings.HasPrefix(seg[0], "\x00"))) {
		seg = seg[1:]
	}
	if len(seg) == 0 || !kiboProgram.MatchString(seg[0]) {
		return nil, false
	}
	return seg[1:], true
}

var placeholderList = regexp.MustCompile(`[A-Z,]\.\.\.$`)

// checkDocCommand checks one command and says what kind it is: example,
// synopsis or mention.
func checkDocCommand(t *testing.T, root *kong.Node, c docCommand) (string, error) {
	args := c.args
	if len(args) > 0 && args[0] == "..." {
		return "mention", nil // `kibo ...`: any command
	}
	// Alternatives at bracket depth 0 (`A | B`), and whether a word is
	// synopsis syntax.
	var alts [][]string
	cur := []string{}
	depth, synopsis := 0, false
	for _, w := range args {
		quoted := strings.HasPrefix(w, "\x00")
		if !quoted {
			depth += strings.Count(w, "[") - strings.Count(w, "]")
			if strings.ContainsAny(w, "[]|") || w == "..." || placeholderList.MatchString(w) || strings.HasPrefix(w, "<") && strings.HasSuffix(w, ">") {
				synopsis = true
			}
			if w == "|" && depth == 0 {
				alts = append(alts, cur)
				cur = []string{}
				continue
			}
		}
		cur = append(cur, w)
	}
	alts = append(alts, cur)
	first := alts[0]
	node, rest := commandPath(root, first)
	if node == root {
		return "example", errorf("names no command")
	}
	// A later alternative is another command beside the first (`get |
	// set NODE`), more flags of it (`--node NODE | --instance ID`), or
	// the next program of a pipe.
	var more [][]string
	for _, a := range alts[1:] {
		if len(a) == 0 {
			continue
		}
		w := strings.Trim(a[0], "[]")
		if strings.HasPrefix(w, "-") {
			more = append(more, a)
			continue
		}
		if sib, _ := commandPath(node.Parent, a); sib != node.Parent {
			more = append(more, a)
			continue
		}
		break // a pipe
	}
	if len(more) > 0 {
		synopsis = true
	}
	if !synopsis && c.inline && len(more) == 0 {
		// Prose naming a command, or a command and flags, without
		// their values: `kibo workspace exec`, `kibotos serve --config`.
		named := true
		for _, w := range rest {
			named = named && strings.HasPrefix(w, "-") && !strings.Contains(w, "=")
		}
		if named {
			return "mention", checkFlags(node, rest)
		}
	}
	if !synopsis {
		var clean []string
		for _, w := range first {
			clean = append(clean, strings.TrimPrefix(w, "\x00"))
		}
		if _, err := docsParser(t).Parse(clean); err != nil {
			return "example", err
		}
		return "example", nil
	}
	if err := checkFlags(node, rest); err != nil {
		return "synopsis", err
	}
	for _, a := range more {
		w := strings.Trim(a[0], "[]")
		if strings.HasPrefix(w, "-") {
			if err := checkFlags(node, a); err != nil {
				return "synopsis", err
			}
			continue
		}
		sib, r := commandPath(node.Parent, a)
		if err := checkFlags(sib, r); err != nil {
			return "synopsis", err
		}
	}
	return "synopsis", nil
}

// commandPath follows the leading command words of args from n.
func commandPath(n *kong.Node, args []string) (*kong.Node, []string) {
	for len(args) > 0 {
		var next *kong.Node
		for _, c := range n.Children {
			if c.Type == kong.CommandNode && c.Name == args[0] {
				next = c
			}
		}
		if next == nil {
			break
		}
		n, args = next, args[1:]
	}
	return n, args
}

// checkFlags checks that every flag a synopsis names is one of n's, of a
// command above it, or of its default subcommand.
func checkFlags(n *kong.Node, words []string) error {
	known := map[string]bool{"--help": true, "-h": true}
	nodes := []*kong.Node{}
	for p := n; p != nil; p = p.Parent {
		nodes = append(nodes, p)
	}
	for d := n.DefaultCmd; d != nil; d = d.DefaultCmd {
		nodes = append(nodes, d) // `kibotos dev --warm ...` runs dev up
	}
	for _, p := range nodes {
		for _, f := range p.Flags {
			known["--"+f.Name] = true
			if f.Short != 0 {
				known["-"+string(f.Short)] = true
			}
			for _, a := range f.Aliases {
				known["--"+a] = true
			}
		}
	}
	for _, w := range words {
		if strings.HasPrefix(w, "\x00") {
			continue
		}
		w = strings.TrimLeft(w, "[(")
		w = strings.TrimRight(w, "])")
		if !strings.HasPrefix(w, "-") || w == "-" || w == "--" {
			continue
		}
		if i := strings.Index(w, "="); i >= 0 {
			w = w[:i]
		}
		if !known[w] {
			return errorf("%s is not a flag of kibo %s", w, n.Path())
		}
	}
	return nil
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// The checker itself: what it must refuse and what it must accept.
func TestDocsCommandsChecker(t *testing.T) {
	md := "Run `kibo workspace exec WS -- true` or `kibo workspace\nbogus`.\n\n" +
		"```sh\n" +
		"$ kibo node list --wide   # fine\n" +
		"kibo node list --bogus\n" +
		"WS=$(bin/kibo workspace create --template t -q) && kibo workspace start \"$WS\" --nod x\n" +
		"kibo workspace logs WS [--instance ID] [--vmm | -f] [--bogus-synopsis N]\n" +
		"kibo workspace start WS [--node NODE] | stop WS [--force] | delete WS [--nope]\n" +
		"kibo workspace create --template t \\\n  --cpu 2 --memry 1GiB\n" +
		"kibo egress update NAME [--socks5 HOST:PORT]\n" +
		"                        [--command-id ID] [--expected-verison V]\n" +
		"kibotos serve --config /nonexistent/kibotos.toml > /dev/null 2>&1\n" +
		"sudo /tmp/kibotos-next check-upgrade --config /etc/k.toml --runtime-dir /x --preview\n" +
		"```\n\n" +
		"```text\nkibotos dev: node dev is READY\n```\n"
	want := map[string]bool{ // args joined → should fail
		"workspace exec WS -- true":                                     false,
		"workspace bogus":                                               true,
		"node list --wide":                                              false,
		"node list --bogus":                                             true,
		"workspace create --template t -q":                              false,
		"workspace start $WS --nod x":                                   true,
		"serve --config /nonexistent/kibotos.toml":                      false,
		"check-upgrade --config /etc/k.toml --runtime-dir /x --preview": false,
	}
	model := docsParser(t).Model.Node
	got := map[string]bool{}
	n := 0
	for _, c := range docCommands(md) {
		n++
		_, err := checkDocCommand(t, model, c)
		key := strings.ReplaceAll(strings.Join(c.args, " "), "\x00", "")
		got[key] = err != nil
		switch {
		case strings.Contains(key, "bogus-synopsis"), strings.Contains(key, "--nope"), strings.Contains(key, "--memry"), strings.Contains(key, "verison"):
			if err == nil {
				t.Errorf("%q passed", key)
			}
		}
	}
	for k, fail := range want {
		if f, ok := got[k]; !ok {
			t.Errorf("%q not found among %v", k, got)
		} else if f != fail {
			t.Errorf("%q: failed %v, want %v", k, f, fail)
		}
	}
	if n != 12 {
		t.Errorf("found %d commands, want 12: %v", n, got)
	}
}
