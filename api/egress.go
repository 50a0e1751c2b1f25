package api

import (
	"net/url"
	"strconv"
	"time"
)

// Egress and Resolver objects are the caller's own network exits that a
// Workspace's policy may name: a SOCKS5 proxy its TCP leaves through, and
// the DNS upstreams its queries go to. ctrl keeps them; a node receives
// with each task what it needs and fetches an Egress revision's
// credentials itself (GET /v1/internal/egress/{name}/revisions/{rev}).

// Limits of Egress and Resolver objects. Credentials follow RFC 1929
// (SOCKS5 username/password authentication: 1-255 bytes each).
const (
	MaxCredentialBytes  = 255
	MaxResolverUpstream = 8
	// MaxEgressObjects and MaxResolverObjects bound the state: each is a
	// deployment's exits, not a per-Workspace object.
	MaxEgressObjects   = 1000
	MaxResolverObjects = 1000
	// MaxEgressAddress bounds SOCKS5 and upstream addresses (a DNS name
	// of 253 bytes, brackets, a colon and a port).
	MaxEgressAddress = 261
	// DefaultDNSPort is the port of an upstream written without one.
	DefaultDNSPort = 53
)

// Egress is an Egress object as operators see it: never its password.
type Egress struct {
	Name string `json:"name"`
	// Namespace is the namespace it belongs to; absent: default.
	Namespace string `json:"namespace,omitempty"`
	// Revision is 1 on create and grows by one with every update that
	// changes something; a Workspace's policy records the revision it uses.
	Revision uint64 `json:"revision"`
	// SOCKS5 is the proxy, HOST:PORT (an IPv6 address in brackets),
	// stored canonical.
	SOCKS5   string `json:"socks5"`
	Username string `json:"username,omitempty"`
	// PasswordSet says the revision authenticates (RFC 1929); the
	// password itself is write-only.
	PasswordSet bool `json:"password_set"`
	// Workspaces counts the Workspaces whose policy (in force or
	// requested) names this Egress, at any revision.
	Workspaces int       `json:"workspaces"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	Version    uint64    `json:"version"`
}

// EgressList is one page of Egress objects, by name.
type EgressList struct {
	Egress        []Egress `json:"egress"`
	NextPageToken string   `json:"next_page_token,omitempty"`
}

// EgressCreateRequest is `egress create`. Username and Password are both
// given or both empty (no authentication).
type EgressCreateRequest struct {
	WriteMeta
	Name     string `json:"name"`
	SOCKS5   string `json:"socks5"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// EgressUpdateRequest is `egress update`: every item given replaces the
// current one in a new revision; an absent one is kept.
// ClearCredentials drops username and password (no authentication).
type EgressUpdateRequest struct {
	WriteMeta
	SOCKS5           *string `json:"socks5,omitempty"`
	Username         *string `json:"username,omitempty"`
	Password         *string `json:"password,omitempty"`
	ClearCredentials bool    `json:"clear_credentials,omitempty"`
}

// EgressCredentials is one revision of an Egress with its credentials,
// answered only to a node that runs (or is to run) a Workspace whose
// policy uses that revision. It never reaches an operator.
type EgressCredentials struct {
	Name     string `json:"name"`
	Revision uint64 `json:"revision"`
	SOCKS5   string `json:"socks5"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// EgressCredentialsPath is where a node reads the credentials of one
// revision (with its member certificate; add ?consistent=true right after
// a task named the revision).
func EgressCredentialsPath(name string, rev uint64) string {
	return "/v1/internal/egress/" + url.PathEscape(name) + "/revisions/" + strconv.FormatUint(rev, 10)
}

// Resolver is a Resolver object: the DNS upstreams of the Workspaces
// that name it.
type Resolver struct {
	Name string `json:"name"`
	// Namespace is the namespace it belongs to; absent: default.
	Namespace string `json:"namespace,omitempty"`
	// Upstreams are HOST:PORT (port 53 when none was given), in the order
	// given, each once; a HOST that is a DNS name is resolved by the
	// node's egress process with the node's resolver list.
	Upstreams  []string  `json:"upstreams"`
	Workspaces int       `json:"workspaces"`
	CreatedAt  time.Time `json:"created_at"`
	Version    uint64    `json:"version"`
}

// ResolverList is one page of Resolver objects, by name.
type ResolverList struct {
	Resolvers     []Resolver `json:"resolvers"`
	NextPageToken string     `json:"next_page_token,omitempty"`
}

// ResolverCreateRequest is `resolver create`.
type ResolverCreateRequest struct {
	WriteMeta
	Name      string   `json:"name"`
	Upstreams []string `json:"upstreams"`
}

// TaskEgress is what a node needs of the Egress a task's policy names:
// the SOCKS5 address of the revision the policy records. Its credentials
// (when Credentials is true) the node fetches per revision from ctrl.
type TaskEgress struct {
	Name        string `json:"name"`
	Revision    uint64 `json:"revision"`
	SOCKS5      string `json:"socks5"`
	Credentials bool   `json:"credentials,omitempty"`
}

// TaskResolver is the Resolver a task's policy names, with its upstreams.
type TaskResolver struct {
	Name      string   `json:"name"`
	Upstreams []string `json:"upstreams"`
}
