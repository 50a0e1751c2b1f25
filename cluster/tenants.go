package cluster

import (
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// Namespaces and API keys (issue 45). An API key's caller is held to its
// namespace twice: here, where requests name or read objects (a read of
// another namespace's object is not found, a list shows only its own),
// and in the state machine, which refuses an entry of a key for an object
// of another namespace or an op its role may not propose (fsm/scope.go).

// kindAPIKey is the caller kind of a request authenticated with an API key.
const kindAPIKey = "apikey"

// keyCaller is the API key a request was made with.
type keyCaller struct {
	namespace string // its name: "default" for the default namespace
	name      string
	role      string
}

// tenantRoutes manage namespaces (operators) and API keys (operators,
// and namespace admins for their own namespace).
func (s *Server) tenantRoutes() []route {
	return []route{
		{"POST", "/v1/namespaces", operators, atLeader, decoded(s.handleNamespaceCreate)},
		{"GET", "/v1/namespaces", operators, atReader, s.handleNamespaceList},
		{"GET", "/v1/namespaces/{name}", namespaceReaders, atReader, s.handleNamespaceGet},
		{"POST", "/v1/namespaces/{name}/delete", operators, atLeader, decoded(s.handleNamespaceDelete)},
		{"POST", "/v1/namespaces/{name}/quota", operators, atLeader, decoded(s.handleNamespaceQuota)},
		{"POST", "/v1/namespaces/{name}/defaults", operators, atLeader, decoded(s.handleNamespaceDefaults)},
		{"POST", "/v1/api-keys", keyAdmins, atLeader, decoded(s.handleAPIKeyCreate)},
		{"GET", "/v1/api-keys", keyAdmins, atReader, s.handleAPIKeyList},
		{"POST", "/v1/api-keys/{name}/revoke", keyAdmins, atLeader, decoded(s.handleAPIKeyRevoke)},
	}
}

// requestNamespace is the namespace a request works in: ?namespace=,
// default when absent; an API key's own, which it may name but not
// change. all is ?all_namespaces=true, for operators only.
func requestNamespace(r *http.Request) (ns string, all bool, err error) {
	q := r.URL.Query()
	ns, all = q.Get("namespace"), q.Get("all_namespaces") == "true"
	if ns != "" {
		if err := api.ValidNamespace(ns); err != nil {
			return "", false, err
		}
	}
	if k := callerOf(r).key; k != nil {
		switch {
		case all:
			return "", false, api.Errorf(api.CodePermissionDenied, "API key %s may list only its namespace %s: leave out --all-namespaces", k.name, k.namespace)
		case ns != "" && ns != k.namespace:
			return "", false, api.Errorf(api.CodePermissionDenied, "API key %s belongs to namespace %s, not %s: use a key of namespace %s", k.name, k.namespace, ns, ns)
		}
		return k.namespace, false, nil
	}
	if ns == "" {
		ns = api.DefaultNamespace
	}
	return ns, all, nil
}

// visible refuses an object of namespace ns (stored form) to an API key
// of another namespace, as not found: what names it says what it is.
func visible(r *http.Request, ns, what string) error {
	k := callerOf(r).key
	if k == nil || api.ShownNamespace(ns) == k.namespace {
		return nil
	}
	return api.Errorf(api.CodeNotFound, "%s does not exist in namespace %s", what, k.namespace)
}

// visibleWorkspace reads Workspace id if r's caller may see it.
func visibleWorkspace(r *http.Request, tx *bolt.Tx, id string) (*api.Workspace, error) {
	w, err := fsm.GetWorkspace(tx, id)
	if err != nil {
		return nil, err
	}
	return w, visible(r, w.Namespace, "workspace "+id)
}

// namespaceArg is the namespace of a write: the request's (its key's),
// in the form the state machine takes ("" for default is fine too).
func namespaceArg(r *http.Request) (string, error) {
	ns, _, err := requestNamespace(r)
	return api.StoredNamespace(ns), err
}

// namespaceLevel refuses a write into a namespace other than default
// while a voter is below LevelNamespaces: it would put the object in
// default.
func (s *Server) namespaceLevel(what, ns string) error {
	if ns == "" {
		return nil
	}
	return s.levelsReach(what+" in namespace "+ns, fsm.LevelNamespaces)
}

func (s *Server) handleNamespaceCreate(r *http.Request, req api.NamespaceCreateRequest) response {
	if err := api.ValidNamespace(req.Name); err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpNamespaceCreate, req.WriteMeta, fsm.NamespaceArgs{Name: req.Name})
}

