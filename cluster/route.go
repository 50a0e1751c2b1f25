package cluster

import (
	"net/http"
	"slices"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/trust"
)

// The member's API is a table of routes, one per area beside its
// handlers (nodeRoutes in handlers.go, workspaceRoutes in workspaces.go,
// ...). Each route declares who may call it and where it is served, so
// that authorization is read off the table (and tested over all of it,
// route_test.go) instead of from the handlers' bodies; a handler only
// computes its answer.

// route is one endpoint: method and path as http.ServeMux patterns them,
// the roles that may call it, where it is served and what it answers.
type route struct {
	method, path string
	access       access
	at           where
	handle       handler
}

// handler computes a route's answer; serve writes it.
type handler func(r *http.Request) response

// where a route is served.
type where int

const (
	atLocal  where = iota // this member answers (its status, level, metrics)
	atLeader              // a write: on the leader, forwarded there by other ctrl members
	atReader              // a read of this replica; ?consistent=true on the leader
	atCtrl                // this ctrl member, which holds the CA key; node-only members misdirect
	atNode                // the node side of this member: ctrl asks it for an operator
)

// role is what a caller may call as. A route lists the roles that may
// call it; giving a route to one more kind of caller is one more role
// in its list.
type role string

const (
	roleOperator role = "operator" // a host's (admin) or a person's (operator) operator certificate
	roleMember   role = "member"   // any member certificate
	roleNode     role = "node"     // a member certificate with the node role
	roleCtrl     role = "ctrl"     // a ctrl member calling as itself, not for a caller it forwards
	// API keys (issue 45): what a key may call, within its namespace.
	roleSandbox role = "sandbox"         // an API key of role sandbox or namespace-admin
	roleNSAdmin role = "namespace-admin" // an API key of role namespace-admin
)

// rolesOf are the roles caller c holds.
func rolesOf(c caller) []role {
	switch c.kind {
	case kindAPIKey:
		if c.key.role == api.KeyRoleNamespaceAdmin {
			return []role{roleSandbox, roleNSAdmin}
		}
		return []role{roleSandbox}
	case trust.KindAdmin, trust.KindOperator:
		return []role{roleOperator}
	case trust.KindMember:
		out := []role{roleMember}
		if c.id.HasRole(trust.RoleNode) {
			out = append(out, roleNode)
		}
		if c.id.HasRole(trust.RoleCtrl) && !c.viaHop {
			out = append(out, roleCtrl)
		}
		return out
	}
	return nil
}

// access is a route's rule: the roles that may call it and the refusal
// a caller holding none of them gets (permission_denied, worded for the
// route). A public route takes no certificate: its credential is in the
// body (the join grant).
type access struct {
	public bool
	roles  []role
	refuse func(c caller, r *http.Request) error
}

var (
	// operators: what `kibo` calls with the admin certificate.
	operators = access{roles: []role{roleOperator}, refuse: func(c caller, _ *http.Request) error {
		return api.Errorf(api.CodePermissionDenied, "%s is not an operator: use an operator credential (kibo operator issue NAME, or the data directory of a ctrl or operator member)", c.name)
	}}
	// members: the calls members make of ctrl.
	members = access{roles: []role{roleMember}, refuse: notMember}
	// nodeMembers: calls of members that run a node.
	nodeMembers = access{roles: []role{roleNode}, refuse: func(c caller, r *http.Request) error {
		if c.kind != trust.KindMember {
			return notMember(c, r)
		}
		return api.Errorf(api.CodePermissionDenied, "member %s has no node role and runs no data plane", c.id.NodeID)
	}}
	// anyCaller: every authenticated certificate (status).
	anyCaller = access{roles: []role{roleOperator, roleMember}, refuse: func(c caller, _ *http.Request) error {
		return api.Errorf(api.CodePermissionDenied, "%s is neither an operator nor a member", c.name)
	}}
	// tenants: operators, and API keys within their namespace (the
	// Workspace lifecycle, its data-plane credentials, logs, Volumes).
	tenants = access{roles: []role{roleOperator, roleSandbox}, refuse: func(c caller, _ *http.Request) error {
		return api.Errorf(api.CodePermissionDenied, "%s is not an operator and not an API key: a Workspace or Volume call needs one", c.name)
	}}
	// keyAdmins: operators, and namespace-admin keys for their namespace.
	keyAdmins = access{roles: []role{roleOperator, roleNSAdmin}, refuse: func(c caller, _ *http.Request) error {
		if c.key != nil {
			return api.Errorf(api.CodePermissionDenied, "API key %s has role %s: managing API keys needs role namespace-admin", c.key.name, c.key.role)
		}
		return api.Errorf(api.CodePermissionDenied, "%s is not an operator and not a namespace-admin API key", c.name)
	}}
	// namespaceReaders: operators, and any key (of its own namespace).
	namespaceReaders = tenants
	// grantHolders: the join, whose credential is the grant in its body.
	grantHolders = access{public: true}
)

