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

	json "github.com/segmentio/encoding/json"
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

func getEgress(tx *bolt.Tx, name string) (*egressRecord, error) {
	return getRecord[egressRecord](tx, bucketEgress, []byte(name))
}

func mustEgress(tx *bolt.Tx, name string) (*egressRecord, error) {
	if err := ValidObjectName(kindEgress, name); err != nil {
		return nil, err
	}
	r, err := getEgress(tx, name)
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

func getResolver(tx *bolt.Tx, name string) (*resolverRecord, error) {
	return getRecord[resolverRecord](tx, bucketResolvers, []byte(name))
}

func mustResolver(tx *bolt.Tx, name string) (*resolverRecord, error) {
	if err := ValidObjectName(kindResolver, name); err != nil {
		return nil, err
	}
	r, err := getResolver(tx, name)
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
	return &api.Egress{Name: r.Name, Revision: r.Revision, SOCKS5: r.SOCKS5, Username: r.Username, PasswordSet: r.PasswordSet,
		Workspaces: len(usersOf(tx, bucketEgressRefs, r.Name)), CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Version: r.Version}
}

func resolverView(tx *bolt.Tx, r *resolverRecord) *api.Resolver {
	return &api.Resolver{Name: r.Name, Upstreams: r.Upstreams, Workspaces: len(usersOf(tx, bucketResolverRefs, r.Name)), CreatedAt: r.CreatedAt, Version: r.Version}
}

// putRevision stores rev as r's latest revision.
func putRevision(tx *bolt.Tx, r *egressRecord, rev *egressRevision) error {
	if err := putJSON(tx, bucketEgressRevisions, revisionKey(r.Name, rev.Revision), rev); err != nil {
		return err
	}
	return putJSON(tx, bucketEgress, []byte(r.Name), r)
}

// ---------------------------------------------------------------------------
// Handlers

func applyEgressCreate(tx *bolt.Tx, e *Entry) (any, error) {
	var a EgressCreateArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if err := CheckEgressCreate(a); err != nil {
		return nil, err
	}
	socks5, _ := normalizeSOCKS5(a.Name, a.SOCKS5)
	if old, err := getEgress(tx, a.Name); err != nil {
		return nil, err
	} else if old != nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "egress %s already exists (revision %d): change it with kibo egress update %s, or choose another name", a.Name, old.Revision, a.Name)
	}
	if countAtMost(tx, bucketEgress, api.MaxEgressObjects) >= api.MaxEgressObjects {
		return nil, api.Errorf(api.CodeResourceExhausted, "egress %s: the cluster keeps at most %d Egress objects: delete unused ones with kibo egress delete NAME", a.Name, api.MaxEgressObjects)
	}
	r := &egressRecord{Name: a.Name, Revision: 1, SOCKS5: socks5, Username: a.Username, PasswordSet: a.Password != "",
		CreatedAt: *at(e), UpdatedAt: *at(e), Version: 1}
	if err := putRevision(tx, r, &egressRevision{Revision: 1, SOCKS5: socks5, Username: a.Username, Password: a.Password, CreatedAt: *at(e)}); err != nil {
		return nil, err
	}
	return egressView(tx, r), nil
}

