package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// TestMain lets the test binary stand in for kibo when a shell's
// completion script runs it (KIBO_TEST_AS_CLI=1).
func TestMain(m *testing.M) {
	privsd.RunIfInit()
	if os.Getenv("KIBO_TEST_AS_CLI") == "1" {
		os.Exit(Main(context.Background(), "kibo", os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func completions(t *testing.T, words ...string) string {
	t.Helper()
	var out bytes.Buffer
	if code := Main(context.Background(), "kibo", append([]string{completeCommand, "--"}, words...), nil, &out, &out); code != 0 {
		t.Fatalf("complete %q: exit %d: %s", words, code, out.String())
	}
	return strings.Join(strings.Fields(out.String()), " ")
}

// Completion walks the binary's own kong tree: verbs, flags of the verb
// and its parents, enum values of a flag or argument; hidden commands and
// flags are never offered; after -- nothing is.
func TestCompletionCandidates(t *testing.T) {
	for _, c := range []struct {
		words []string
		want  string
	}{
		{[]string{"wor"}, "workspace"},
		{[]string{"workspace", "s"}, "set-network set-timeout start stop"},
		{[]string{"storage-pool", ""}, "declare-lost get list set-capacity"},
		{[]string{"workspace", "create", "--eg"}, "--egress"},
		{[]string{"--data-dir", "/tmp/x", "node", "dr"}, "drain"},
		{[]string{"serve", "--log-format", ""}, "json text"},
		{[]string{"serve", "--log-format=json", "--sys"}, "--systemd"},
		{[]string{"completion", ""}, "bash fish zsh"},
		{[]string{"workspace", "exec", "WS", "--", "ls", "-"}, ""},
		{[]string{"g"}, ""}, // guest-agent is hidden
		{[]string{"workspace", "create", "--template", "kibotos-coding", "--"}, ""},
	} {
		got := completions(t, c.words...)
		if c.words[len(c.words)-1] == "--" {
			// "--" being typed is a flag prefix: every flag of the verb.
			if !strings.Contains(got, "--template") || !strings.Contains(got, "--data-dir") || strings.Contains(got, "--test-timings") {
				t.Errorf("complete %q: %q", c.words, got)
			}
			continue
		}
		if got != c.want {
			t.Errorf("complete %q: %q, want %q", c.words, got, c.want)
		}
	}
}

// The scripts, run by the real shells against the binary: bash and fish
// complete for real, zsh checks and loads its script under compinit.
func TestCompletionScripts(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(exe, filepath.Join(bin, "kibo")); err != nil {
		t.Fatal(err)
	}
	script := func(shell string) string {
		var out bytes.Buffer
		if code := Main(context.Background(), "kibo", []string{"completion", shell}, nil, &out, &out); code != 0 {
			t.Fatalf("completion %s: exit %d: %s", shell, code, out.String())
		}
		path := filepath.Join(t.TempDir(), "kibo."+shell)
		os.WriteFile(path, out.Bytes(), 0o644)
		return path
	}
	run := func(shell string, args ...string) string {
		t.Helper()
		cmd := exec.Command(shell, args...)
		cmd.Env = append(os.Environ(), "KIBO_TEST_AS_CLI=1", "PATH="+bin+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %q: %v: %s", shell, args, err, out)
		}
		return strings.Join(strings.Fields(string(out)), " ")
	}
	bash := script("bash")
	got := run("bash", "-c", `source `+bash+`; COMP_WORDS=(kibo workspace st); COMP_CWORD=2; _kibo_complete; printf '%s\n' "${COMPREPLY[@]}"`)
	if got != "start stop" {
		t.Errorf("bash completion of kibo workspace st: %q", got)
	}
	got = run("bash", "-c", `source `+bash+`; COMP_WORDS=(kibo serve --log-format ""); COMP_CWORD=3; _kibo_complete; printf '%s\n' "${COMPREPLY[@]}"`)
	if got != "json text" {
		t.Errorf("bash completion of kibo serve --log-format: %q", got)
	}
	fish := testenv.LookPath(t, "fish", "fish")
	if got := run(fish, "-c", "source "+script("fish")+`; complete -C "kibo workspace st"`); got != "start stop" {
		t.Errorf("fish completion of kibo workspace st: %q", got)
	}
	zsh := testenv.LookPath(t, "zsh", "zsh")
	z := script("zsh")
	run(zsh, "-n", z)
	if got := run(zsh, "-c", "autoload -U compinit && compinit -u && source "+z+" && print -r -- ${_comps[kibo]}"); got != "_kibo" {
		t.Errorf("zsh: kibo's completion function after loading the script: %q", got)
	}
}
