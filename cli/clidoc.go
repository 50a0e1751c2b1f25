package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/alecthomas/kong"
)

// cliReference renders docs/reference/cli.md from the kong model: every
// visible command with its help, positional arguments, flags (help,
// default, environment variable, allowed values) and the examples of
// cli/examples.go. TestCLIReferenceUpToDate keeps the file equal to it.
func cliReference() (string, error) {
	var root CLI
	p, err := newKong(&root,
		kong.Name("kibo"),
		kong.Description("Kibotos runs isolated micro-VM Workspaces on a fleet of Linux hosts."),
		kong.Exit(func(int) {}),
		kong.Writers(io.Discard, io.Discard),
	)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }

	w("# CLI reference\n\n")
	w("Generated from the CLI's command tree (`cli/clidoc.go`); do not edit by\n")
	w("hand. After changing a command, run\n")
	w("`go test ./cli -run TestCLIReferenceUpToDate -update`.\n\n")
	w("The binary is `kibotos`; invoked as `kibo` (a symlink) it behaves exactly\n")
	w("the same, so every command below runs as `kibo ...` or `kibotos ...`.\n")
	w("Every command's `--help` shows the same text and ends with its examples.\n\n")

	w("## Global flags\n\n")
	w("Every command takes these.\n\n")
	writeFlags(&b, visibleFlags(p.Model.Node.Flags))

	var cmds []*kong.Node
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, c := range n.Children {
			if c.Hidden || c.Type != kong.CommandNode {
				continue
			}
			cmds = append(cmds, c)
			walk(c)
		}
	}
	walk(p.Model.Node)

	w("## Commands\n\n")
	for _, c := range cmds {
		w("%s- [kibo %s](#%s): %s\n", strings.Repeat("  ", c.Depth()), c.Path(), anchor("kibo "+c.Path()), firstSentence(c.Help))
	}
	w("\n")

	for _, c := range cmds {
		w("## kibo %s\n\n", c.Path())
		w("%s\n\n", ensurePeriod(c.Help))
		if c.Detail != "" {
			w("%s\n\n", c.Detail)
		}
		w("```\n%s\n```\n\n", synopsis(c))
		if !c.Leaf() {
			w("Subcommands:\n\n")
			for _, s := range c.Children {
				if s.Hidden || s.Type != kong.CommandNode {
					continue
				}
				def := ""
				if c.DefaultCmd == s {
					def = " (the default)"
				}
				w("- [kibo %s](#%s)%s: %s\n", s.Path(), anchor("kibo "+s.Path()), def, firstSentence(s.Help))
			}
			w("\n")
		}
		if len(c.Positional) > 0 {
			w("Arguments:\n\n")
			w("| argument | help |\n| --- | --- |\n")
			for _, a := range c.Positional {
				w("| `%s` | %s |\n", a.Summary(), cell(valueHelp(a)))
			}
			w("\n")
		}
		// Flags of the command and of the commands above it (the global
		// flags are listed once, at the top).
		var flags []*kong.Flag
		for n := c; n != nil && n.Type == kong.CommandNode; n = n.Parent {
			flags = append(visibleFlags(n.Flags), flags...)
		}
		if len(flags) > 0 {
			w("Flags:\n\n")
			writeFlags(&b, flags)
		}
		if exs := examples[c.Path()]; len(exs) > 0 {
			w("Examples:\n\n```sh\n")
			for _, e := range exs {
				w("%s\n", e)
			}
			w("```\n\n")
		}
	}
	return strings.TrimRight(b.String(), "\n") + "\n", nil
}

func visibleFlags(fs []*kong.Flag) []*kong.Flag {
	var out []*kong.Flag
	for _, f := range fs {
		if !f.Hidden {
			out = append(out, f)
		}
	}
	return out
}

func writeFlags(b *strings.Builder, flags []*kong.Flag) {
	b.WriteString("| flag | default | help |\n| --- | --- | --- |\n")
	for _, f := range flags {
		name := "--" + f.Name
		if f.Short != 0 {
			name = fmt.Sprintf("-%c, %s", f.Short, name)
		}
		if !f.IsBool() && !f.IsCounter() {
			name += "=" + placeholder(f)
		}
		def := ""
		if f.HasDefault && !(f.IsBool() && f.Default == "false") {
			def = "`" + f.Default + "`"
		}
		help := valueHelp(f.Value)
		if len(f.Envs) > 0 {
			help += " Environment: `" + strings.Join(f.Envs, "`, `") + "`."
		}
		if f.Required {
			help += " Required."
		}
		fmt.Fprintf(b, "| `%s` | %s | %s |\n", cell(name), def, cell(help))
	}
	b.WriteString("\n")
}

// placeholder names a flag's value: its placeholder tag, else its name in
// capitals (the default has a column of its own).
func placeholder(f *kong.Flag) string {
	ph := f.PlaceHolder
	if ph == "" {
		ph = strings.ToUpper(f.Name)
		if f.IsMap() {
			ph = "KEY=VALUE"
		}
	}
	if f.IsSlice() && f.Tag.Sep != -1 && f.Tag.Type == "" && !strings.HasSuffix(ph, "...") {
		ph += string(f.Tag.Sep) + "..."
	}
	return ph
}

// valueHelp is a flag's or argument's help, with its allowed values when
// the help does not name them all.
func valueHelp(v *kong.Value) string {
	help := ensurePeriod(strings.TrimSpace(v.Help))
	if v.Enum != "" {
		all := true
		for _, e := range v.EnumSlice() {
			all = all && strings.Contains(help, e)
		}
		if !all {
			help += " One of: " + strings.Join(v.EnumSlice(), ", ") + "."
		}
	}
	if v.IsCumulative() && v.Flag != nil && !strings.Contains(strings.ToLower(help), "repeat") {
		help += " Repeatable."
	}
	return strings.TrimSpace(help)
}

// synopsis is the command's usage line: path, arguments, [flags].
func synopsis(n *kong.Node) string {
	s := "kibo " + n.Path()
	for _, a := range n.Positional {
		s += " " + a.Summary()
	}
	if !n.Leaf() {
		s += " <command>"
	}
	for p := n; p != nil && p.Type == kong.CommandNode; p = p.Parent {
		for _, f := range p.Flags {
			if f.Required && !f.Hidden {
				s += " --" + f.Name
				if !f.IsBool() {
					s += "=" + placeholder(f)
				}
			}
		}
	}
	if n.Leaf() {
		s += " [flags]"
	}
	return s
}

// anchor is GitHub's anchor of a heading made of plain words.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ' || r == '-':
			b.WriteRune('-')
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		}
	}
	return b.String()
}

func firstSentence(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i+1]
	}
	return ensurePeriod(s)
}

func ensurePeriod(s string) string {
	s = strings.TrimSpace(s)
	if s == "" || strings.HasSuffix(s, ".") || strings.HasSuffix(s, ")") && strings.HasSuffix(strings.TrimSuffix(s, ")"), ".") {
		return s
	}
	return s + "."
}

// cell makes text safe inside a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.ReplaceAll(s, "|", `\|`)
}
