package dataplane

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"

	"github.com/kibotos/kibotos/agent/generations"
	"github.com/kibotos/kibotos/vmm/units"
)

// Unit naming: kibotos-dataplane-<scope>-<generation>.service.
const unitPrefix = "kibotos-dataplane-"

// UnitName is the unit of generation gen of scope.
func UnitName(scope string, gen uint64) string { return units.GenerationUnit(unitPrefix, scope, gen) }

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

// newSeries is the generations of cfg's data plane. The counter of an
// earlier socket directory still counts: its numbers are never handed out
// again.
func newSeries(cfg SupervisorConfig) *generations.Series {
	s := &generations.Series{Units: cfg.Units, Prefix: unitPrefix, Scope: cfg.Scope, Counter: generationFile(cfg.SocketDir),
		Who: "dataplane", StopTimeout: stopWait}
	for _, dir := range cfg.EarlierSocketDirs {
		s.EarlierCounters = append(s.EarlierCounters, generationFile(dir))
	}
	return s
}
