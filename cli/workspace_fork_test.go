package cli

import (
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// create --from: flags a snapshot cannot be restored with are usage
// errors; below LevelForks the leader refuses it before the log (an
// older voter would ignore From and boot a new Workspace); a source that
// is not PAUSED is refused naming its state; each exit code as the table
// says.
func TestWorkspaceCreateFrom(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 2, FeatureLevels: map[string]int{"node-2": 5}})
	e.expectExit(api.ExitUsage, "--template is required (or --from WORKSPACE", "workspace", "create")
	e.expectExit(api.ExitUsage, "--cpu or --memory with --from", "workspace", "create", "--from", "ws-x", "--cpu", "2")
	e.expectExit(api.ExitUsage, "--template with --from", "workspace", "create", "--from", "ws-x", "--template", "kibotos-coding")
	e.expectExit(api.ExitUsage, "--volume or --new-volume with --from", "workspace", "create", "--from", "ws-x", "--new-volume", "1GiB:/x")
	e.expectExit(api.ExitFailedPrecondition, "workspace create --from needs every ctrl voter at feature level 6, and voter node-2", "workspace", "create", "--from", "ws-x")

	e = newCLIEnv(t, clustertest.Options{Ctrl: 1})
	e.expectExit(api.ExitNotFound, "workspace ws-nope does not exist", "workspace", "create", "--from", "ws-nope")
}
