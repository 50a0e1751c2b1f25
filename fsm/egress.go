package fsm

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Egress objects are SOCKS5 exits of the caller's; Resolver objects are
// DNS upstreams. A Workspace's policy names them, and records the Egress
// revision it uses: nodes fetch the credentials of exactly that revision,
// so every revision still referenced (by a policy in force or a pending
// change) is kept beside the latest, and dropped the moment the last
// reference goes (moveRefs). The password is stored only in the revision
// records and leaves the FSM only through EgressCredentials.

// EgressCreateArgs creates an Egress at revision 1.
type EgressCreateArgs struct {
	Name     string `json:"name"`
	SOCKS5   string `json:"socks5"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// EgressUpdateArgs makes a new revision of an Egress: every item given
// replaces the current one, the others are kept (the password too).
type EgressUpdateArgs struct {
	Name             string  `json:"name"`
	SOCKS5           *string `json:"socks5,omitempty"`
	Username         *string `json:"username,omitempty"`
	Password         *string `json:"password,omitempty"`
	ClearCredentials bool    `json:"clear_credentials,omitempty"`
}

// ObjectArgs names an Egress, Resolver or catalog template (delete).
type ObjectArgs struct {
	Name string `json:"name"`
}

// ResolverCreateArgs creates a Resolver.
type ResolverCreateArgs struct {
	Name      string   `json:"name"`
	Upstreams []string `json:"upstreams"`
}

// egressRecord is an Egress as stored: its latest revision, no password.
type egressRecord struct {
	Name        string    `json:"name"`
	Revision    uint64    `json:"revision"`
	SOCKS5      string    `json:"socks5"`
	Username    string    `json:"username,omitempty"`
	PasswordSet bool      `json:"password_set,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	Version     uint64    `json:"version"`
}