func (s *Server) handleNamespaceDelete(r *http.Request, req api.WriteMeta) response {
	name := r.PathValue("name")
	if err := api.ValidNamespace(name); err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpNamespaceDelete, req, fsm.NamespaceArgs{Name: name})
}

func (s *Server) handleNamespaceQuota(r *http.Request, req api.NamespaceQuotaRequest) response {
	name := r.PathValue("name")
	if err := api.ValidNamespace(name); err != nil {
		return fail(err)
	}
	if err := (&api.NamespaceQuota{}).Apply(req.Set, req.Clear); err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpNamespaceQuota, req.WriteMeta, fsm.NamespaceQuotaArgs{Name: name, Set: req.Set, Clear: req.Clear})
}

func (s *Server) handleNamespaceDefaults(r *http.Request, req api.NamespaceDefaultsRequest) response {
	name := r.PathValue("name")
	if err := api.ValidNamespace(name); err != nil {
		return fail(err)
	}
	var d api.NamespaceDefaults
	for _, t := range []struct {
		v   string
		dst *int64
	}{{req.Timeout, &d.TimeoutSeconds}, {req.MaxTimeout, &d.MaxTimeoutSeconds}} {
		if t.v == "" {
			continue
		}
		dur, err := api.ParseTimeout(t.v)
		if err != nil {
			return fail(err)
		}
		*t.dst = int64(dur / time.Second)
	}
	d.OnTimeout = req.OnTimeout
	if err := d.Check(name); err != nil {
		return fail(err)
	}
	if err := s.levelsReach("namespace set-defaults", fsm.LevelLifetimes); err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpNamespaceDefaults, req.WriteMeta, fsm.NamespaceDefaultsArgs{Name: name, Defaults: d})
}

func (s *Server) handleNamespaceList(r *http.Request) response {
	if err := noPaging(r, "namespaces"); err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListNamespaces(tx) })
}

func (s *Server) handleNamespaceGet(r *http.Request) response {
	name := r.PathValue("name")
	if err := api.ValidNamespace(name); err != nil {
		return fail(err)
	}
	if err := visible(r, api.StoredNamespace(name), "namespace "+name); err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.GetNamespace(tx, name) })
}

// handleAPIKeyCreate records a key. The secret is drawn by the caller
// when it sends its key id and hash (the CLI does: a retry then records
// the same key, and the secret never crosses the network), else here, in
// which case this answer is the only place it appears.
func (s *Server) handleAPIKeyCreate(r *http.Request, req api.APIKeyCreateRequest) response {
	ns := req.Namespace
	if ns == "" {
		var err error
		if ns, _, err = requestNamespace(r); err != nil {
			return fail(err)
		}
	}
	if k := callerOf(r).key; k != nil && ns != k.namespace {
		return fail(api.Errorf(api.CodePermissionDenied, "API key %s belongs to namespace %s and may not create keys of namespace %s", k.name, k.namespace, ns))
	}
	ttl, err := keyTTL(req.Name, req.TTL)
	if err != nil {
		return fail(err)
	}
	secret := ""
	if req.KeyID == "" && req.SecretHash == "" {
		req.KeyID, secret, req.SecretHash = api.NewKeySecret()
	}
	args := fsm.APIKeyCreateArgs{Namespace: ns, Name: req.Name, Role: req.Role, KeyID: req.KeyID, SecretHash: req.SecretHash, TTL: ttl}
	if err := fsm.CheckAPIKeyCreate(args); err != nil {
		return fail(err)
	}
	if err := s.levelsReach("api-key create", fsm.LevelNamespaces); err != nil {
		return fail(err)
	}
	out := s.write(r, fsm.OpAPIKeyCreate, req.WriteMeta, args)
	res, ok := out.(resultResponse)
	if !ok {
		return out
	}
	s.log.Info("API key created", "namespace", ns, "key", req.Name, "role", req.Role, "created_by", callerOf(r).name)
	if secret == "" {
		return res
	}
	return resultResponse{value: apiKeyCreated{Key: res.value, Secret: secret}, replayed: res.replayed}
}

// apiKeyCreated is api.APIKeyCreated with the record as the state
// machine answered it.
type apiKeyCreated struct {
	Key    any    `json:"api_key"`
	Secret string `json:"secret"`
}

