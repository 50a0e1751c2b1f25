package fsm

import (
	"strings"

	"github.com/kibotos/kibotos/api"
)

// An entry written for an API key names it as its actor (KeyActor), and
// the state machine itself holds the key to its namespace and role: the
// ops a role may propose are listed here, and every op that touches an
// object checks the object's namespace against the key's. Members check
// the same before the log; deciding it here too means no race between
// their check and the apply (a key revoked, or an object in another
// namespace) lets a write through.

const keyActorPrefix = "key:"

// KeyActor is the actor of an entry written for key name of namespace ns.
func KeyActor(ns, name string) string {
	return keyActorPrefix + api.ShownNamespace(api.StoredNamespace(ns)) + "/" + name
}

// ParseKeyActor splits a KeyActor; ok is false for other actors.
func ParseKeyActor(actor string) (ns, name string, ok bool) {
	rest, found := strings.CutPrefix(actor, keyActorPrefix)
	if !found {
		return "", "", false
	}
	ns, name, ok = strings.Cut(rest, "/")
	return ns, name, ok
}

// keyScope is the namespace and role of the key an entry was written
// for; nil for every other actor (operators, members, the leader).
type keyScope struct {
	ns   string // stored form: "" for default
	name string
	role string
}

// scopedOps are the ops an API key may propose, with the role it needs.
var scopedOps = map[string]string{
	OpWorkspaceCreate: api.KeyRoleSandbox,
	OpWorkspaceStart:  api.KeyRoleSandbox,
	OpWorkspaceStop:   api.KeyRoleSandbox,
	OpWorkspacePause:  api.KeyRoleSandbox,
	OpWorkspaceDelete: api.KeyRoleSandbox,
	// set-timeout: a sandbox may shorten or extend its own lifetime,
	// within the namespace's maximum.
	OpWorkspaceSetTimeout: api.KeyRoleSandbox,
	// set-network (LevelKeyNetwork): a sandbox may change the egress it
	// could have been created with, within its namespace's objects.
	OpWorkspaceSetNetwork: api.KeyRoleSandbox,
	OpVolumeCreate:        api.KeyRoleSandbox,
	OpVolumeResize:        api.KeyRoleSandbox,
	OpVolumeDelete:        api.KeyRoleSandbox,
	// The namespace's own network objects and keys.
	OpEgressCreate:   api.KeyRoleNamespaceAdmin,
	OpEgressUpdate:   api.KeyRoleNamespaceAdmin,
	OpEgressDelete:   api.KeyRoleNamespaceAdmin,
	OpResolverCreate: api.KeyRoleNamespaceAdmin,
	OpResolverDelete: api.KeyRoleNamespaceAdmin,
	OpAPIKeyCreate:   api.KeyRoleNamespaceAdmin,
	OpAPIKeyRevoke:   api.KeyRoleNamespaceAdmin,
}

// RoleMayPropose reports whether a key of role may propose op.
func RoleMayPropose(role, op string) bool {
	need, ok := scopedOps[op]
	return ok && (need == role || role == api.KeyRoleNamespaceAdmin)
}

// entryScope is the scope of the entry's key, refused when the key is
// unknown, revoked or expired at the entry's time, or its role may not
// propose the op.
func entryScope(ac *applyCtx) (*keyScope, error) {
	ns, name, ok := ParseKeyActor(ac.e.Actor)
	if !ok {
		return nil, nil
	}
	rec, err := LookupAPIKey(ac.tx, ns, name, ac.e.IssuedAt)
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.State != api.OperatorActive {
		return nil, api.Errorf(api.CodeUnauthenticated, "API key %s of namespace %s is not active (revoked, expired or deleted): ask a namespace admin for a new key", name, ns)
	}
	if !RoleMayPropose(rec.Role, ac.e.Op) {
		return nil, api.Errorf(api.CodePermissionDenied, "API key %s has role %s, which may not %s", name, rec.Role, ac.e.Op)
	}
	scope := &keyScope{ns: api.StoredNamespace(ns), name: name, role: rec.Role}
	return scope, scope.objectOp(ac.e)
}

// permits refuses an object of namespace ns (either form) outside the
// scope, as not found: a key learns nothing of other namespaces' objects.
// what names the object as the key gave it.
func (s *keyScope) permits(ns, what string) error {
	if s == nil || api.StoredNamespace(ns) == s.ns {
		return nil
	}
	return api.Errorf(api.CodeNotFound, "%s does not exist in namespace %s", what, api.ShownNamespace(s.ns))
}

// namespaceFor is the namespace (stored form) an object made by this
// entry goes to: the one asked, which a key may leave out (its own) but
// not make another.
func (s *keyScope) namespaceFor(asked string) (string, error) {
	if s == nil {
		return api.StoredNamespace(asked), nil
	}
	if asked != "" && api.StoredNamespace(asked) != s.ns {
		return "", api.Errorf(api.CodePermissionDenied, "API key %s belongs to namespace %s and may not create objects in namespace %s", s.name, api.ShownNamespace(s.ns), asked)
	}
	return s.ns, nil
}