// applyEgressUpdate makes a new revision. It moves no Workspace: each
// keeps the revision its policy records until a set-network naming the
// Egress or its next start. An update that changes nothing is no new
// revision.
func applyEgressUpdate(tx *bolt.Tx, e *Entry) (any, error) {
	var a EgressUpdateArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if err := CheckEgressUpdate(a); err != nil {
		return nil, err
	}
	r, err := mustEgress(tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(e, r.Version, "egress "+r.Name); err != nil {
		return nil, err
	}
	cur, err := getRevision(tx, r.Name, r.Revision)
	if err != nil {
		return nil, err
	}
	if cur == nil {
		return nil, fmt.Errorf("egress %s: its latest revision %d is missing", r.Name, r.Revision)
	}
	next := *cur
	if a.SOCKS5 != nil {
		next.SOCKS5, _ = normalizeSOCKS5(a.Name, *a.SOCKS5)
	}
	if a.ClearCredentials {
		next.Username, next.Password = "", ""
	}
	if a.Username != nil {
		next.Username = *a.Username
	}
	if a.Password != nil {
		next.Password = *a.Password
	}
	if err := validCredentials(a.Name, next.Username, next.Password); err != nil {
		return nil, err
	}
	if next.SOCKS5 == cur.SOCKS5 && next.Username == cur.Username && next.Password == cur.Password {
		return egressView(tx, r), nil
	}
	next.Revision, next.CreatedAt = r.Revision+1, *at(e)
	old := r.Revision
	r.Revision, r.SOCKS5, r.Username, r.PasswordSet = next.Revision, next.SOCKS5, next.Username, next.Password != ""
	r.UpdatedAt = *at(e)
	r.Version++
	if err := putRevision(tx, r, &next); err != nil {
		return nil, err
	}
	if err := dropUnusedRevision(tx, r.Name, old); err != nil {
		return nil, err
	}
	return egressView(tx, r), nil
}

func applyEgressDelete(tx *bolt.Tx, e *Entry) (any, error) {
	var a ObjectArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	r, err := mustEgress(tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(e, r.Version, "egress "+r.Name); err != nil {
		return nil, err
	}
	if err := inUse(kindEgress, r.Name, usersOf(tx, bucketEgressRefs, r.Name), egressUsersFix); err != nil {
		return nil, err
	}
	out := egressView(tx, r)
	var drop [][]byte
	prefix := []byte(r.Name + "\x00")
	c := tx.Bucket(bucketEgressRevisions).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		drop = append(drop, append([]byte(nil), k...))
	}
	for _, k := range drop {
		if err := tx.Bucket(bucketEgressRevisions).Delete(k); err != nil {
			return nil, err
		}
	}
	if err := tx.Bucket(bucketEgress).Delete([]byte(r.Name)); err != nil {
		return nil, err
	}
	return out, nil
}

func applyResolverCreate(tx *bolt.Tx, e *Entry) (any, error) {
	var a ResolverCreateArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if err := ValidObjectName(kindResolver, a.Name); err != nil {
		return nil, err
	}
	ups, err := normalizeUpstreams(a.Name, a.Upstreams)
	if err != nil {
		return nil, err
	}
	if old, err := getResolver(tx, a.Name); err != nil {
		return nil, err
	} else if old != nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "resolver %s already exists (upstreams %s): delete it first, or choose another name", a.Name, strings.Join(old.Upstreams, ","))
	}
	if countAtMost(tx, bucketResolvers, api.MaxResolverObjects) >= api.MaxResolverObjects {
		return nil, api.Errorf(api.CodeResourceExhausted, "resolver %s: the cluster keeps at most %d Resolver objects: delete unused ones with kibo resolver delete NAME", a.Name, api.MaxResolverObjects)
	}
	r := &resolverRecord{Name: a.Name, Upstreams: ups, CreatedAt: *at(e), Version: 1}
	if err := putJSON(tx, bucketResolvers, []byte(r.Name), r); err != nil {
		return nil, err
	}
	return resolverView(tx, r), nil
}

