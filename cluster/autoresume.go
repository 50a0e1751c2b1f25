package cluster

import (
	"net/http"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// resumeWait bounds how long a credential request waits for a Workspace
// it resumed: a restore takes well under a second, a placement that
// waits for a node's answer seconds, and a member that forwarded the
// request to the leader gives up after a minute (resetMemberConns).
const resumeWait = 45 * time.Second

// resumeOnConnect resumes ws, a PAUSED Workspace with auto-resume, for a
// data-plane credential (as its caller: the resume is theirs) and waits
// until it is AVAILABLE again. A Workspace already resuming is waited
// for; one that is neither is returned as it is, for the caller's refusal.
func (s *Server) resumeOnConnect(r *http.Request, ws *api.Workspace) (*api.Workspace, *api.Node, error) {
	id := ws.WorkspaceID
	start := time.Now()
	if ws.State == api.WorkspacePaused {
		res, err := s.applyWrite(r, fsm.OpWorkspaceStart, api.WriteMeta{}, fsm.WorkspaceArgs{WorkspaceID: id})
		if err != nil {
			return nil, nil, err
		}
		s.sessions.kick(commandNodes(res.Value))
	} else if ws.State != api.WorkspaceStarting || ws.Snapshot == nil {
		return ws, nil, nil
	}
	deadline := time.NewTimer(resumeWait)
	defer deadline.Stop()
	for {
		changed := s.changed.next() // before the read: no change is missed
		var node *api.Node
		err := s.fsm.View(func(tx *bolt.Tx) (err error) {
			if ws, err = fsm.GetWorkspace(tx, id); err != nil || ws.NodeID == "" {
				return err
			}
			node, err = fsm.GetNode(tx, ws.NodeID)
			return err
		})
		switch {
		case err != nil:
			return nil, nil, err
		case ws.State == api.WorkspaceAvailable:
			s.log.Info("workspace resumed on connect", "workspace_id", id, "node_id", ws.NodeID, "took", time.Since(start).Round(time.Millisecond))
			return ws, node, nil
		case ws.State == api.WorkspacePaused && ws.LastError != nil:
			return nil, nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s was not resumed for the connection and stays PAUSED: %s", id, ws.LastError.Message)
		case ws.State != api.WorkspaceStarting:
			return ws, node, nil // FAILED, or stopped meanwhile: the caller says why
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil, nil, api.Errorf(api.CodeUnavailable, "workspace %s is still resuming for the connection after %s: retry, or check kibo workspace get %s", id, resumeWait, id)
		case <-r.Context().Done():
			return nil, nil, api.Errorf(api.CodeUnavailable, "workspace %s: the request ended while it resumed; it resumes on, retry", id)
		}
	}
}
