package api

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Namespaces (tenants): Workspaces, Volumes and API keys belong to one.
// The namespace "default" always exists and holds everything made before
// namespaces; records of it store the empty namespace, so that they are
// byte for byte what an older build wrote.

// DefaultNamespace is the namespace of objects that name none.
const DefaultNamespace = "default"

// MaxNamespaces bounds the namespaces of a cluster.
const MaxNamespaces = 1000

var namespaceNamePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidNamespace checks a namespace name: a DNS label, as Kubernetes and
// Nomad name theirs, so that it can appear in host names and paths.
func ValidNamespace(ns string) error {
	if !namespaceNamePattern.MatchString(ns) {
		return Errorf(CodeInvalidArgument, "namespace %.80q is not valid: use 1-63 lower-case letters, digits or '-', starting and ending with a letter or digit", ns)
	}
	return nil
}

// StoredNamespace is how a record stores namespace ns: "" for default.
func StoredNamespace(ns string) string {
	if ns == DefaultNamespace {
		return ""
	}
	return ns
}

// ShownNamespace is the name of a stored namespace: default for "".
func ShownNamespace(stored string) string {
	if stored == "" {
		return DefaultNamespace
	}
	return stored
}

// Namespace is one namespace with what it holds.
type Namespace struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
	// Usage is derived when read: what the namespace's objects take.
	Usage NamespaceUsage `json:"usage"`
	// Quota bounds it; absent: no bound (default never has one).
	Quota *NamespaceQuota `json:"quota,omitempty"`
	// Defaults are its Workspaces' lifetime defaults.
	Defaults *NamespaceDefaults `json:"defaults,omitempty"`
}

// NamespaceUsage counts a namespace's objects.
type NamespaceUsage struct {
	// What counts against the quota (not kept for default).
	NamespaceResources
	Workspaces int `json:"workspaces"`
	Volumes    int `json:"volumes"`
	APIKeys    int `json:"api_keys"`
	Egress     int `json:"egress"`
	Resolvers  int `json:"resolvers"`
}

// NamespaceQuotaRequest changes a namespace's quota: the fields of Set
// that are given replace the quota's, Clear lifts the named ones.
type NamespaceQuotaRequest struct {
	WriteMeta
	Set   NamespaceQuota `json:"set"`
	Clear []string       `json:"clear,omitempty"`
}

// NamespaceCreateRequest creates a namespace.
type NamespaceCreateRequest struct {
	WriteMeta
	Name string `json:"name"`
}

// API key roles: what a key may do within its namespace.
const (
	// KeyRoleSandbox: the namespace's Workspace lifecycle, their
	// data-plane credentials and logs, and its Volumes.
	KeyRoleSandbox = "sandbox"
	// KeyRoleNamespaceAdmin: also the namespace's API keys.
	KeyRoleNamespaceAdmin = "namespace-admin"
)

// ValidKeyRole checks an API key role.
func ValidKeyRole(role string) error {
	if role != KeyRoleSandbox && role != KeyRoleNamespaceAdmin {
		return Errorf(CodeInvalidArgument, "role %.40q is not an API key role: use sandbox or namespace-admin", role)
	}
	return nil
}

var keyNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidKeyName checks an API key's name.
func ValidKeyName(name string) error {
	if !keyNamePattern.MatchString(name) {
		return Errorf(CodeInvalidArgument, "API key name %.80q is not valid: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// APIKey is the record of an API key; the secret is never stored, only
// its hash (which no answer carries).
type APIKey struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Role      string `json:"role"`
	// KeyID is the public part of the secret, by which a request's key is
	// found.
	KeyID     string     `json:"key_id"`
	CreatedAt time.Time  `json:"created_at"`
	CreatedBy string     `json:"created_by,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// LastUsedAt is when a ctrl member last authenticated it, recorded
	// at most a minute apart and up to a quarter minute late.
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	// State is derived when read: active, revoked or expired.
	State string `json:"state"`
}

// APIKeyCreateRequest creates a key; TTL (such as 2160h or 90d) empty is
// a key that does not expire.
type APIKeyCreateRequest struct {
	WriteMeta
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Role      string `json:"role"`
	TTL       string `json:"ttl,omitempty"`
	// KeyID and SecretHash (hex SHA-256 of the secret's random part)
	// when the caller drew the secret; both empty: ctrl draws it and
	// answers with it.
	KeyID      string `json:"key_id,omitempty"`
	SecretHash string `json:"secret_hash,omitempty"`
}

// APIKeyCreated is a new key with its secret, shown this once.
type APIKeyCreated struct {
	APIKey APIKey `json:"api_key"`
	Secret string `json:"secret"`
}

// The secret of an API key is "kbt_" KEYID "_" SECRET: the key id finds
// the record, the rest is checked against its hash.
const (
	keySecretPrefix = "kbt_"
	// KeyIDLen and keySecretLen are in characters of base32 (lower case,
	// no padding): 80 and 160 random bits.
	KeyIDLen     = 16
	keySecretLen = 32
)

// FormatKeySecret is the secret of key id with random part secret.
func FormatKeySecret(id, secret string) string { return keySecretPrefix + id + "_" + secret }

var keyPartPattern = regexp.MustCompile(`^[a-z2-7]+$`)

// ParseKeySecret splits a presented secret into its key id and random
// part; ok is false for anything not shaped like one of ours.
func ParseKeySecret(s string) (id, secret string, ok bool) {
	rest, found := strings.CutPrefix(s, keySecretPrefix)
	if !found || len(rest) != KeyIDLen+1+keySecretLen || rest[KeyIDLen] != '_' {
		return "", "", false
	}
	id, secret = rest[:KeyIDLen], rest[KeyIDLen+1:]
	if !keyPartPattern.MatchString(id) || !keyPartPattern.MatchString(secret) {
		return "", "", false
	}
	return id, secret, true
}

// ValidKeyID checks the key id part.
func ValidKeyID(id string) bool { return len(id) == KeyIDLen && keyPartPattern.MatchString(id) }

// NewKeySecret draws a key: its id, the secret to hand out and the hex
// SHA-256 of the secret's random part, which is all ctrl stores.
func NewKeySecret() (id, secret, hash string) {
	id, rnd := newKeyPart(KeyIDLen), newKeyPart(keySecretLen)
	return id, FormatKeySecret(id, rnd), KeySecretHash(rnd)
}

// KeySecretHash is the stored hash of a secret's random part.
func KeySecretHash(random string) string {
	sum := sha256.Sum256([]byte(random))
	return hex.EncodeToString(sum[:])
}

var keyEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// newKeyPart draws n characters of lower-case base32 (5 random bits each).
func newKeyPart(n int) string {
	b := make([]byte, (n*5+7)/8)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return strings.ToLower(keyEncoding.EncodeToString(b))[:n]
}

// NamespaceResources is what a namespace's objects take of its quota.
type NamespaceResources struct {
	RunningWorkspaces int    `json:"running_workspaces"`
	CPU               Milli  `json:"cpu"`
	MemoryBytes       uint64 `json:"memory_bytes"`
	VolumeBytes       uint64 `json:"volume_bytes"`
	SnapshotBytes     uint64 `json:"snapshot_bytes"`
}

// Add is r plus o.
func (r NamespaceResources) Add(o NamespaceResources) NamespaceResources {
	return NamespaceResources{r.RunningWorkspaces + o.RunningWorkspaces, r.CPU + o.CPU, r.MemoryBytes + o.MemoryBytes, r.VolumeBytes + o.VolumeBytes, r.SnapshotBytes + o.SnapshotBytes}
}

// Sub is r minus o.
func (r NamespaceResources) Sub(o NamespaceResources) NamespaceResources {
	return NamespaceResources{r.RunningWorkspaces - o.RunningWorkspaces, r.CPU - o.CPU, r.MemoryBytes - o.MemoryBytes, r.VolumeBytes - o.VolumeBytes, r.SnapshotBytes - o.SnapshotBytes}
}

// NamespaceQuota bounds what a namespace's objects take; a nil field
// is not bounded. CPU is in thousandths of a vCPU.
type NamespaceQuota struct {
	RunningWorkspaces *uint64 `json:"running_workspaces,omitempty"`
	CPU               *uint64 `json:"cpu,omitempty"`
	MemoryBytes       *uint64 `json:"memory_bytes,omitempty"`
	VolumeBytes       *uint64 `json:"volume_bytes,omitempty"`
	SnapshotBytes     *uint64 `json:"snapshot_bytes,omitempty"`
}

// QuotaFields are the names of a quota's fields, as Clear takes them.
var QuotaFields = []string{"running_workspaces", "cpu", "memory", "volume_bytes", "snapshot_bytes"}

func (q *NamespaceQuota) fields() []**uint64 {
	return []**uint64{&q.RunningWorkspaces, &q.CPU, &q.MemoryBytes, &q.VolumeBytes, &q.SnapshotBytes}
}

// Apply sets the fields set gives and lifts those clear names.
func (q *NamespaceQuota) Apply(set NamespaceQuota, clear []string) error {
	dst, src := q.fields(), set.fields()
	for i := range dst {
		if *src[i] != nil {
			v := **src[i]
			*dst[i] = &v
		}
	}
	for _, name := range clear {
		i := slices.Index(QuotaFields, name)
		if i < 0 {
			return Errorf(CodeInvalidArgument, "quota %.40q is unknown: use %s", name, strings.Join(QuotaFields, ", "))
		}
		*dst[i] = nil
	}
	return nil
}

// NamespaceDefaults are a namespace's lifetime defaults: the timeout and
// action of a Workspace created without one, and the longest timeout
// (0: none) its Workspaces may have.
type NamespaceDefaults struct {
	TimeoutSeconds    int64  `json:"timeout_seconds,omitempty"`
	OnTimeout         string `json:"on_timeout,omitempty"`
	MaxTimeoutSeconds int64  `json:"max_timeout_seconds,omitempty"`
}

// Check refuses defaults out of bounds, or a default over the maximum.
func (d NamespaceDefaults) Check(ns string) error {
	for _, s := range []int64{d.TimeoutSeconds, d.MaxTimeoutSeconds} {
		if s < 0 || s > int64(MaxTimeout/time.Second) {
			return Errorf(CodeInvalidArgument, "namespace %s: timeout %ds is out of range: give 0 to %s", ns, s, MaxTimeout)
		}
	}
	if err := CheckTimeoutAction(d.OnTimeout); err != nil {
		return err
	}
	if d.MaxTimeoutSeconds > 0 && d.TimeoutSeconds > d.MaxTimeoutSeconds {
		return Errorf(CodeInvalidArgument, "namespace %s: default timeout %s is over the maximum %s", ns, time.Duration(d.TimeoutSeconds)*time.Second, time.Duration(d.MaxTimeoutSeconds)*time.Second)
	}
	return nil
}

// NamespaceDefaultsRequest replaces a namespace's lifetime defaults;
// durations as ParseTimeout reads them, "" or "0" for none.
type NamespaceDefaultsRequest struct {
	WriteMeta
	Timeout    string `json:"timeout,omitempty"`
	OnTimeout  string `json:"on_timeout,omitempty"`
	MaxTimeout string `json:"max_timeout,omitempty"`
}

// NamespaceCounters count what happened in a namespace, in the state.
type NamespaceCounters struct {
	// Timeouts are the timeout actions done, by action.
	Timeouts map[string]uint64 `json:"timeouts,omitempty"`
}
