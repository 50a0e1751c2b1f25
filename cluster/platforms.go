package cluster

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// `platform publish` puts a Platform a node built into the artifact store
// and records it in the catalog, as `template publish` does for
// templates: ctrl (the leader) picks the node and asks its member to
// upload on an internal route, then records the node's answer.
// `platform approve` and `platform withdraw` are plain writes.

// OwnPlatform is the id a publish names a node's own Platform by.
const OwnPlatform = "own"

// platformRoutes are the operator's calls about the Platform catalog.
func (s *Server) platformRoutes() []route {
	return []route{
		{"GET", "/v1/platforms", operators, atReader, s.handlePlatformList},
		{"GET", "/v1/platforms/{name}", operators, atReader, s.handlePlatformGet},
		{"POST", "/v1/platforms/publish", operators, atLeader, decoded(s.handlePlatformPublish)},
		{"GET", "/v1/platforms/publish-progress", operators, atReader, s.handlePlatformPublishProgress},
		{"POST", "/v1/platforms/{name}/approve", operators, atLeader, s.objectWrite(fsm.OpPlatformApprove, catalogName(api.ValidPlatformID))},
		{"POST", "/v1/platforms/{name}/withdraw", operators, atLeader, s.objectWrite(fsm.OpPlatformWithdraw, catalogName(api.ValidPlatformID))},
	}
}

// handlePlatformPublish is POST /v1/platforms/publish.
func (s *Server) handlePlatformPublish(r *http.Request, req api.PlatformPublishRequest) response {
	id := OwnPlatform
	if req.PlatformID != "" {
		if err := api.ValidPlatformID(req.PlatformID); err != nil {
			return fail(err)
		}
		id = req.PlatformID
	}
	if req.FromNode != "" {
		if err := fsm.ValidNodeID(req.FromNode); err != nil {
			return fail(err)
		}
	}
	if err := s.levelsReach("platform publish", fsm.LevelArtifacts); err != nil {
		return fail(err)
	}
	s.publishing.RLock()
	defer s.publishing.RUnlock()
	var n *api.Node
	err := s.fsm.View(func(tx *bolt.Tx) (err error) {
		n, err = platformNode(tx, req.FromNode)
		return err
	})
	if err != nil {
		return fail(err)
	}
	img, err := nodeUpload(r.Context(), s, n, "platform "+id, "/v1/internal/platforms/"+url.PathEscape(id)+"/upload",
		func(ctx context.Context) (api.PlatformImage, error) { return s.publishPlatform(ctx, id) })
	if err != nil {
		return fail(err)
	}
	args := fsm.PlatformPublishArgs{PlatformImage: img, NodeID: n.NodeID}
	if id != OwnPlatform && img.PlatformID != id {
		err = api.Errorf(api.CodeInternal, "node %s uploaded platform %q when asked for %s", n.NodeID, img.PlatformID, id)
	} else {
		err = fsm.CheckPlatformPublish(args)
	}
	if err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpPlatformPublish, req.WriteMeta, args)
}

// platformNode is the node whose Platform is published: from, or the
// only node of the cluster (not retired).
func platformNode(tx *bolt.Tx, from string) (*api.Node, error) {
	if from != "" {
		n, err := fsm.GetNode(tx, from)
		if err != nil {
			return nil, err
		}
		if n.Retired || !n.HasRole(api.RoleNode) {
			return nil, api.Errorf(api.CodeFailedPrecondition, "node %s runs no Workspaces (retired, or not of role node): give a node that built the Platform with --from-node", from)
		}
		return n, nil
	}
	nodes, err := fsm.ListNodes(tx, 0, "")
	if err != nil {
		return nil, err
	}
	var ids []string
	var one *api.Node
	for i := range nodes.Nodes {
		if n := &nodes.Nodes[i]; !n.Retired && n.HasRole(api.RoleNode) {
			ids, one = append(ids, n.NodeID), n
		}
	}
	if len(ids) != 1 {
		return nil, api.Errorf(api.CodeInvalidArgument, "the cluster has %d nodes (%s): say whose Platform to publish with --from-node NODE", len(ids), strings.Join(ids, ", "))
	}
	return one, nil
}

func (s *Server) publishPlatform(ctx context.Context, id string) (api.PlatformImage, error) {
	if id != OwnPlatform {
		if err := api.ValidPlatformID(id); err != nil {
			return api.PlatformImage{}, err
		}
	}
	return runPublisher(s, s.own().Platforms, "Platforms", ctx, id)
}

// platformOfResult is the Platform a start's answer names, recorded on the
// Workspace only once every voter reaches the level that records it.
func (s *Server) platformOfResult(id string) string {
	if id == "" || s.levelsReach("platform catalog", fsm.LevelArtifacts) != nil {
		return ""
	}
	return id
}

func (s *Server) handlePlatformList(r *http.Request) response {
	if err := noPaging(r, "Platforms"); err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListCatalogPlatforms(tx) })
}

func (s *Server) handlePlatformGet(r *http.Request) response {
	id := r.PathValue("name")
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.GetCatalogPlatform(tx, id) })
}
