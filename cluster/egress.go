package cluster

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/internal/ctxsleep"
)

// Egress and Resolver objects over the API. Operator endpoints never
// answer an Egress's password: the FSM's views do not carry it. The one
// way credentials leave ctrl is the member-only internal endpoint, and
// only to a node whose Workspace's policy uses that exact revision.

// noExpectedVersion refuses --expected-version on a create: the object
// does not exist yet, so no version can be expected of it.
func noExpectedVersion(kind, name string, m api.WriteMeta) error {
	if m.ExpectedVersion != nil {
		return api.Errorf(api.CodeInvalidArgument, "%s %s: --expected-version applies to update and delete, not to create", kind, name)
	}
	return nil
}

// egressRoutes manage Egresses and Resolvers.
func (s *Server) egressRoutes() []route {
	return []route{
		{"POST", "/v1/egress", keyAdmins, atLeader, decoded(s.handleEgressCreate)},
		{"GET", "/v1/egress", keyAdmins, atReader, s.handleEgressList},
		{"GET", "/v1/egress/{name}", keyAdmins, atReader, s.handleEgressGet},
		{"POST", "/v1/egress/{name}/update", keyAdmins, atLeader, decoded(s.handleEgressUpdate)},
		{"POST", "/v1/egress/{name}/delete", keyAdmins, atLeader, s.objectWrite(fsm.OpEgressDelete, objectName(kindEgress))},
		{"POST", "/v1/resolvers", keyAdmins, atLeader, decoded(s.handleResolverCreate)},
		{"GET", "/v1/resolvers", keyAdmins, atReader, s.handleResolverList},
		{"GET", "/v1/resolvers/{name}", keyAdmins, atReader, s.handleResolverGet},
		{"POST", "/v1/resolvers/{name}/delete", keyAdmins, atLeader, s.objectWrite(fsm.OpResolverDelete, objectName(kindResolver))},
	}
}

func (s *Server) handleEgressCreate(r *http.Request, req api.EgressCreateRequest) response {
	name, err := objectInNamespace(r, kindEgress, req.Name)
	if err != nil {
		return fail(err)
	}
	args := fsm.EgressCreateArgs{Name: name, SOCKS5: req.SOCKS5, Username: req.Username, Password: req.Password}
	if err := noExpectedVersion("egress", req.Name, req.WriteMeta); err != nil {
		return fail(err)
	}
	if err := checkCredentials(req.Name, req.Username, req.Password); err != nil {
		return fail(err)
	}
	// Bad input never enters the log; the FSM checks again.
	if err := fsm.CheckEgressCreate(args); err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpEgressCreate, req.WriteMeta, args)
}

func (s *Server) handleEgressUpdate(r *http.Request, req api.EgressUpdateRequest) response {
	name, err := objectInNamespace(r, kindEgress, r.PathValue("name"))
	if err != nil {
		return fail(err)
	}
	args := fsm.EgressUpdateArgs{Name: name, SOCKS5: req.SOCKS5, Username: req.Username, Password: req.Password, ClearCredentials: req.ClearCredentials}
	if err := checkCredentials(args.Name, deref(req.Username), deref(req.Password)); err != nil {
		return fail(err)
	}
	if err := fsm.CheckEgressUpdate(args); err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpEgressUpdate, req.WriteMeta, args)
}

// objectWrite serves the writes that name one object and carry nothing
// else: deletes of an egress, resolver or template, and the approval and
// withdrawal of a Platform; valid checks the name.
func (s *Server) objectWrite(op string, valid func(r *http.Request, name string) (string, error)) handler {
	return decoded(func(r *http.Request, req api.WriteMeta) response {
		name, err := valid(r, r.PathValue("name"))
		if err != nil {
			return fail(err)
		}
		return s.write(r, op, req, fsm.ObjectArgs{Name: name})
	})
}

// Kinds of the objects a namespace holds by name.
const (
	kindEgress   = "egress"
	kindResolver = "resolver"
)

// catalogName is objectWrite's check of a cluster-wide object's name.
func catalogName(valid func(string) error) func(r *http.Request, name string) (string, error) {
	return func(_ *http.Request, name string) (string, error) { return name, valid(name) }
}

// objectName checks the name of an Egress or Resolver and gives its
// stored name in the request's namespace.
func objectName(kind string) func(r *http.Request, name string) (string, error) {
	return func(r *http.Request, name string) (string, error) { return objectInNamespace(r, kind, name) }
}

// objectInNamespace is the stored name of object name of kind in the
// request's namespace; the name is given alone (-n gives the namespace).
func objectInNamespace(r *http.Request, kind, name string) (string, error) {
	if strings.Contains(name, ":") {
		return "", api.Errorf(api.CodeInvalidArgument, "%s name %q is not valid: give the name alone and its namespace with -n", kind, clipValue(name))
	}
	if err := fsm.ValidObjectName(kind, name); err != nil {
		return "", err
	}
	ns, _, err := requestNamespace(r)
	return fsm.ObjectName(ns, name), err
}

// objectsNamespace is the namespace a list of Egress or Resolver objects
// shows: nil for every one.
func objectsNamespace(r *http.Request) (*string, error) {
	ns, all, err := requestNamespace(r)
	if all {
		return nil, err
	}
	return &ns, err
}

func (s *Server) handleEgressList(r *http.Request) response {
	size, token, err := pageParams(r)
	if err != nil {
		return fail(err)
	}
	ns, err := objectsNamespace(r)
	if err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListEgress(tx, ns, size, token) })
}

func (s *Server) handleEgressGet(r *http.Request) response {
	name, err := objectInNamespace(r, kindEgress, r.PathValue("name"))
	if err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.GetEgress(tx, name) })
}

