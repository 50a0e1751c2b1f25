package units

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/storagepool"
)

// A process the node replaces generation by generation (the data plane,
// the egress process) runs as the unit <prefix><scope>-<generation>.service,
// numbered by a counter file that never hands out a number twice.

// GenerationUnit is the unit of generation gen of scope.
func GenerationUnit(prefix, scope string, gen uint64) string {
	return prefix + scope + "-" + strconv.FormatUint(gen, 10) + ".service"
}

// GenerationPattern lists every generation of scope (and, harmlessly, of
// scopes that start with it: ParseGenerationUnit tells them apart).
func GenerationPattern(prefix, scope string) string { return prefix + scope + "-*.service" }

// ParseGenerationUnit is the generation of a unit name of scope; ok is
// false for other units (including those of a scope that merely starts
// with this one).
func ParseGenerationUnit(prefix, scope, name string) (gen uint64, ok bool) {
	rest, ok := strings.CutPrefix(name, prefix+scope+"-")
	if !ok {
		return 0, false
	}
	rest, ok = strings.CutSuffix(rest, ".service")
	if !ok || rest == "" {
		return 0, false
	}
	gen, err := strconv.ParseUint(rest, 10, 64)
	return gen, err == nil && gen > 0
}

// ReadGenerationCounter reads a counter file; a missing one is 0.
func ReadGenerationCounter(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read generation counter: %w", err)
	}
	gen, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("generation counter %s is corrupt (%q): remove it, the next start counts from the running units", path, b)
	}
	return gen, nil
}

// WriteGenerationCounter records gen (0600) atomically and durably, before
// its unit starts: a node that crashes right after never reuses the number.
func WriteGenerationCounter(path string, gen uint64) error {
	if err := storagepool.WriteFile(path, []byte(strconv.FormatUint(gen, 10)+"\n"), 0o600, storagepool.Temp{Purpose: "generation"}); err != nil {
		return fmt.Errorf("write generation counter: %w", err)
	}
	return nil
}
