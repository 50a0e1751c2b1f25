package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/alecthomas/kong"
)

// Shell completion. The shells' scripts are thin: each asks the binary
// itself (`kibo __complete -- WORDS...`) for the candidates of the word
// being typed, so completion follows the kong tree of the binary that is
// installed, verbs, flags and enum values alike, without a second copy of
// the grammar in shell.

// completeCommand is the hidden first argument the scripts call.
const completeCommand = "__complete"

// CompletionCmd prints a shell's completion script.
type CompletionCmd struct {
	Shell string `arg:"" enum:"bash,zsh,fish" help:"bash, zsh or fish."`
}

func (c *CompletionCmd) Run(g *Globals) error {
	script, ok := completionScripts[c.Shell]
	if !ok {
		return usagef("no completion for shell %q: use bash, zsh or fish", c.Shell)
	}
	_, err := io.WriteString(g.stdout, script)
	return err
}

var completionScripts = map[string]string{
	// bash: words after the command, the current one last (may be "").
	"bash": `# kibo/kibotos completion for bash: source it, or install it as
# /usr/share/bash-completion/completions/kibo (and kibotos).
_kibo_complete() {
	local IFS=$'\n'
	COMPREPLY=($("${COMP_WORDS[0]}" ` + completeCommand + ` -- "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -F _kibo_complete kibo kibotos
`,
	"zsh": `#compdef kibo kibotos
# kibo/kibotos completion for zsh: put it on $fpath as _kibo.
_kibo() {
	local -a candidates
	candidates=("${(@f)$("${words[1]}" ` + completeCommand + ` -- "${(@)words[2,CURRENT]}" 2>/dev/null)}")
	(( ${#candidates} )) && [[ -n ${candidates[1]} ]] && compadd -a candidates
}
compdef _kibo kibo kibotos
`,
	"fish": `# kibo/kibotos completion for fish: put it in ~/.config/fish/completions/kibo.fish.
function __kibo_complete
	set -l words (commandline -opc) (commandline -ct)
	$words[1] ` + completeCommand + ` -- $words[2..-1] 2>/dev/null
end
complete -c kibo -f -a '(__kibo_complete)'
complete -c kibotos -f -a '(__kibo_complete)'
`,
}

// complete writes the candidates for the last of words (the word being
// typed, "" for a new one), given the words before it, one per line.
func complete(app *kong.Application, words []string, w io.Writer) {
	if len(words) == 0 {
		words = []string{""}
	}
	node := app.Node
	typed, before := words[len(words)-1], words[:len(words)-1]
	var pending *kong.Flag // a flag whose value is the next word
	args := 0              // positional arguments of node so far
	for _, word := range before {
		switch {
		case pending != nil:
			pending = nil
		case word == "--":
			return // past it everything is arguments (workspace exec)
		case strings.HasPrefix(word, "-"):
			if f := findFlag(node, word); f != nil && !f.IsBool() && !f.IsCounter() && !strings.Contains(word, "=") {
				pending = f
			}
		default:
			if child := findChild(node, word); child != nil {
				node, args = child, 0
			} else {
				args++
			}
		}
	}
	var out []string
	switch {
	case pending != nil:
		out = pending.EnumSlice()
		if pending.Enum == "" {
			out = nil
		}
	case strings.HasPrefix(typed, "-"):
		for n := node; n != nil; n = n.Parent {
			for _, f := range n.Flags {
				if !f.Hidden {
					out = append(out, "--"+f.Name)
				}
			}
		}
	case len(node.Children) > 0:
		for _, c := range node.Children {
			if !c.Hidden && c.Type == kong.CommandNode {
				out = append(out, c.Name)
			}
		}
	case args < len(node.Positional) && node.Positional[args].Enum != "":
		out = node.Positional[args].EnumSlice()
	}
	sort.Strings(out)
	for _, c := range out {
		if strings.HasPrefix(c, typed) {
			fmt.Fprintln(w, c)
		}
	}
}

// findFlag is the flag word names (--name, --name=value or -x) on node or
// an ancestor.
func findFlag(node *kong.Node, word string) *kong.Flag {
	name, _, _ := strings.Cut(strings.TrimLeft(word, "-"), "=")
	short := !strings.HasPrefix(word, "--") && len(name) == 1
	for n := node; n != nil; n = n.Parent {
		for _, f := range n.Flags {
			if (!short && f.Name == name) || (short && f.Short == rune(name[0])) {
				return f
			}
		}
	}
	return nil
}

func findChild(node *kong.Node, word string) *kong.Node {
	for _, c := range node.Children {
		if c.Name == word {
			return c
		}
		for _, a := range c.Aliases {
			if a == word {
				return c
			}
		}
	}
	return nil
}
