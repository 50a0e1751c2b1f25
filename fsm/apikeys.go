package fsm

import (
	"bytes"
	"encoding/hex"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// API keys (issue 45): the credential of an application, limited to one
// namespace and a role. Ctrl stores the SHA-256 of the secret's random
// part, never the secret: the secret has 160 random bits, so a hash
// that is fast to compute cannot be reversed by guessing, and a request
// is checked without a deliberately slow hash on every call. A key is
// refused on every ctrl member as soon as its revoke is applied there
// (within a heartbeat), and from its expiry on.

// MaxAPIKeys bounds the API keys of a cluster, revoked ones included (a
// name created again reuses its record).
const MaxAPIKeys = 10000

// APIKeyCreateArgs records a key; the leader draws KeyID and the secret,
// and the entry carries only the secret's hash. TTL 0 never expires.
type APIKeyCreateArgs struct {
	Namespace  string        `json:"namespace"`
	Name       string        `json:"name"`
	Role       string        `json:"role"`
	KeyID      string        `json:"key_id"`
	SecretHash string        `json:"secret_hash"`
	TTL        time.Duration `json:"ttl,omitempty"`
}

// APIKeyArgs names one key.
type APIKeyArgs struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// APIKeyMaxTTL bounds a key's lifetime when one is given.
const APIKeyMaxTTL = 10 * 365 * 24 * time.Hour

// apiKeyRecord is a key as stored: its record and the secret's hash.
type apiKeyRecord struct {
	Key        api.APIKey `json:"key"`
	SecretHash string     `json:"secret_hash"`
}

// apiKeyKey is the key of a key's record: its namespace (stored form)
// and name.
func apiKeyKey(ns, name string) []byte { return []byte(api.StoredNamespace(ns) + "\x00" + name) }

func applyAPIKeyCreate(ac *applyCtx) (any, error) {
	var a APIKeyCreateArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := CheckAPIKeyCreate(a); err != nil {
		return nil, err
	}
	if err := ac.scope.permits(a.Namespace, "namespace "+a.Namespace); err != nil {
		return nil, err
	}
	if err := namespaceExists(ac.tx, a.Namespace); err != nil {
		return nil, err
	}
	if b, err := hex.DecodeString(a.SecretHash); err != nil || len(b) != 32 {
		return nil, api.Errorf(api.CodeInvalidArgument, "API key %s: secret hash %.80q is not 64 hex digits", a.Name, a.SecretHash)
	}
	if ac.tx.Bucket(bucketAPIKeyIDs).Get([]byte(a.KeyID)) != nil {
		return nil, api.Errorf(api.CodeAlreadyExists, "API key id %s is taken: create the key again (a new id is drawn)", a.KeyID)
	}
	old, err := getRecord[apiKeyRecord](ac.tx, bucketAPIKeys, apiKeyKey(a.Namespace, a.Name))
	if err != nil {
		return nil, err
	}
	switch {
	case old != nil && old.Key.RevokedAt == nil && (old.Key.ExpiresAt == nil || ac.e.IssuedAt.Before(*old.Key.ExpiresAt)):
		return nil, api.Errorf(api.CodeAlreadyExists, "API key %s already exists in namespace %s: revoke it first (kibo api-key revoke %s -n %s) or choose another name", a.Name, api.ShownNamespace(api.StoredNamespace(a.Namespace)), a.Name, a.Namespace)
	case old != nil:
		if err := ac.tx.Bucket(bucketAPIKeyIDs).Delete([]byte(old.Key.KeyID)); err != nil {
			return nil, err
		}
	case countAtMost(ac.tx, bucketAPIKeys, MaxAPIKeys) >= MaxAPIKeys:
		return nil, api.Errorf(api.CodeResourceExhausted, "API key %s: the cluster keeps at most %d API keys; revoke and reuse a name, or delete an unused namespace", a.Name, MaxAPIKeys)
	}
	k := api.APIKey{Name: a.Name, Namespace: api.ShownNamespace(api.StoredNamespace(a.Namespace)), Role: a.Role, KeyID: a.KeyID, CreatedAt: *at(ac.e), CreatedBy: ac.e.Actor}
	if a.TTL > 0 {
		exp := ac.e.IssuedAt.Add(a.TTL).UTC()
		k.ExpiresAt = &exp
	}
	key := apiKeyKey(a.Namespace, a.Name)
	if err := putJSON(ac.tx, bucketAPIKeys, key, apiKeyRecord{Key: k, SecretHash: a.SecretHash}); err != nil {
		return nil, err
	}
	if err := ac.tx.Bucket(bucketAPIKeyIDs).Put([]byte(a.KeyID), key); err != nil {
		return nil, err
	}
	return apiKeyView(k, ac.e.IssuedAt), nil
}

// CheckAPIKeyCreate validates a create before it enters the log.
func CheckAPIKeyCreate(a APIKeyCreateArgs) error {
	if err := api.ValidKeyName(a.Name); err != nil {
		return err
	}
	if err := api.ValidNamespace(a.Namespace); err != nil {
		return err
	}
	if err := api.ValidKeyRole(a.Role); err != nil {
		return err
	}
	if !api.ValidKeyID(a.KeyID) {
		return api.Errorf(api.CodeInvalidArgument, "API key %s: key id %.40q is not %d base32 characters", a.Name, a.KeyID, api.KeyIDLen)
	}
	if a.TTL < 0 || a.TTL > APIKeyMaxTTL {
		return api.Errorf(api.CodeInvalidArgument, "API key %s: expiry %s is out of range: give at most %dd, or none", a.Name, a.TTL, APIKeyMaxTTL/(24*time.Hour))
	}
	return nil
}

func applyAPIKeyRevoke(ac *applyCtx) (any, error) {
	var a APIKeyArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := ac.scope.permits(a.Namespace, "namespace "+a.Namespace); err != nil {
		return nil, err
	}
	rec, err := getAPIKey(ac.tx, a.Namespace, a.Name)
	if err != nil {
		return nil, err
	}
	if rec.Key.RevokedAt == nil {
		rec.Key.RevokedAt = at(ac.e)
		if err := putJSON(ac.tx, bucketAPIKeys, apiKeyKey(a.Namespace, a.Name), rec); err != nil {
			return nil, err
		}
	}
	return apiKeyView(rec.Key, ac.e.IssuedAt), nil
}

func getAPIKey(tx *bolt.Tx, ns, name string) (*apiKeyRecord, error) {
	if err := api.ValidKeyName(name); err != nil {
		return nil, err
	}
	if err := api.ValidNamespace(ns); err != nil {
		return nil, err
	}
	rec, err := getRecord[apiKeyRecord](tx, bucketAPIKeys, apiKeyKey(ns, name))
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, api.Errorf(api.CodeNotFound, "API key %s does not exist in namespace %s: check the name with kibo api-key list -n %s", name, ns, ns)
	}
	return rec, nil
}