func applyResolverDelete(tx *bolt.Tx, e *Entry) (any, error) {
	var a ObjectArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	r, err := mustResolver(tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(e, r.Version, "resolver "+r.Name); err != nil {
		return nil, err
	}
	if err := inUse(kindResolver, r.Name, usersOf(tx, bucketResolverRefs, r.Name), resolverUsersFix); err != nil {
		return nil, err
	}
	out := resolverView(tx, r)
	if err := tx.Bucket(bucketResolvers).Delete([]byte(r.Name)); err != nil {
		return nil, err
	}
	return out, nil
}

// ---------------------------------------------------------------------------
// References of Workspaces

type egressRef struct {
	name string
	rev  uint64
}

// policiesOf are w's policy in force and the one a pending change asks for.
func policiesOf(w *api.Workspace) []*api.NetworkPolicy {
	if w == nil {
		return nil
	}
	var out []*api.NetworkPolicy
	if w.Network != nil {
		out = append(out, w.Network)
	}
	if w.Pending != nil && w.Pending.Network != nil {
		out = append(out, w.Pending.Network)
	}
	return out
}

func usesEgressObject(p *api.NetworkPolicy) bool {
	return p != nil && p.Egress != "" && p.Egress != api.EgressNone && p.Egress != api.EgressPublic
}

func egressRefsOf(w *api.Workspace) []egressRef {
	var out []egressRef
	for _, p := range policiesOf(w) {
		if r := (egressRef{p.Egress, p.EgressRevision}); usesEgressObject(p) && !containsRef(out, r) {
			out = append(out, r)
		}
	}
	return out
}

func containsRef(list []egressRef, r egressRef) bool {
	for _, x := range list {
		if x == r {
			return true
		}
	}
	return false
}

func resolverRefsOf(w *api.Workspace) []string {
	var out []string
	for _, p := range policiesOf(w) {
		if p.Resolver != "" && !containsString(out, p.Resolver) {
			out = append(out, p.Resolver)
		}
	}
	return out
}

// moveRefs replaces old's references to Egress revisions and Resolvers by
// w's (either may be nil) and drops the revisions nothing uses any more.
func moveRefs(tx *bolt.Tx, old, w *api.Workspace) error {
	var id string
	for _, x := range []*api.Workspace{old, w} {
		if x != nil {
			id = x.WorkspaceID
		}
	}
	oldE, newE := egressRefsOf(old), egressRefsOf(w)
	oldR, newR := resolverRefsOf(old), resolverRefsOf(w)
	eb, rb := tx.Bucket(bucketEgressRefs), tx.Bucket(bucketResolverRefs)
	for _, r := range oldE {
		if !containsRef(newE, r) {
			if err := eb.Delete(egressRefKey(r.name, r.rev, id)); err != nil {
				return err
			}
		}
	}
	for _, r := range newE {
		if !containsRef(oldE, r) {
			if err := eb.Put(egressRefKey(r.name, r.rev, id), nil); err != nil {
				return err
			}
		}
	}
	for _, n := range oldR {
		if !containsString(newR, n) {
			if err := rb.Delete(resolverRefKey(n, id)); err != nil {
				return err
			}
		}
	}
	for _, n := range newR {
		if !containsString(oldR, n) {
			if err := rb.Put(resolverRefKey(n, id), nil); err != nil {
				return err
			}
		}
	}
	for _, r := range oldE {
		if !containsRef(newE, r) {
			if err := dropUnusedRevision(tx, r.name, r.rev); err != nil {
				return err
			}
		}
	}
	return nil
}

// dropUnusedRevision deletes revision rev of Egress name unless it is the
// latest or a Workspace still references it.
func dropUnusedRevision(tx *bolt.Tx, name string, rev uint64) error {
	r, err := getEgress(tx, name)
	if err != nil {
		return err
	}
	if r != nil && r.Revision == rev {
		return nil
	}
	prefix := append(revisionKey(name, rev), 0)
	if k, _ := tx.Bucket(bucketEgressRefs).Cursor().Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) {
		return nil
	}
	return tx.Bucket(bucketEgressRevisions).Delete(revisionKey(name, rev))
}

// ---------------------------------------------------------------------------
// Queries

// GetEgress returns one Egress (never its password), or not_found.
func GetEgress(tx *bolt.Tx, name string) (*api.Egress, error) {
	r, err := mustEgress(tx, name)
	if err != nil {
		return nil, err
	}
	return egressView(tx, r), nil
}

// ListEgress returns up to pageSize (0: all) Egress objects by name,
// starting after pageToken.
func ListEgress(tx *bolt.Tx, pageSize int, pageToken string) (*api.EgressList, error) {
	out := &api.EgressList{Egress: []api.Egress{}}
	err := pageOf(tx, bucketEgress, pageSize, pageToken, func(k, v []byte) error {
		var r egressRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("state record %s/%s is corrupt: %w", bucketEgress, k, err)
		}
		out.Egress = append(out.Egress, *egressView(tx, &r))
		return nil
	}, &out.NextPageToken)
	return out, err
}

// GetResolver returns one Resolver, or not_found.
func GetResolver(tx *bolt.Tx, name string) (*api.Resolver, error) {
	r, err := mustResolver(tx, name)
	if err != nil {
		return nil, err
	}
	return resolverView(tx, r), nil
}

// ListResolvers returns up to pageSize (0: all) Resolvers by name,
// starting after pageToken.
func ListResolvers(tx *bolt.Tx, pageSize int, pageToken string) (*api.ResolverList, error) {
	out := &api.ResolverList{Resolvers: []api.Resolver{}}
	err := pageOf(tx, bucketResolvers, pageSize, pageToken, func(k, v []byte) error {
		var r resolverRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("state record %s/%s is corrupt: %w", bucketResolvers, k, err)
		}
		out.Resolvers = append(out.Resolvers, *resolverView(tx, &r))
		return nil
	}, &out.NextPageToken)
	return out, err
}

