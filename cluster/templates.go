package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/ctrl/placement"
	"github.com/kibotos/kibotos/fsm"
)

// `template publish` puts a template a node built into the artifact store
// and records it in the catalog. The operator asks ctrl (the leader); ctrl
// picks the node (--from-node, else the one node that reports the
// template), asks that node's member to upload on an internal route, as
// for machine logs, and records the entry from the node's answer.

// templateUploadTimeout bounds one upload: an image of a few GiB to a
// shared file system.
const templateUploadTimeout = 30 * time.Minute

// templateRoutes are the operator's calls about the template catalog.
func (s *Server) templateRoutes() []route {
	return []route{
		{"GET", "/v1/templates", operators, atReader, s.handleTemplateList},
		{"GET", "/v1/templates/{name}", operators, atReader, s.handleTemplateGet},
		{"POST", "/v1/templates/{name}/publish", operators, atLeader, decoded(s.handleTemplatePublish)},
		{"GET", "/v1/templates/{name}/publish-progress", operators, atReader, s.handleTemplatePublishProgress},
		{"POST", "/v1/templates/{name}/delete", operators, atLeader, s.objectWrite(fsm.OpTemplateDelete, catalogName(api.ValidTemplateName))},
	}
}

// handleTemplatePublish is POST /v1/templates/{name}/publish.
func (s *Server) handleTemplatePublish(r *http.Request, req api.TemplatePublishRequest) response {
	name := r.PathValue("name")
	if err := api.ValidTemplateName(name); err != nil {
		return fail(err)
	}
	if req.FromNode != "" {
		if err := fsm.ValidNodeID(req.FromNode); err != nil {
			return fail(err)
		}
	}
	// Before the upload: a refused write must not have moved gigabytes.
	if err := s.levelsReach("template publish", fsm.LevelArtifacts); err != nil {
		return fail(err)
	}
	s.publishing.RLock()
	defer s.publishing.RUnlock()
	var n *api.Node
	err := s.fsm.View(func(tx *bolt.Tx) (err error) {
		n, err = publishingNode(tx, name, req.FromNode)
		return err
	})
	if err != nil {
		return fail(err)
	}
	img, err := s.templateUpload(r.Context(), n, name)
	if err != nil {
		return fail(err)
	}
	args := fsm.TemplatePublishArgs{TemplateImage: img, NodeID: n.NodeID}
	if img.Name != name {
		err = api.Errorf(api.CodeInternal, "node %s uploaded template %q when asked for %s", n.NodeID, img.Name, name)
	} else {
		err = fsm.CheckTemplatePublish(args)
	}
	if err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpTemplatePublish, req.WriteMeta, args)
}

// publishingNode is the node whose build of name is published: from, or
// the one node (not retired) that reports it.
func publishingNode(tx *bolt.Tx, name, from string) (*api.Node, error) {
	if from != "" {
		n, err := fsm.GetNode(tx, from)
		if err != nil {
			return nil, err
		}
		if n.Retired || !placement.HasTemplate(n, name) {
			return nil, api.Errorf(api.CodeFailedPrecondition, "node %s does not report template %s: build it there first (kibotos template build %s), or give another --from-node (kibo node get NODE lists a node's templates)", from, name, name)
		}
		return n, nil
	}
	nodes, err := fsm.ListNodes(tx, 0, "")
	if err != nil {
		return nil, err
	}
	var have []*api.Node
	for i := range nodes.Nodes {
		if n := &nodes.Nodes[i]; !n.Retired && placement.HasTemplate(n, name) {
			have = append(have, n)
		}
	}
	switch len(have) {
	case 0:
		return nil, api.Errorf(api.CodeNotFound, "template %s is not built on any node: build it on one with kibotos template build %s, then publish it", name, name)
	case 1:
		return have[0], nil
	}
	ids := make([]string, len(have))
	for i, n := range have {
		ids[i] = n.NodeID
	}
	return nil, api.Errorf(api.CodeFailedPrecondition, "template %s is built on nodes %s: say whose build to publish with --from-node NODE", name, strings.Join(ids, ", "))
}

// templateUpload asks node n to upload its build of name.
func (s *Server) templateUpload(ctx context.Context, n *api.Node, name string) (api.TemplateImage, error) {
	return nodeUpload(ctx, s, n, "template "+name, "/v1/internal/templates/"+url.PathEscape(name)+"/upload",
		func(ctx context.Context) (api.TemplateImage, error) { return s.publishTemplate(ctx, name) })
}

// nodeUpload asks node n to upload what and answer with what it put into
// the artifact store: this member's own uploader (self) when it is that
// node, else the node's member on path.
func nodeUpload[T any](ctx context.Context, s *Server, n *api.Node, what, path string, self func(context.Context) (T, error)) (T, error) {
	var out T
	var err error
	if n.NodeID == s.id.NodeID {
		out, err = self(ctx)
	} else {
		err = s.nodeCall(ctx, n, http.MethodPost, path, nil, templateUploadTimeout, 64<<10, &out)
	}
	var e *api.Error
	switch {
	case err == nil:
		return out, nil
	case errors.As(err, &e) && e.Code != api.CodeUnavailable:
		return out, e
	}
	return out, api.Errorf(api.CodeUnavailable, "%s: node %s did not upload it: %v; retry once it is back (kibo node get %s)", what, n.NodeID, err, n.NodeID)
}

// nodeUpload serves an internal upload route on the node (ctrl asks,
// for a publish): publish(the path's name).
func nodeUploadRoute[T any](publish func(context.Context, string) (T, error)) handler {
	return func(r *http.Request) response {
		out, err := publish(r.Context(), r.PathValue("name"))
		if err != nil {
			return fail(err)
		}
		return answer(out)
	}
}

func (s *Server) publishTemplate(ctx context.Context, name string) (api.TemplateImage, error) {
	if err := api.ValidTemplateName(name); err != nil {
		return api.TemplateImage{}, err
	}
	return runPublisher(s, s.own().Templates, "templates", ctx, name)
}

// runPublisher runs this node's publisher p (nil: the member runs no node
// runtime, so it holds no such things to publish).
func runPublisher[T any, P ~func(context.Context, string) (T, error)](s *Server, p P, holds string, ctx context.Context, name string) (T, error) {
	if p == nil {
		var zero T
		return zero, api.Errorf(api.CodeFailedPrecondition, "member %s runs no node runtime: it holds no %s to publish", s.id.NodeID, holds)
	}
	out, err := p(ctx, name)
	var e *api.Error
	if err != nil && !errors.As(err, &e) {
		err = fmt.Errorf("member %s: %w", s.id.NodeID, err)
	}
	return out, err
}

func (s *Server) handleTemplateList(r *http.Request) response {
	size, token, err := pageParams(r)
	if err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListCatalogTemplates(tx, size, token) })
}

func (s *Server) handleTemplateGet(r *http.Request) response {
	name := r.PathValue("name")
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.GetCatalogTemplate(tx, name) })
}
