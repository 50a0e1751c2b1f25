package cli

import (
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// kibotos dev --e2b-template builds the E2B-style template the
// documentation's one command builds, and serves it as E2B's base.
func TestDevE2BTemplateIsTheDocumented(t *testing.T) {
	raw, err := os.ReadFile("../docs/operating/templates-and-platforms.md")
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "kibo template build e2b-base ") {
			line = l
		}
	}
	if line == "" {
		t.Fatal("templates-and-platforms.md has no kibo template build e2b-base command")
	}
	var root CLI
	p, err := newKong(&root, kong.Name("kibo"), kong.Exit(func(int) {}), kong.Writers(io.Discard, io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse(strings.Fields(line)[1:]); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	doc := root.Template.Build
	dev := e2bTemplate("/storage", "e2b-base")
	if !doc.Debootstrap || !slices.Equal(doc.Include, dev.Include) || doc.User != dev.User.Name || doc.Sudo != dev.User.Sudo || doc.Suite != dev.Suite || doc.Variant != dev.Variant {
		t.Errorf("the documented command %q builds --include %v --user %q --sudo %v; kibotos dev --e2b-template: %+v", line, doc.Include, doc.User, doc.Sudo, dev)
	}
	c := DevUpCmd{E2BListen: devE2BListen, E2BTemplate: "e2b-base"}
	if got := c.e2b().BaseTemplate; got != "e2b-base" {
		t.Errorf("kibotos dev --e2b-template e2b-base serves E2B's base as %q", got)
	}
}