// pageOf calls fn for up to pageSize keys of bucket after pageToken and
// sets next to the last key when more remain.
func pageOf(tx *bolt.Tx, bucket []byte, pageSize int, pageToken string, fn func(k, v []byte) error, next *string) error {
	c := tx.Bucket(bucket).Cursor()
	var k, v []byte
	if pageToken == "" {
		k, v = c.First()
	} else if k, v = c.Seek([]byte(pageToken)); k != nil && string(k) == pageToken {
		k, v = c.Next()
	}
	var last []byte
	for n := 0; k != nil; k, v = c.Next() {
		if pageSize > 0 && n == pageSize {
			*next = string(last)
			return nil
		}
		if err := fn(k, v); err != nil {
			return err
		}
		last = append(last[:0], k...)
		n++
	}
	return nil
}

// TaskNetwork is what a node needs of the objects policy p names: the
// Egress at the revision p records (without credentials) and the
// Resolver's upstreams. Either is nil when p names none.
func TaskNetwork(tx *bolt.Tx, p *api.NetworkPolicy) (*api.TaskEgress, *api.TaskResolver, error) {
	var te *api.TaskEgress
	var tr *api.TaskResolver
	if p == nil {
		return nil, nil, nil
	}
	if usesEgressObject(p) {
		rev, err := getRevision(tx, p.Egress, p.EgressRevision)
		if err != nil {
			return nil, nil, err
		}
		if rev == nil {
			return nil, nil, api.Errorf(api.CodeInternal, "egress %s revision %d is not kept although a policy uses it", p.Egress, p.EgressRevision)
		}
		te = &api.TaskEgress{Name: p.Egress, Revision: rev.Revision, SOCKS5: rev.SOCKS5, Credentials: rev.Username != ""}
	}
	if p.Resolver != "" {
		r, err := getResolver(tx, p.Resolver)
		if err != nil {
			return nil, nil, err
		}
		if r == nil {
			return nil, nil, api.Errorf(api.CodeInternal, "resolver %s does not exist although a policy uses it", p.Resolver)
		}
		tr = &api.TaskResolver{Name: r.Name, Upstreams: append([]string(nil), r.Upstreams...)}
	}
	return te, tr, nil
}

// EgressCredentials returns revision rev of Egress name with its
// credentials for node, which must run (or be about to run, or be
// changing to) a Workspace whose policy uses exactly that revision.
func EgressCredentials(tx *bolt.Tx, node, name string, rev uint64) (*api.EgressCredentials, error) {
	if err := ValidObjectName(kindEgress, name); err != nil {
		return nil, err
	}
	r, err := getRevision(tx, name, rev)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, api.Errorf(api.CodeNotFound, "egress %s has no revision %d: it was deleted or no Workspace uses that revision any more", name, rev)
	}
	prefix := append(revisionKey(name, rev), 0)
	c := tx.Bucket(bucketEgressRefs).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		w, err := getWorkspace(tx, string(k[len(prefix):]))
		if err != nil {
			return nil, err
		}
		if w != nil && usesOn(w, node, egressRef{name, rev}) {
			return &api.EgressCredentials{Name: name, Revision: r.Revision, SOCKS5: r.SOCKS5, Username: r.Username, Password: r.Password}, nil
		}
	}
	return nil, api.Errorf(api.CodePermissionDenied,
		"node %s runs no Workspace whose network policy uses egress %s revision %d: credentials go only to the node of such a Workspace", node, name, rev)
}

// usesOn: w's execution on node has a policy using ref, or a change
// pending on node asks for one.
func usesOn(w *api.Workspace, node string, ref egressRef) bool {
	uses := func(p *api.NetworkPolicy) bool {
		return usesEgressObject(p) && p.Egress == ref.name && p.EgressRevision == ref.rev
	}
	if w.NodeID == node && w.InstanceID != "" && uses(w.Network) {
		return true
	}
	return w.Pending != nil && w.Pending.NodeID == node && uses(w.Pending.Network)
}
