package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/datadir"
)

// nextIncarnation increments and persists the node's incarnation: every
// start of the node process is a new incarnation, so ctrl can tell a
// restarted node from an old process that comes back (isolate relies on it).
func nextIncarnation(dir string) (uint64, error) {
	path := filepath.Join(dir, "incarnation")
	var cur uint64
	raw, err := os.ReadFile(path)
	switch {
	case err == nil:
		cur, err = strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("incarnation record %s is corrupt (%q); it must hold one number", path, raw)
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return 0, fmt.Errorf("incarnation record %s: %w", path, err)
	}
	next := cur + 1
	if err := datadir.WriteFileAtomic(path, []byte(strconv.FormatUint(next, 10)+"\n"), 0o600); err != nil {
		return 0, fmt.Errorf("incarnation record %s: %w", path, err)
	}
	return next, nil
}
