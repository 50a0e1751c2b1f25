package dataplane

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Unit naming: kibotos-dataplane-<scope>-<generation>.service.
const unitPrefix = "kibotos-dataplane-"

// UnitName is the unit of generation gen of scope.
func UnitName(scope string, gen uint64) string {
	return unitPrefix + scope + "-" + strconv.FormatUint(gen, 10) + ".service"
}

// unitGeneration parses a unit name of scope; ok is false for other units
// (including those of a scope that merely starts with this one).
func unitGeneration(scope, name string) (uint64, bool) {
	rest, ok := strings.CutPrefix(name, unitPrefix+scope+"-")
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
	b, err := os.ReadFile(generationFile(socketDir))
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("dataplane: read generation counter: %w", err)
	}
	gen, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("dataplane: generation counter %s is corrupt (%q): remove it, the next start counts from the running units", generationFile(socketDir), b)
	}
	return gen, nil
}

// writeGeneration records gen atomically (temp file, then rename).
func writeGeneration(socketDir string, gen uint64) error {
	if err := os.MkdirAll(socketDir, 0o700); err != nil {
		return fmt.Errorf("dataplane: socket directory %s: %w", socketDir, err)
	}
	path := generationFile(socketDir)
	tmp := path + "." + strconv.Itoa(os.Getpid()) + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatUint(gen, 10)+"\n"), 0o600); err != nil {
		return fmt.Errorf("dataplane: write generation counter: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("dataplane: write generation counter: %w", err)
	}
	return nil
}
