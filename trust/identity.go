// Package trust says what a certificate of a Kibotos cluster is allowed to
// be: which node it names, which kind of credential it is (member, operator,
// data-plane server), which roles the node was admitted with and when. It
// also builds the TLS peer checks every channel uses, so a client never
// accepts "some certificate of the cluster" where it meant a particular
// member or a ctrl member.
//
// It is also the cluster's certificate library: the CA (NewCA, LoadCA),
// issuing (CA.Issue), the PEM forms of certificates and keys as the data
// directory and the join and renewal requests hold them, fingerprints, and
// when a certificate is due for renewal. It never looks at cluster state
// (admission and revocation are checked by the cluster package against the
// state machine) and speaks to no one: asking a ctrl member to sign is the
// cluster package's job.
package trust

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Kinds of certificates.
const (
	// KindMember is a host's identity: server and client certificate of
	// the member process, carrying the roles the node was admitted with.
	KindMember = "member"
	// KindAdmin is the operator certificate of a ctrl member's host or of
	// a member admitted with the operator role (the CLI on that host).
	KindAdmin = "admin"
	// KindOperator is a person's operator certificate (kibo operator
	// issue): its NodeID is the operator's name, its Admitted the issue
	// time ctrl recorded, and it is accepted only while that record is.
	KindOperator = "operator"
	// KindDataPlane is the server certificate of a node's data-plane
	// process. It authenticates nothing as a client.
	KindDataPlane = "dataplane"
	// KindAPIServer is the server certificate of a ctrl member's API
	// listener for applications when no certificate is configured for
	// it; its NodeID is the member's. It authenticates nothing as a
	// client.
	KindAPIServer = "apiserver"
)

// Roles a member certificate can carry (the same words as api.Role*).
const (
	RoleCtrl     = "ctrl"
	RoleNode     = "node"
	RoleOperator = "operator"
)

// Lifetimes. Short, so a certificate that escaped also stops working by
// itself; members renew theirs at half-life over their authenticated
// channel.
const (
	MemberLifetime    = 30 * 24 * time.Hour
	AdminLifetime     = 30 * 24 * time.Hour
	DataPlaneLifetime = 24 * time.Hour
	// APIServerLifetime is short for the same reason: its member issues
	// the next one itself when it is half through.
	APIServerLifetime = 24 * time.Hour
	// Backdate covers clock differences between the signer and a verifier.
	Backdate = 10 * time.Minute
)

// MaxValidity is the longest validity (NotAfter - NotBefore) a certificate
// of kind may have, whoever signed it: a member issues no longer, so a
// longer one was forged with a leaked CA key and would outlive both the
// key's rotation and the revocations of its node. 0 for a kind no member
// issues.
func MaxValidity(kind string) time.Duration {
	switch kind {
	case KindMember:
		return MemberLifetime + Backdate
	case KindAdmin, KindOperator:
		return AdminLifetime + Backdate
	case KindDataPlane:
		return DataPlaneLifetime + Backdate
	case KindAPIServer:
		return APIServerLifetime + Backdate
	}
	return 0
}

const uriScheme = "kibotos"

// Identity is what a cluster certificate asserts.
type Identity struct {
	ClusterID string
	Kind      string
	NodeID    string
	// Roles are the member's roles (members only).
	Roles []string
	// Admitted is the node's admission time as ctrl recorded it. A node
	// revoked and admitted again gets a new one, so certificates of the
	// earlier admission stop matching.
	Admitted time.Time
}

// Name is how the identity appears as an actor: the node id of a member or
// data plane, admin@<node> of a host's operator certificate,
// operator:<name> of a person's.
func (id Identity) Name() string {
	switch id.Kind {
	case KindAdmin:
		return "admin@" + id.NodeID
	case KindOperator:
		return "operator:" + id.NodeID
	}
	return id.NodeID
}

// HasRole reports whether a member certificate carries role.
func (id Identity) HasRole(role string) bool { return slices.Contains(id.Roles, role) }

// URI is the identity as a certificate's URI SAN:
// kibotos://<cluster>/<kind>/<node>?roles=ctrl,node&admitted=<unix ns>.
func (id Identity) URI() *url.URL {
	q := url.Values{}
	if len(id.Roles) > 0 {
		q.Set("roles", strings.Join(id.Roles, ","))
	}
	q.Set("admitted", strconv.FormatInt(id.Admitted.UnixNano(), 10))
	return &url.URL{Scheme: uriScheme, Host: id.ClusterID, Path: "/" + id.Kind + "/" + id.NodeID, RawQuery: q.Encode()}
}

// ErrNoIdentity is returned for a certificate without a Kibotos identity
// (e.g. one issued by a kibotos build older than role certificates).
var ErrNoIdentity = errors.New("the certificate carries no kibotos identity")

// FromCert reads the identity a certificate asserts. It does not check the
// signature: callers verify the chain first.
func FromCert(c *x509.Certificate) (Identity, error) {
	var found *url.URL
	for _, u := range c.URIs {
		if u.Scheme == uriScheme {
			if found != nil {
				return Identity{}, fmt.Errorf("certificate %q carries two kibotos identities", c.Subject.CommonName)
			}
			found = u
		}
	}
	if found == nil {
		return Identity{}, fmt.Errorf("certificate %q: %w", c.Subject.CommonName, ErrNoIdentity)
	}
	parts := strings.Split(strings.TrimPrefix(found.Path, "/"), "/")
	if len(parts) != 2 || parts[1] == "" || found.Host == "" {
		return Identity{}, fmt.Errorf("certificate %q: identity %q is not kibotos://CLUSTER/KIND/NODE", c.Subject.CommonName, found)
	}
	id := Identity{ClusterID: found.Host, Kind: parts[0], NodeID: parts[1]}
	switch id.Kind {
	case KindMember, KindAdmin, KindOperator, KindDataPlane, KindAPIServer:
	default:
		return Identity{}, fmt.Errorf("certificate %q: unknown kind %q", c.Subject.CommonName, id.Kind)
	}
	q := found.Query()
	if r := q.Get("roles"); r != "" {
		id.Roles = strings.Split(r, ",")
		for _, role := range id.Roles {
			if role != RoleCtrl && role != RoleNode && role != RoleOperator {
				return Identity{}, fmt.Errorf("certificate %q: unknown role %q", c.Subject.CommonName, role)
			}
		}
	}
	if id.Kind == KindMember && len(id.Roles) == 0 {
		return Identity{}, fmt.Errorf("certificate %q: a member certificate without roles", c.Subject.CommonName)
	}
	ns, err := strconv.ParseInt(q.Get("admitted"), 10, 64)
	if err != nil {
		return Identity{}, fmt.Errorf("certificate %q: admission time %q is not a number", c.Subject.CommonName, q.Get("admitted"))
	}
	id.Admitted = time.Unix(0, ns).UTC()
	return id, nil
}