// deleteNamespaceKeys drops every key of namespace ns.
func deleteNamespaceKeys(tx *bolt.Tx, ns string) error {
	prefix := []byte(api.StoredNamespace(ns) + "\x00")
	var keys [][]byte
	var ids []string
	c := tx.Bucket(bucketAPIKeys).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		var rec apiKeyRecord
		if err := jsonRecord(bucketAPIKeys, k, v, &rec); err != nil {
			return err
		}
		keys, ids = append(keys, bytes.Clone(k)), append(ids, rec.Key.KeyID)
	}
	for i, k := range keys {
		if err := tx.Bucket(bucketAPIKeys).Delete(k); err != nil {
			return err
		}
		if err := tx.Bucket(bucketAPIKeyIDs).Delete([]byte(ids[i])); err != nil {
			return err
		}
	}
	return nil
}

// apiKeyView is k with its state as of now.
func apiKeyView(k api.APIKey, now time.Time) api.APIKey {
	switch {
	case k.RevokedAt != nil:
		k.State = api.OperatorRevoked
	case k.ExpiresAt != nil && !now.Before(*k.ExpiresAt):
		k.State = api.OperatorExpired
	default:
		k.State = api.OperatorActive
	}
	return k
}

// ListAPIKeys is the keys of namespace ns ("" for every namespace), by
// namespace and name, their state as of now.
func ListAPIKeys(tx *bolt.Tx, ns string, now time.Time) ([]api.APIKey, error) {
	out := []api.APIKey{}
	var prefix []byte
	if ns != "" {
		prefix = []byte(api.StoredNamespace(ns) + "\x00")
	}
	c := tx.Bucket(bucketAPIKeys).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		var rec apiKeyRecord
		if err := jsonRecord(bucketAPIKeys, k, v, &rec); err != nil {
			return nil, err
		}
		out = append(out, apiKeyView(rec.Key, now))
	}
	return out, nil
}

