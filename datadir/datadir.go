// Package datadir owns the layout of a member's data directory: its
// identity, its TLS material and where Raft, state and node records live.
// It reads and writes those files (root-only, temp file then rename) and
// builds TLS configs from them; it never talks to the network.
package datadir

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/kibotos/kibotos/internal/recordfmt"
	"github.com/kibotos/kibotos/trust"

	"github.com/kibotos/kibotos/storagepool"
)

// Dir is a member data directory.
type Dir string

// SystemDir is the data directory of a member installed as a service.
const SystemDir = "/var/lib/kibotos"

func (d Dir) path(parts ...string) string {
	return filepath.Join(append([]string{string(d)}, parts...)...)
}

func (d Dir) IdentityFile() string { return d.path("identity.json") }
func (d Dir) CACert() string       { return d.path("tls", "ca.crt") }
func (d Dir) CAKey() string        { return d.path("tls", "ca.key") }

// CANextCert and CANextKey are the CA a rotation moves to, on ctrl
// members from its begin until its finish makes them ca.crt and ca.key.
func (d Dir) CANextCert() string  { return d.path("tls", "ca-next.crt") }
func (d Dir) CANextKey() string   { return d.path("tls", "ca-next.key") }
func (d Dir) MemberCert() string  { return d.path("tls", "member.crt") }
func (d Dir) MemberKey() string   { return d.path("tls", "member.key") }
func (d Dir) AdminCert() string   { return d.path("tls", "admin.crt") }
func (d Dir) AdminKey() string    { return d.path("tls", "admin.key") }
func (d Dir) RaftDir() string     { return d.path("raft") }
func (d Dir) StateFile() string   { return d.path("state", "fsm.db") }
func (d Dir) NodeDir() string     { return d.path("node") }
func (d Dir) StorageRoot() string { return d.path("storage") }
func (d Dir) LockFile() string    { return d.path("lock") }

// ArtifactsDir is the artifact store of a one-host cluster (kibotos dev);
// a cluster of several hosts configures a shared one ([artifacts] url).
func (d Dir) ArtifactsDir() string { return d.path("artifacts") }

// Identity is who this member is in which cluster.
type Identity struct {
	// FormatVersion of identity.json; files of builds before it had one
	// are version 1.
	FormatVersion int      `json:"format_version"`
	ClusterID     string   `json:"cluster_id"`
	NodeID        string   `json:"node_id"`
	Roles         []string `json:"roles"`
	Advertise     string   `json:"advertise"`
	GossipKey     []byte   `json:"gossip_key"`
	CAFingerprint string   `json:"ca_fingerprint"`
	// Peers are API addresses of ctrl members known when this member was
	// created; gossip keeps the live list, these seed it after a restart.
	Peers []string `json:"peers"`
}

// HasRole reports whether the identity has the role.
func (id *Identity) HasRole(role string) bool {
	for _, r := range id.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// Exists reports whether the directory already holds a member.
func (d Dir) Exists() bool {
	_, err := os.Stat(d.IdentityFile())
	return err == nil
}

// LoadIdentity reads identity.json.
func (d Dir) LoadIdentity() (*Identity, error) {
	raw, err := os.ReadFile(d.IdentityFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("data directory %s holds no kibotos member: run kibotos init or kibotos join first, or pass --data-dir", d)
	}
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w", d, err)
	}
	if err := identityRange.CheckJSON(d.IdentityFile(), raw, 1); err != nil {
		return nil, fmt.Errorf("identity file %w", err)
	}
	var id Identity
	if err := json.Unmarshal(raw, &id); err != nil {
		return nil, fmt.Errorf("identity file %s is corrupt: %w", d.IdentityFile(), err)
	}
	return &id, nil
}

// identityRange is the formats of identity.json this build reads.
var identityRange = recordfmt.Current(1)

// SaveIdentity writes identity.json.
func (d Dir) SaveIdentity(id *Identity) error {
	id.FormatVersion = identityRange.Max
	raw, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(d.IdentityFile(), raw, 0o600)
}

// WriteFileAtomic writes to a temp file in the same directory, syncs it and
// renames it over path, so readers see the old or the new file, never half.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return storagepool.WriteFile(path, data, mode, storagepool.Temp{Purpose: "record"})
}

// Lock takes the exclusive lock of the data directory for a serving
// process; a second `kibotos serve` on the same directory is refused.
func (d Dir) Lock() (release func(), err error) {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(d.LockFile(), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("data directory %s is in use by another kibotos serve; stop it first or use another --data-dir", d)
	}
	return func() { f.Close() }, nil
}

// CARoots are the CAs the member trusts (ca.crt: the cluster CA, or the
// old and the new one during a rotation), swappable at run time.
func (d Dir) CARoots() (*trust.Roots, error) {
	raw, err := os.ReadFile(d.CACert())
	if err != nil {
		return nil, fmt.Errorf("cluster CA %s: %w", d.CACert(), err)
	}
	certs, err := trust.ParseCertsPEM(raw)
	if err != nil {
		return nil, fmt.Errorf("cluster CA %s: %w", d.CACert(), err)
	}
	return trust.NewRoots(certs...)
}

// CAPool returns a pool holding the cluster CA.
func (d Dir) CAPool() (*x509.CertPool, error) {
	pem, err := os.ReadFile(d.CACert())
	if err != nil {
		return nil, fmt.Errorf("cluster CA %s: %w", d.CACert(), err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("cluster CA %s holds no certificate", d.CACert())
	}
	return pool, nil
}

// HasAdminCertificate says whether the directory holds its host's
// operator certificate: ctrl and operator members do, others not (issue
// 44; a build before it gave every member one).
func (d Dir) HasAdminCertificate() bool {
	_, err := os.Stat(d.AdminCert())
	return err == nil
}

// RemoveAdminCertificate removes the host's operator certificate and key,
// if any, and says whether there were any: a member without the ctrl or
// operator role keeps none.
func (d Dir) RemoveAdminCertificate() (bool, error) {
	found := false
	for _, f := range []string{d.AdminCert(), d.AdminKey()} {
		err := os.Remove(f)
		if err == nil {
			found = true
		} else if !errors.Is(err, os.ErrNotExist) {
			return found, fmt.Errorf("remove the leftover operator credential %s: %w", f, err)
		}
	}
	return found, nil
}

// AdminCertificate loads the CLI's credentials.
func (d Dir) AdminCertificate() (tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(d.AdminCert(), d.AdminKey())
	if errors.Is(err, os.ErrPermission) {
		return c, fmt.Errorf("credentials in %s are readable by root only: run the command as root", filepath.Dir(d.AdminCert()))
	}
	if err != nil {
		return c, fmt.Errorf("admin credentials in %s: %w", filepath.Dir(d.AdminCert()), err)
	}
	return c, nil
}

// MemberCertificate loads this member's identity certificate.
func (d Dir) MemberCertificate() (tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(d.MemberCert(), d.MemberKey())
	if err != nil {
		return c, fmt.Errorf("member credentials in %s: %w", filepath.Dir(d.MemberCert()), err)
	}
	return c, nil
}
