package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/recordfmt"
)

// incarnationRange is the formats of the incarnation record this build
// reads: 0 is the bare number builds before format versions wrote (read,
// and written back as 1), 1 is {"format_version":1,"incarnation":N}.
var incarnationRange = recordfmt.Range{Min: 0, Max: 1}

type incarnationRecord struct {
	FormatVersion int    `json:"format_version"`
	Incarnation   uint64 `json:"incarnation"`
}

// nextIncarnation increments and persists the node's incarnation: every
// start of the node process is a new incarnation, so ctrl can tell a
// restarted node from an old process that comes back (isolate relies on it).
func nextIncarnation(dir string) (uint64, error) {
	path := filepath.Join(dir, "incarnation")
	var cur uint64
	raw, err := os.ReadFile(path)
	switch {
	case err == nil:
		if cur, err = readIncarnation(path, raw); err != nil {
			return 0, err
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return 0, fmt.Errorf("incarnation record %s: %w", path, err)
	}
	b, _ := json.Marshal(incarnationRecord{FormatVersion: incarnationRange.Max, Incarnation: cur + 1})
	if err := datadir.WriteFileAtomic(path, append(b, '\n'), 0o600); err != nil {
		return 0, fmt.Errorf("incarnation record %s: %w", path, err)
	}
	return cur + 1, nil
}

func readIncarnation(path string, raw []byte) (uint64, error) {
	text := strings.TrimSpace(string(raw))
	if n, err := strconv.ParseUint(text, 10, 64); err == nil {
		return n, nil // format 0
	}
	if !strings.HasPrefix(text, "{") {
		return 0, fmt.Errorf("incarnation record %s is corrupt (%q): it must hold a number or its JSON record", path, raw)
	}
	if err := incarnationRange.CheckJSON(path, raw, 0); err != nil {
		return 0, fmt.Errorf("incarnation record %w", err)
	}
	var r incarnationRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return 0, fmt.Errorf("incarnation record %s is corrupt: %w", path, err)
	}
	return r.Incarnation, nil
}

// CheckNodeRecords reads the records the node agent keeps, refusing any
// of a format this build does not read (check-upgrade): the incarnation
// record and volume-commands.json. Absent ones are fine.
func CheckNodeRecords(d datadir.Dir) []error {
	var errs []error
	path := filepath.Join(d.NodeDir(), "incarnation")
	if raw, err := os.ReadFile(path); err == nil {
		if _, err := readIncarnation(path, raw); err != nil {
			errs = append(errs, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("incarnation record %s: %w", path, err))
	}
	if _, err := openCommandLog(d.StorageRoot()); err != nil {
		errs = append(errs, err)
	}
	return errs
}