// KeyCredential is what a member needs to check a presented key.
type KeyCredential struct {
	Key        api.APIKey
	SecretHash []byte
}

// FindAPIKey is the key with id keyID (its state as of now), or nil.
func FindAPIKey(tx *bolt.Tx, keyID string, now time.Time) (*KeyCredential, error) {
	ref := tx.Bucket(bucketAPIKeyIDs).Get([]byte(keyID))
	if ref == nil {
		return nil, nil
	}
	rec, err := getRecord[apiKeyRecord](tx, bucketAPIKeys, ref)
	if err != nil || rec == nil {
		return nil, err
	}
	h, err := hex.DecodeString(rec.SecretHash)
	if err != nil {
		return nil, err
	}
	return &KeyCredential{Key: apiKeyView(rec.Key, now), SecretHash: h}, nil
}

// LookupAPIKey is the key named name in namespace ns, its state as of
// now, or nil (the leader checks a forwarded key caller).
func LookupAPIKey(tx *bolt.Tx, ns, name string, now time.Time) (*api.APIKey, error) {
	rec, err := getRecord[apiKeyRecord](tx, bucketAPIKeys, apiKeyKey(ns, name))
	if err != nil || rec == nil {
		return nil, err
	}
	k := apiKeyView(rec.Key, now)
	return &k, nil
}

// OpAPIKeyUsed records when keys were last used; proposed with
// IgnoreUnknown, since losing it changes no decision.
const OpAPIKeyUsed = "api_key.used"

// MaxKeyUses bounds the keys of one OpAPIKeyUsed.
const MaxKeyUses = 1000

// APIKeyUsedArgs are the ids of keys a member authenticated; the entry's
// time is when they were last used.
type APIKeyUsedArgs struct {
	KeyIDs []string `json:"key_ids"`
}

func applyAPIKeyUsed(ac *applyCtx) (any, error) {
	var a APIKeyUsedArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if len(a.KeyIDs) == 0 || len(a.KeyIDs) > MaxKeyUses {
		return nil, api.Errorf(api.CodeInvalidArgument, "%d key uses in one entry: give 1 to %d", len(a.KeyIDs), MaxKeyUses)
	}
	n := 0
	for _, id := range a.KeyIDs {
		ref := ac.tx.Bucket(bucketAPIKeyIDs).Get([]byte(id))
		if ref == nil {
			continue // revoked and replaced, or its namespace deleted
		}
		ref = bytes.Clone(ref)
		rec, err := getRecord[apiKeyRecord](ac.tx, bucketAPIKeys, ref)
		if err != nil {
			return nil, err
		}
		if rec == nil || (rec.Key.LastUsedAt != nil && !rec.Key.LastUsedAt.Before(ac.e.IssuedAt)) {
			continue
		}
		rec.Key.LastUsedAt = at(ac.e)
		if err := putJSON(ac.tx, bucketAPIKeys, ref, rec); err != nil {
			return nil, err
		}
		n++
	}
	return map[string]int{"recorded": n}, nil
}