// egressRevision is one revision with its credentials.
type egressRevision struct {
	Revision  uint64    `json:"revision"`
	SOCKS5    string    `json:"socks5"`
	Username  string    `json:"username,omitempty"`
	Password  string    `json:"password,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

type resolverRecord struct {
	Name      string    `json:"name"`
	Upstreams []string  `json:"upstreams"`
	CreatedAt time.Time `json:"created_at"`
	Version   uint64    `json:"version"`
}

const (
	kindEgress   = "egress"
	kindResolver = "resolver"
)

var (
	objectNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	dnsLabelPattern   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	// Words of a network policy: no object may be called so, or a policy
	// could not tell the object from the word.
	reservedObjectNames = []string{api.EgressNone, api.EgressPublic, "default"}
)

// ValidObjectName checks the name of an Egress or Resolver (kind is
// "egress" or "resolver").
func ValidObjectName(kind, name string) error {
	if ns, short, ok := strings.Cut(name, objectNamespaceSep); ok {
		// A stored name of a namespace's object (objectns.go).
		if err := api.ValidNamespace(ns); err != nil || ns == api.DefaultNamespace {
			return api.Errorf(api.CodeInvalidArgument, "%s name %q is not valid: give the name alone and its namespace with -n", kind, clip(name))
		}
		name = short
	}
	if len(name) > 63 {
		return api.Errorf(api.CodeInvalidArgument, "%s name of %d bytes is too long: use 1-63 lowercase letters, digits or '-', starting with a letter or digit", kind, len(name))
	}
	if !objectNamePattern.MatchString(name) {
		return api.Errorf(api.CodeInvalidArgument, "%s name %q is not valid: use 1-63 lowercase letters, digits or '-', starting with a letter or digit", kind, name)
	}
	if containsString(reservedObjectNames, name) {
		return api.Errorf(api.CodeInvalidArgument, "%s name %q is reserved (none, public and default are words of a network policy): choose another name", kind, name)
	}
	return nil
}

// hostPort reads HOST:PORT, HOST (when defaultPort is not 0) or an IPv6
// address with or without brackets, and returns it canonical: an address
// in its shortest form (IPv6 in brackets), a DNS name in lowercase, the
// port in decimal. The error is what is wrong, for the caller to frame.
func hostPort(s string, defaultPort int) (string, error) {
	if len(s) > api.MaxEgressAddress {
		return "", fmt.Errorf("is %d bytes long: at most %d", len(s), api.MaxEgressAddress)
	}
	host, port := s, ""
	bracketed := strings.HasPrefix(s, "[")
	if _, err := netip.ParseAddr(s); err == nil {
		// A bare address (2001:db8::1 has colons but no port).
	} else if bracketed && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1]
	} else if strings.Contains(s, ":") {
		h, p, err := net.SplitHostPort(s)
		if err != nil {
			return "", fmt.Errorf("is not HOST:PORT")
		}
		host, port = h, p
	}
	if a, err := netip.ParseAddr(host); bracketed && (err != nil || !a.Is6()) {
		return "", fmt.Errorf("has brackets around something other than an IPv6 address")
	}
	if port == "" {
		if defaultPort == 0 {
			return "", fmt.Errorf("has no port")
		}
		port = strconv.Itoa(defaultPort)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || port[0] < '0' || port[0] > '9' {
		return "", fmt.Errorf("has port %q: use 1-65535", port)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		switch {
		case a.Zone() != "":
			return "", fmt.Errorf("names a zone (%%%s): give an address without one", a.Zone())
		case a.IsUnspecified():
			return "", fmt.Errorf("is the unspecified address %s", a)
		case a.IsMulticast():
			return "", fmt.Errorf("is the multicast address %s", a)
		}
		return net.JoinHostPort(a.String(), strconv.Itoa(n)), nil
	}
	name := strings.ToLower(host)
	if !validDNSName(name) {
		return "", fmt.Errorf("has host %q, which is neither an IP address nor a DNS name", host)
	}
	return net.JoinHostPort(name, strconv.Itoa(n)), nil
}

// validDNSName: labels of letters, digits and '-', at most 253 bytes, and
// a last label that is not all digits (10.0.0.300 is a bad address, not
// a name).
func validDNSName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if !dnsLabelPattern.MatchString(l) {
			return false
		}
	}
	last := labels[len(labels)-1]
	return strings.Trim(last, "0123456789") != ""
}

// normalizeSOCKS5 returns the canonical address of an Egress's proxy.
func normalizeSOCKS5(name, s string) (string, error) {
	out, err := hostPort(s, 0)
	if err != nil {
		if len(s) > api.MaxEgressAddress {
			return "", api.Errorf(api.CodeInvalidArgument, "egress %s: socks5 address %v", name, err)
		}
		return "", api.Errorf(api.CodeInvalidArgument,
			"egress %s: socks5 address %q %v: write it as HOST:PORT, e.g. proxy.corp.example:1080, 192.0.2.10:1080 or [2001:db8::10]:1080", name, s, err)
	}
	return out, nil
}

// validCredentials checks an RFC 1929 username and password: both or
// neither, 1-255 bytes each. Messages give lengths, never the values.
func validCredentials(name, user, pass string) error {
	switch {
	case len(user) > api.MaxCredentialBytes:
		return api.Errorf(api.CodeInvalidArgument, "egress %s: the username is %d bytes: SOCKS5 (RFC 1929) allows at most %d", name, len(user), api.MaxCredentialBytes)
	case len(pass) > api.MaxCredentialBytes:
		return api.Errorf(api.CodeInvalidArgument, "egress %s: the password is %d bytes: SOCKS5 (RFC 1929) allows at most %d", name, len(pass), api.MaxCredentialBytes)
	case (user == "") != (pass == ""):
		return api.Errorf(api.CodeInvalidArgument,
			"egress %s: SOCKS5 authentication (RFC 1929) needs both a username and a password: give both, or neither for a proxy without authentication (kibo egress update %s --clear-credentials drops those it has)", name, name)
	case !utf8.ValidString(user) || !utf8.ValidString(pass):
		return api.Errorf(api.CodeInvalidArgument, "egress %s: the username and the password must be UTF-8", name)
	case strings.IndexFunc(user, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return api.Errorf(api.CodeInvalidArgument, "egress %s: the username holds a control character: give it without", name)
	}
	return nil
}

// CheckEgressCreate validates a create as the FSM will (the API server
// refuses bad input before it enters the log).
func CheckEgressCreate(a EgressCreateArgs) error {
	if err := ValidObjectName(kindEgress, a.Name); err != nil {
		return err
	}
	if _, err := normalizeSOCKS5(a.Name, a.SOCKS5); err != nil {
		return err
	}
	return validCredentials(a.Name, a.Username, a.Password)
}

// CheckEgressUpdate validates what an update can be checked for without
// the current revision.
func CheckEgressUpdate(a EgressUpdateArgs) error {
	if err := ValidObjectName(kindEgress, a.Name); err != nil {
		return err
	}
	if a.SOCKS5 == nil && a.Username == nil && a.Password == nil && !a.ClearCredentials {
		return api.Errorf(api.CodeInvalidArgument, "egress %s: give what to change: the socks5 address, the username, the password, or clear the credentials", a.Name)
	}
	if a.ClearCredentials && (a.Username != nil || a.Password != nil) {
		return api.Errorf(api.CodeInvalidArgument, "egress %s: clearing the credentials and giving a username or password are exclusive: give one", a.Name)
	}
	if a.SOCKS5 != nil {
		if _, err := normalizeSOCKS5(a.Name, *a.SOCKS5); err != nil {
			return err
		}
	}
	user, pass := "", ""
	if a.Username != nil {
		user = *a.Username
	}
	if a.Password != nil {
		pass = *a.Password
	}
	if len(user) > api.MaxCredentialBytes || len(pass) > api.MaxCredentialBytes {
		return validCredentials(a.Name, user, pass)
	}
	return nil
}

// normalizeUpstreams checks and canonicalizes a Resolver's upstreams:
// 1-8, each once, in the order given.
func normalizeUpstreams(name string, in []string) ([]string, error) {
	if len(in) == 0 || len(in) > api.MaxResolverUpstream {
		return nil, api.Errorf(api.CodeInvalidArgument, "resolver %s: %d upstreams given: give 1-%d", name, len(in), api.MaxResolverUpstream)
	}
	var out []string
	for _, u := range in {
		c, err := hostPort(u, api.DefaultDNSPort)
		if err != nil {
			if len(u) > api.MaxEgressAddress {
				return nil, api.Errorf(api.CodeInvalidArgument, "resolver %s: an upstream %v", name, err)
			}
			return nil, api.Errorf(api.CodeInvalidArgument,
				"resolver %s: upstream %q %v: write it as ADDR, ADDR:PORT, HOSTNAME or HOSTNAME:PORT (port 53 when none is given), e.g. 192.0.2.53 or [2001:db8::53]:5353", name, u, err)
		}
		if !containsString(out, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// CheckResolverCreate validates a create as the FSM will.
func CheckResolverCreate(a ResolverCreateArgs) error {
	if err := ValidObjectName(kindResolver, a.Name); err != nil {
		return err
	}
	_, err := normalizeUpstreams(a.Name, a.Upstreams)
	return err
}

// ---------------------------------------------------------------------------
// Keys and records

func revisionKey(name string, rev uint64) []byte {
	return []byte(name + "\x00" + fmt.Sprintf("%020d", rev))
}

func egressRefKey(name string, rev uint64, ws string) []byte {
	return append(revisionKey(name, rev), append([]byte{0}, ws...)...)
}

func resolverRefKey(name, ws string) []byte { return []byte(name + "\x00" + ws) }

func mustEgress(tx *bolt.Tx, name string) (*egressRecord, error) {
	if err := ValidObjectName(kindEgress, name); err != nil {
		return nil, err
	}
	r, err := getRecord[egressRecord](tx, bucketEgress, []byte(name))
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, api.Errorf(api.CodeNotFound, "egress %s does not exist: check the name with kibo egress list", name)
	}
	return r, nil
}

func getRevision(tx *bolt.Tx, name string, rev uint64) (*egressRevision, error) {
	return getRecord[egressRevision](tx, bucketEgressRevisions, revisionKey(name, rev))
}

func mustResolver(tx *bolt.Tx, name string) (*resolverRecord, error) {
	if err := ValidObjectName(kindResolver, name); err != nil {
		return nil, err
	}
	r, err := getRecord[resolverRecord](tx, bucketResolvers, []byte(name))
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, api.Errorf(api.CodeNotFound, "resolver %s does not exist: check the name with kibo resolver list", name)
	}
	return r, nil
}

// countAtMost counts a bucket's keys, stopping at limit.
func countAtMost(tx *bolt.Tx, bucket []byte, limit int) int {
	n := 0
	c := tx.Bucket(bucket).Cursor()
	for k, _ := c.First(); k != nil && n < limit; k, _ = c.Next() {
		n++
	}
	return n
}

// usersOf returns the ids of the Workspaces an index (egress or resolver
// refs) lists under name, sorted, each once.
func usersOf(tx *bolt.Tx, bucket []byte, name string) []string {
	prefix := []byte(name + "\x00")
	seen := map[string]bool{}
	var out []string
	c := tx.Bucket(bucket).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		ws := string(k[bytes.LastIndexByte(k, 0)+1:])
		if !seen[ws] {
			seen[ws] = true
			out = append(out, ws)
		}
	}
	sort.Strings(out)
	return out
}

// What to do about the Workspaces that name an Egress or a Resolver
// being deleted: the change that lets go of it.
const (
	egressUsersFix   = "change their network policy first (kibo workspace set-network WS --egress none, public or another Egress)"
	resolverUsersFix = "change their network policy first (kibo workspace set-network WS --resolver default, or another Resolver)"
)

// inUse refuses to delete an object Workspaces still name; fix says what
// to do about them.
func inUse(kind, name string, users []string, fix string) error {
	if len(users) == 0 {
		return nil
	}
	list := users
	more := ""
	if len(list) > 10 {
		list, more = list[:10], fmt.Sprintf(" and %d more", len(users)-10)
	}
	return api.Errorf(api.CodeFailedPrecondition, "%s %s is used by workspaces %s%s: %s", kind, name, strings.Join(list, ", "), more, fix)
}

func egressView(tx *bolt.Tx, r *egressRecord) *api.Egress {
	ns, short := SplitObjectName(r.Name)
	return &api.Egress{Name: short, Namespace: ns, Revision: r.Revision, SOCKS5: r.SOCKS5, Username: r.Username, PasswordSet: r.PasswordSet,
		Workspaces: len(usersOf(tx, bucketEgressRefs, r.Name)), CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Version: r.Version}
}

func resolverView(tx *bolt.Tx, r *resolverRecord) *api.Resolver {
	ns, short := SplitObjectName(r.Name)
	return &api.Resolver{Name: short, Namespace: ns, Upstreams: r.Upstreams, Workspaces: len(usersOf(tx, bucketResolverRefs, r.Name)), CreatedAt: r.CreatedAt, Version: r.Version}
}

// putRevision stores rev as r's latest revision.
func putRevision(tx *bolt.Tx, r *egressRecord, rev *egressRevision) error {
	if err := putJSON(tx, bucketEgressRevisions, revisionKey(r.Name, rev.Revision), rev); err != nil {
		return err
	}
	return putJSON(tx, bucketEgress, []byte(r.Name), r)
}
