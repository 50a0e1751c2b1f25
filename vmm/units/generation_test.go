package units

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGenerationUnits(t *testing.T) {
	u := GenerationUnit("kibotos-egress-", "ab12", 7)
	if u != "kibotos-egress-ab12-7.service" {
		t.Fatalf("unit %q", u)
	}
	for name, want := range map[string]uint64{
		u:                                  7,
		"kibotos-egress-ab12-0.service":    0,
		"kibotos-egress-ab123-7.service":   0, // another scope that starts with ab12
		"kibotos-egress-ab12-x.service":    0,
		"kibotos-egress-ab12-7.socket":     0,
		"kibotos-dataplane-ab12-7.service": 0,
	} {
		if got, ok := ParseGenerationUnit("kibotos-egress-", "ab12", name); got != want || ok != (want > 0) {
			t.Errorf("%s: %d %v, want %d", name, got, ok, want)
		}
	}
	path := filepath.Join(t.TempDir(), "generation")
	if g, err := ReadGenerationCounter(path); err != nil || g != 0 {
		t.Fatalf("missing counter: %d %v", g, err)
	}
	if err := WriteGenerationCounter(path, 42); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("counter file %v %v", st, err)
	}
	if g, err := ReadGenerationCounter(path); err != nil || g != 42 {
		t.Fatalf("counter %d %v", g, err)
	}
	os.WriteFile(path, []byte("x\n"), 0o600)
	if _, err := ReadGenerationCounter(path); err == nil || !strings.Contains(err.Error(), "is corrupt") {
		t.Fatalf("corrupt counter: %v", err)
	}
}