// keyTTL reads a key's lifetime: a Go duration or days ("90d"); empty
// never expires.
func keyTTL(name, v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := parseDays(v)
	if err != nil || d <= 0 {
		return 0, api.Errorf(api.CodeInvalidArgument, "API key %s: --expires %s is not a positive duration such as 12h or 90d", name, api.EscapeText(v))
	}
	return d, nil
}

func (s *Server) handleAPIKeyList(r *http.Request) response {
	if err := noPaging(r, "API keys"); err != nil {
		return fail(err)
	}
	ns, all, err := requestNamespace(r)
	if err != nil {
		return fail(err)
	}
	if all {
		ns = ""
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListAPIKeys(tx, ns, time.Now()) })
}

func (s *Server) handleAPIKeyRevoke(r *http.Request, req api.WriteMeta) response {
	name := r.PathValue("name")
	if err := api.ValidKeyName(name); err != nil {
		return fail(err)
	}
	ns, _, err := requestNamespace(r)
	if err != nil {
		return fail(err)
	}
	out := s.write(r, fsm.OpAPIKeyRevoke, req, fsm.APIKeyArgs{Namespace: ns, Name: name})
	if _, ok := out.(resultResponse); ok {
		s.log.Info("API key revoked", "namespace", ns, "key", name, "revoked_by", callerOf(r).name)
	}
	return out
}

// apiKeyCaller authenticates a presented API key secret against this
// member's replica: the key must exist, be active now and its secret's
// hash match. A revoke is refused here as soon as it is applied on this
// member. Ctrl members only: a node-only member has no replica.
func (s *Server) apiKeyCaller(secret string) (caller, error) {
	id, rnd, ok := api.ParseKeySecret(secret)
	if !ok {
		return caller{}, api.Errorf(api.CodeUnauthenticated, "the bearer token is not a Kibotos API key (kbt_...): pass the secret kibo api-key create printed")
	}
	if s.fsm == nil {
		return caller{}, api.Errorf(api.CodeUnavailable, "member %s is not a ctrl member and cannot check API keys: call a ctrl member's API", s.id.NodeID)
	}
	var cred *fsm.KeyCredential
	err := s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		cred, err = fsm.FindAPIKey(tx, id, time.Now())
		return err
	})
	if err != nil {
		return caller{}, api.Errorf(api.CodeUnavailable, "member %s could not read API key %s: %v; retry", s.id.NodeID, id, err)
	}
	sum, _ := hex.DecodeString(api.KeySecretHash(rnd))
	if cred == nil || subtle.ConstantTimeCompare(sum, cred.SecretHash) != 1 {
		return caller{}, api.Errorf(api.CodeUnauthenticated, "API key %s is not a key of this cluster: check the secret, or ask a namespace admin for a key", id)
	}
	if cred.Key.State != api.OperatorActive {
		return caller{}, api.Errorf(api.CodeUnauthenticated, "API key %s of namespace %s is %s: ask a namespace admin for a new key", cred.Key.Name, cred.Key.Namespace, cred.Key.State)
	}
	s.keyUses.note(id, cred.Key.LastUsedAt, time.Now())
	return keyCallerOf(cred.Key), nil
}

func keyCallerOf(k api.APIKey) caller {
	return caller{name: fsm.KeyActor(k.Namespace, k.Name), kind: kindAPIKey, key: &keyCaller{namespace: k.Namespace, name: k.Name, role: k.Role}}
}

// keyActor checks the key a ctrl member forwarded a request for (actor
// name key:NS/NAME) against this member's replica.
func (s *Server) keyActor(actor string) (caller, error) {
	ns, name, ok := fsm.ParseKeyActor(actor)
	if !ok || s.fsm == nil {
		return caller{}, api.Errorf(api.CodeInvalidArgument, "forwarded request names API key actor %.80q, which is not one", actor)
	}
	var k *api.APIKey
	err := s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		k, err = fsm.LookupAPIKey(tx, ns, name, time.Now())
		return err
	})
	if err != nil {
		return caller{}, api.Errorf(api.CodeUnavailable, "member %s could not read API key %s: %v; retry", s.id.NodeID, name, err)
	}
	if k == nil || k.State != api.OperatorActive {
		return caller{}, api.Errorf(api.CodeUnauthenticated, "API key %s of namespace %s is not active: ask a namespace admin for a new key", name, ns)
	}
	return keyCallerOf(*k), nil
}
