package cli

import (
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
)

// A Workspace the waits of create, start and resume find FAILED exits
// 13 with its reason, except one the nodes refused to start with no other
// node to take it: resource_exhausted (15), as when ctrl places it
// nowhere itself (docs/reference/exit-codes.md).
func TestFailedError(t *testing.T) {
	refused := "node node-a refused to start it (host memory is tight) and no other node can take it: no admitted node is ready with room; nothing of it runs: kibo workspace start ws-1 places it again, or delete it"
	for _, tc := range []struct {
		failure *api.WorkspaceFailure
		code    int
		msg     string
	}{
		{&api.WorkspaceFailure{Reason: api.FailureResourceExhausted, Message: refused}, api.ExitResourceExhausted,
			"workspace ws-1 has no node to run on (FAILED, RESOURCE_EXHAUSTED): " + refused},
		{&api.WorkspaceFailure{Reason: api.FailureStart, Message: "kernel panic"}, api.ExitFailedPrecondition,
			"workspace ws-1 is FAILED (START_FAILED): kernel panic"},
		{nil, api.ExitFailedPrecondition, "workspace ws-1 is FAILED"},
	} {
		err := failedError(&api.Workspace{WorkspaceID: "ws-1", State: api.WorkspaceFailed, Failure: tc.failure})
		e, ok := err.(exitError)
		if !ok || e.code != tc.code || e.msg != tc.msg || strings.Contains(e.msg, "\n") {
			t.Errorf("failure %+v: %#v, want exit %d %q", tc.failure, err, tc.code, tc.msg)
		}
	}
}
