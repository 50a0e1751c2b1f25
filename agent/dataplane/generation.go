package dataplane

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kibotos/kibotos/vmm/units"
)

// Unit naming: kibotos-dataplane-<scope>-<generation>.service.
const unitPrefix = "kibotos-dataplane-"

// UnitName is the unit of generation gen of scope.
func UnitName(scope string, gen uint64) string { return units.GenerationUnit(unitPrefix, scope, gen) }

// unitGeneration parses a unit name of scope; ok is false for other units.
func unitGeneration(scope, name string) (uint64, bool) {
	return units.ParseGenerationUnit(unitPrefix, scope, name)
}

// ScopeFor is the scope of a node whose runtime (socket) directory is dir:
// two nodes on one host have different directories, hence different units.
func ScopeFor(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = filepath.Clean(dir)
	}
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:6])
}

// The generation counter lives next to the control sockets. The socket
// directory is usually on /run, which a reboot empties together with every
// unit, so numbering from 1 again then cannot collide with a running unit;
// next also never goes below what systemd still lists.
func generationFile(socketDir string) string { return filepath.Join(socketDir, "generation") }

func readGeneration(socketDir string) (uint64, error) {
	gen, err := units.ReadGenerationCounter(generationFile(socketDir))
	if err != nil {
		return 0, fmt.Errorf("dataplane: %w", err)
	}
	return gen, nil
}

// writeGeneration records gen atomically (temp file, then rename).
func writeGeneration(socketDir string, gen uint64) error {
	if err := os.MkdirAll(socketDir, 0o700); err != nil {
		return fmt.Errorf("dataplane: socket directory %s: %w", socketDir, err)
	}
	if err := units.WriteGenerationCounter(generationFile(socketDir), gen); err != nil {
		return fmt.Errorf("dataplane: %w", err)
	}
	return nil
}
