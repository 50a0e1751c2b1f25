package cluster

import (
	"net/http"
	"net/url"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// Progress of a node's long byte transfers, for the operator's bars: a
// publish, and what a Workspace's start fetches or imports, run on one
// node while the CLI waits on a member. That member finds the node as the
// write does and asks it how far it is; the node answers from what its
// runtime lists (agent.Progress).

// handleTemplatePublishProgress is GET /v1/templates/{name}/publish-progress
// (?from_node=, as the publish names it).
func (s *Server) handleTemplatePublishProgress(r *http.Request) response {
	name := r.PathValue("name")
	if err := api.ValidTemplateName(name); err != nil {
		return fail(err)
	}
	return s.progressOf(r, api.TemplatePublishProgressKey(name), func(tx *bolt.Tx) (*api.Node, error) {
		return publishingNode(tx, name, r.URL.Query().Get("from_node"))
	})
}

// handlePlatformPublishProgress is GET /v1/platforms/publish-progress
// (?from_node=&platform=, as the publish names them).
func (s *Server) handlePlatformPublishProgress(r *http.Request) response {
	id := r.URL.Query().Get("platform")
	if id == "" {
		id = OwnPlatform
	}
	return s.progressOf(r, api.PlatformPublishProgressKey(id), func(tx *bolt.Tx) (*api.Node, error) {
		return platformNode(tx, r.URL.Query().Get("from_node"))
	})
}

// handleWorkspaceProgress is GET /v1/workspaces/{id}/progress: what the
// node starting the Workspace fetches or imports for it.
func (s *Server) handleWorkspaceProgress(r *http.Request) response {
	id := r.PathValue("id")
	return s.progressOf(r, api.WorkspaceProgressKey(id), func(tx *bolt.Tx) (*api.Node, error) {
		ws, err := visibleWorkspace(r, tx, id)
		if err != nil {
			return nil, err
		}
		node := ws.NodeID
		if p := ws.Pending; p != nil && p.NodeID != "" {
			node = p.NodeID
		}
		if node == "" {
			return nil, api.Errorf(api.CodeNotFound, "workspace %s is on no node: nothing is fetched for it", id)
		}
		return fsm.GetNode(tx, node)
	})
}

// progressOf answers how far the transfer under key is on the node that
// nodeOf finds.
func (s *Server) progressOf(r *http.Request, key string, nodeOf func(*bolt.Tx) (*api.Node, error)) response {
	if err := api.CheckProgressKey(key); err != nil {
		return fail(err)
	}
	var n *api.Node
	if err := s.fsm.View(func(tx *bolt.Tx) (err error) {
		n, err = nodeOf(tx)
		return err
	}); err != nil {
		return fail(err)
	}
	var p api.ByteProgress
	var err error
	if n.NodeID == s.id.NodeID {
		p, err = s.localTransferProgress(key)
	} else {
		err = s.nodeCall(r.Context(), n, http.MethodGet, "/v1/internal/progress/"+url.PathEscape(key), nil, 10*time.Second, 4<<10, &p)
	}
	if err != nil {
		return fail(err)
	}
	return answer(p)
}

// handleNodeProgress is GET /v1/internal/progress/{key} on the node.
func (s *Server) handleNodeProgress(r *http.Request) response {
	key := r.PathValue("key")
	if err := api.CheckProgressKey(key); err != nil {
		return fail(err)
	}
	p, err := s.localTransferProgress(key)
	if err != nil {
		return fail(err)
	}
	return answer(p)
}

func (s *Server) localTransferProgress(key string) (api.ByteProgress, error) {
	if f := s.own().Progress; f != nil {
		if p, ok := f(key); ok {
			return p, nil
		}
	}
	return api.ByteProgress{}, api.Errorf(api.CodeNotFound, "nothing runs under %s on member %s", key, s.id.NodeID)
}
