package cli

import (
	"fmt"
	"time"

	"github.com/kibotos/kibotos/api"
)

// defaultWait is how long a command waits for its result by default.
const defaultWait = 10 * time.Minute

// WaitFlags is the --timeout of the commands that wait for their result.
// It is not global: workspace create's --timeout is the Workspace's
// lifetime.
type WaitFlags struct {
	Timeout time.Duration `name:"timeout" default:"10m" help:"How long to wait for the result before giving up (exit 16); what was asked goes on in the background."`
}

// AfterApply hands the flag to the wait loops (Globals.Timeout).
func (w *WaitFlags) AfterApply(g *Globals) error {
	g.Timeout = w.Timeout
	return nil
}

// printWorkspaceResult prints the outcome of a write: the ID with -q, the
// API answer with --json, else one line.
func printWorkspaceResult(g *Globals, raw []byte, ws *api.Workspace, quiet bool, verb string) error {
	switch {
	case quiet:
		g.printf("%s\n", ws.WorkspaceID)
	case g.JSON && raw != nil:
		return g.printJSON(raw)
	case g.JSON:
		return printResult(g, ws)
	default:
		where := ""
		if ws.NodeID != "" {
			where = " on node " + ws.NodeID
		}
		g.printf("workspace %s %s: %s%s (version %d)\n", ws.WorkspaceID, verb, ws.State, where, ws.Version)
	}
	return nil
}

// waitWorkspace polls until the Workspace is in want (or gone when want
// is ""), fails on FAILED, and gives up after --timeout (exit 16).
func waitWorkspace(g *Globals, id, want string) (*api.Workspace, error) {
	if want == api.WorkspaceAvailable {
		// A start may first fetch the template or Platform, or the
		// archive it imports: a bar on a terminal while it does.
		stop := g.following("workspace "+id, "", workspacePath(id, "progress"))
		defer stop()
	}
	return pollWorkspace(g, id, func(ws *api.Workspace) (bool, error) {
		switch {
		case ws == nil:
			return want == "", nil
		case ws.State == want:
			return true, nil
		case ws.State == api.WorkspaceFailed:
			return false, failedError(ws)
		}
		return false, nil
	})
}

// failedError is exit 13 with why the Workspace is FAILED; 15
// (resource_exhausted) when the nodes refused to start it and no other
// has room, as for a create or start ctrl can place nowhere.
func failedError(ws *api.Workspace) error {
	msg := "workspace " + ws.WorkspaceID + " is FAILED"
	f := ws.Failure
	if f == nil {
		return exitError{api.ExitFailedPrecondition, msg}
	}
	if f.Reason == api.FailureResourceExhausted {
		return exitError{api.ExitResourceExhausted, "workspace " + ws.WorkspaceID + " has no node to run on (FAILED, " + f.Reason + "): " + f.Message}
	}
	return exitError{api.ExitFailedPrecondition, msg + " (" + f.Reason + "): " + f.Message}
}

// pollWorkspace reads the Workspace until settled says it is done (ws is
// nil once it no longer exists) or fails, and gives up after --timeout
// (exit 16).
func pollWorkspace(g *Globals, id string, settled func(ws *api.Workspace) (bool, error)) (*api.Workspace, error) {
	return pollObject(g, workspacePath(id), func(ws *api.Workspace) uint64 { return ws.Version }, settled, func(ws *api.Workspace) error {
		still := ws.State
		if p := ws.Pending; p != nil && p.Kind == api.WSCmdNetwork {
			still += " with its network change pending on node " + p.NodeID
		}
		return exitError{api.ExitTimedOut, fmt.Sprintf("workspace %s is still %s after %s; it goes on in the background: check with kibo workspace get %s", id, still, g.Timeout, id)}
	})
}

// pollObject reads the object at path until settled says it is done (nil
// once it no longer exists) or fails, and gives up after --timeout with
// timedOut's error. Reads block on the member until the version passes
// the one seen, so a change is seen the moment the member applies it.
func pollObject[T any](g *Globals, path string, version func(*T) uint64, settled func(*T) (bool, error), timedOut func(*T) error) (*T, error) {
	deadline := time.Now().Add(g.Timeout)
	var seen uint64
	for {
		var obj T
		wait := min(time.Until(deadline), 30*time.Second).Round(time.Millisecond)
		get := fmt.Sprintf("%s?wait_version=%d&wait=%s", path, seen, max(wait, 0))
		if seen == 0 {
			get = path
		}
		_, err := g.call("GET", get, nil, &obj)
		if api.CodeOf(err) == api.CodeNotFound {
			// Only the leader may say it is gone: a member that just
			// restarted and has not replayed the log yet knows nothing
			// of an object it was asked to wait for.
			obj = *new(T)
			err = g.getConsistent(path, &obj)
		}
		cur := &obj
		if api.CodeOf(err) == api.CodeNotFound {
			cur = nil
		} else if err != nil {
			return nil, err
		}
		done, serr := settled(cur)
		switch {
		case serr != nil:
			return nil, serr
		case done:
			return cur, nil
		case cur == nil:
			return nil, err // gone, and the caller waited for something else
		}
		if !time.Now().Before(deadline) {
			return nil, timedOut(cur)
		}
		if g.ctx.Err() != nil {
			return nil, g.ctx.Err()
		}
		seen = version(cur)
	}
}