// fromCtrl is the rule of the node side's routes: only ctrl members
// calling as themselves (they authorized the operator); refuse says what
// the route is for.
func fromCtrl(refuse string) access {
	return access{roles: []role{roleCtrl}, refuse: func(c caller, _ *http.Request) error {
		return api.Errorf(api.CodePermissionDenied, "%s is not a ctrl member: %s", c.name, refuse)
	}}
}

func notMember(c caller, r *http.Request) error {
	return api.Errorf(api.CodePermissionDenied, "%s is not a member: %s is an internal call of members", c.name, r.URL.Path)
}

// allow checks r's caller against rule a.
func (s *Server) allow(a access, r *http.Request) error {
	if a.public {
		return nil
	}
	c := callerOf(r)
	held := rolesOf(c)
	if !slices.ContainsFunc(a.roles, func(want role) bool { return slices.Contains(held, want) }) {
		return a.refuse(c, r)
	}
	return nil
}

// routes is the member's API on its member port.
func (s *Server) routes() http.Handler { return s.authenticate(s.routeMux()) }

// routeMux serves the route table to callers an authenticate step put
// in the request (member port: certificates; API listener: API keys).
func (s *Server) routeMux() *http.ServeMux {
	m := http.NewServeMux()
	for _, rt := range s.routeTable() {
		s.serve(m, rt)
	}
	return m
}

// routeTable is every route of the member's API, area by area.
func (s *Server) routeTable() []route {
	return slices.Concat(
		s.memberRoutes(),
		s.nodeSideRoutes(),
		s.nodeRoutes(),
		s.workspaceRoutes(),
		s.egressRoutes(),
		s.templateRoutes(),
		s.platformRoutes(),
		s.transferRoutes(),
		s.artifactRoutes(),
		s.poolRoutes(),
		s.volumeRoutes(),
		s.enrollmentRoutes(),
		s.operatorRoutes(),
		s.caRoutes(),
		s.tenantRoutes(),
	)
}

// serve registers rt on m: the caller is checked against its rule, then
// the request goes where the route is served, and the answer is written.
func (s *Server) serve(m *http.ServeMux, rt route) {
	h := rt.handle
	switch rt.at {
	case atLeader:
		h = s.onLeader(h)
	case atReader:
		h = s.reader(h)
	case atCtrl:
		h = s.ctrlLocal(h)
	}
	m.HandleFunc(rt.method+" "+rt.path, func(w http.ResponseWriter, r *http.Request) {
		if err := s.allow(rt.access, r); err != nil {
			s.auditRefused(r, callerOf(r).name, err)
			fail(err).render(w)
			return
		}
		if rt.at != atLeader {
			h(r).render(w)
			return
		}
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		h(r).render(rec)
		s.auditWrite(r, rec.status)
	})
}
