package fsm

import (
	"strconv"

	"github.com/kibotos/kibotos/api"
)

// instanceIDFor is the id of a Workspace's n-th execution.
func instanceIDFor(wsID string, n uint64) string {
	return "inst-" + hashID("instance\x00"+wsID+"\x00"+strconv.FormatUint(n, 10))
}

// LatestInstanceID is the id of the Workspace's latest execution, current
// or ended; "" before its first start.
func LatestInstanceID(w *api.Workspace) string {
	if w.Instances == 0 {
		return ""
	}
	return instanceIDFor(w.WorkspaceID, w.Instances)
}

// IsInstanceOf reports whether id is one of the Workspace's executions.
// Ids are derived, not stored, so this recomputes them (a sha256 each).
func IsInstanceOf(w *api.Workspace, id string) bool {
	for n := w.Instances; n > 0; n-- {
		if instanceIDFor(w.WorkspaceID, n) == id {
			return true
		}
	}
	return false
}
