package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/trust"
)

// Where the CLI finds an operator credential (issue 44): a node-only
// member's host holds none, so a person brings their own, issued with
// `kibo operator issue`. The first found wins: --credentials DIR (or
// KIBOTOS_CREDENTIALS), the per-user directory, then the operator
// certificate of the local member (ctrl and operator members only).

// Files of a credentials directory (kibo operator issue --out DIR).
const (
	credCACert = "ca.crt"
	credCert   = "operator.crt"
	credKey    = "operator.key"
)

// userCredentialsDir is the per-user credentials directory:
// $XDG_CONFIG_HOME/kibotos/credentials, by default
// ~/.config/kibotos/credentials.
func userCredentialsDir() string {
	if s := os.Getenv("XDG_CONFIG_HOME"); s != "" {
		return filepath.Join(s, "kibotos", "credentials")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".config", "kibotos", "credentials")
}

// findCredentials picks the operator credential by the order above; the
// member data directory d is the last resort.
func (g *Globals) findCredentials(d datadir.Dir) (trust.Client, error) {
	if g.Credentials != "" {
		return loadCredentials(g.Credentials)
	}
	if u := userCredentialsDir(); u != "" {
		if _, err := os.Stat(filepath.Join(u, credCert)); err == nil {
			return loadCredentials(u)
		}
	}
	if d.HasAdminCertificate() {
		tc, err := d.AdminClient()
		if err != nil {
			err = api.Errorf(api.CodeUnauthenticated, "%v", err)
		}
		return tc, err
	}
	return trust.Client{}, api.Errorf(api.CodeUnauthenticated,
		"no operator credential found (looked at --credentials, KIBOTOS_CREDENTIALS, %s and %s): get one with kibo operator issue NAME --out DIR on a ctrl member and pass --credentials DIR",
		dashIfEmpty(userCredentialsDir()), filepath.Dir(d.AdminCert()))
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// loadCredentials reads a credentials directory.
func loadCredentials(dir string) (trust.Client, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, credCert), filepath.Join(dir, credKey))
	if errors.Is(err, os.ErrPermission) {
		return trust.Client{}, api.Errorf(api.CodeUnauthenticated, "operator credential %s is not readable by this user: run as its owner", dir)
	}
	if err != nil {
		return trust.Client{}, api.Errorf(api.CodeUnauthenticated, "operator credential %s: %v; it holds %s, %s and %s as kibo operator issue --out wrote them", dir, err, credCACert, credCert, credKey)
	}
	pem, err := os.ReadFile(filepath.Join(dir, credCACert))
	if err != nil {
		return trust.Client{}, api.Errorf(api.CodeUnauthenticated, "operator credential %s: %v", dir, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return trust.Client{}, api.Errorf(api.CodeUnauthenticated, "operator credential %s: %s holds no certificate", dir, credCACert)
	}
	return trust.Client{Pool: pool, Cert: trust.Static(cert)}, nil
}

// writeCredentials writes a credentials directory: DIR 0700, every file
// 0600; existing files are replaced only with force.
func writeCredentials(dir string, caPEM, certPEM, keyPEM []byte, force bool) error {
	files := []struct {
		name string
		data []byte
	}{{credCACert, caPEM}, {credCert, certPEM}, {credKey, keyPEM}}
	if !force {
		if err := credentialsFree(dir); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("credentials directory %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("credentials directory %s: %w", dir, err)
	}
	for _, f := range files {
		if err := datadir.WriteFileAtomic(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// credentialsFree refuses a directory that already holds a credential's
// file: overwriting one is asked for with --force.
func credentialsFree(dir string) error {
	for _, name := range []string{credCACert, credCert, credKey} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return api.Errorf(api.CodeAlreadyExists, "%s already exists: choose another --out directory or pass --force to replace it", filepath.Join(dir, name))
		}
	}
	return nil
}