func (s *Server) handleResolverCreate(r *http.Request, req api.ResolverCreateRequest) response {
	name, err := objectInNamespace(r, kindResolver, req.Name)
	if err != nil {
		return fail(err)
	}
	args := fsm.ResolverCreateArgs{Name: name, Upstreams: req.Upstreams}
	if err := noExpectedVersion("resolver", req.Name, req.WriteMeta); err != nil {
		return fail(err)
	}
	if err := fsm.CheckResolverCreate(args); err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpResolverCreate, req.WriteMeta, args)
}

func (s *Server) handleResolverList(r *http.Request) response {
	size, token, err := pageParams(r)
	if err != nil {
		return fail(err)
	}
	ns, err := objectsNamespace(r)
	if err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListResolvers(tx, ns, size, token) })
}

func (s *Server) handleResolverGet(r *http.Request) response {
	name, err := objectInNamespace(r, kindResolver, r.PathValue("name"))
	if err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.GetResolver(tx, name) })
}

// handleEgressCredentials answers a node the credentials of one Egress
// revision, if a Workspace it runs (or is to run, or is changing to) uses
// that revision; members only (its rule), and the node is the
// one the caller's certificate names (a forwarded call: the original
// caller's). A node reads with ?consistent=true right after its task
// arrived: this member's replica may not have applied it yet.
func (s *Server) handleEgressCredentials(r *http.Request) response {
	name, raw := r.PathValue("name"), r.PathValue("rev")
	rev, err := strconv.ParseUint(raw, 10, 64)
	if err != nil || rev == 0 {
		return fail(api.Errorf(api.CodeInvalidArgument, "egress %s: revision %q is not a revision number (1, 2, ...)", name, clipValue(raw)))
	}
	node := callerOf(r).id.NodeID
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.EgressCredentials(tx, node, name, rev) })
}

func clipValue(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// withNetworkObjects adds to a task what its node needs of the Egress
// and Resolver its policy names: the SOCKS5 address of the recorded
// revision (the node fetches its credentials itself) and the upstreams.
func withNetworkObjects(tx *bolt.Tx, t *api.WorkspaceTask) error {
	var err error
	t.Egress, t.Resolver, err = fsm.TaskNetwork(tx, t.Network)
	return err
}

// EgressCredentials gets the credentials of one Egress revision for this
// member's own node, which ctrl gives only while a Workspace of the node
// uses that revision: from the FSM when this member leads ctrl, else with
// a consistent read from the ctrl members (the task that named the
// revision may be newer than this member's FSM). A ctrl without a leader
// or with one still catching up is waited for, up to egressFetchWait: the
// first Workspace created right after a cluster (or a dev member) started
// must not fail on it.
func (s *Server) EgressCredentials(ctx context.Context, name string, rev uint64) (*api.EgressCredentials, error) {
	ctx, cancel := context.WithTimeout(ctx, egressFetchWait)
	defer cancel()
	backoff := 50 * time.Millisecond
	for {
		out, err := s.egressCredentialsOnce(ctx, name, rev)
		if err == nil || api.CodeOf(err) != api.CodeUnavailable {
			return out, err
		}
		if ctxsleep.Sleep(ctx, backoff) != nil {
			return nil, err
		}
		backoff = min(2*backoff, time.Second)
	}
}

// egressFetchWait bounds how long a node waits for ctrl to answer for
// an Egress's credentials: an election and a new leader's catch-up.
const egressFetchWait = 30 * time.Second

func (s *Server) egressCredentialsOnce(ctx context.Context, name string, rev uint64) (*api.EgressCredentials, error) {
	if s.fsm != nil && s.IsLeader() {
		if err := s.raft.VerifyLeader().Error(); err != nil {
			return nil, api.Errorf(api.CodeUnavailable, "member %s could not confirm it leads ctrl: %v", s.id.NodeID, err)
		}
		// A leader that has not applied what its predecessor acknowledged
		// (its lead loop's barrier is not through) gets there itself.
		if !s.consistentReady.Load() {
			dl, _ := ctx.Deadline() // EgressCredentials set one
			if err := s.awaitRaft(s.raft.Barrier(time.Until(dl))); err != nil {
				return nil, api.Errorf(api.CodeUnavailable, "member %s was just elected ctrl leader and is catching up: %v", s.id.NodeID, err)
			}
		}
		var out *api.EgressCredentials
		err := s.fsm.View(func(tx *bolt.Tx) error {
			var err error
			out, err = fsm.EgressCredentials(tx, s.id.NodeID, name, rev)
			return err
		})
		return out, err
	}
	path := api.EgressCredentialsPath(name, rev) + "?consistent=true"
	var lastErr error = api.Errorf(api.CodeUnavailable, "no ctrl member is known to member %s", s.id.NodeID)
	for _, addr := range s.ctrlAddrs() {
		if addr == s.id.Advertise {
			continue
		}
		var out api.EgressCredentials
		lastErr = memberRequest(ctx, s.memberClient(), http.MethodGet, addr, path, nil, &out)
		if lastErr == nil {
			return &out, nil
		}
		if api.CodeOf(lastErr) != api.CodeUnavailable {
			return nil, lastErr
		}
	}
	return nil, lastErr
}

// checkCredentials refuses an Egress username or password that would not
// reach the proxy as sent: a lone surrogate escape decodes to U+FFFD.
func checkCredentials(name, user, pass string) error {
	if err := api.CheckSecret("egress "+api.EscapeText(name)+" username", user); err != nil {
		return err
	}
	return api.CheckSecret("egress "+api.EscapeText(name)+" password", pass)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
