package trust

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestNewCA(t *testing.T) {
	ca := newTestCA(t)
	c := ca.Cert
	if !c.IsCA || !c.BasicConstraintsValid || c.Subject.CommonName != "kibotos cluster c1 CA" {
		t.Fatalf("CA certificate: CA %v, constraints %v, subject %q", c.IsCA, c.BasicConstraintsValid, c.Subject.CommonName)
	}
	if got := c.NotAfter.Sub(c.NotBefore); got < caValidity || got > caValidity+time.Hour+time.Second {
		t.Fatalf("CA valid for %v, want %v and the hour it is backdated", got, caValidity)
	}
	parsed, err := ParseCertPEM(ca.CertPEM)
	if err != nil || !parsed.Equal(c) {
		t.Fatalf("CertPEM is not Cert: %v", err)
	}
	if !ca.Key.PublicKey.Equal(c.PublicKey) {
		t.Fatal("the CA key does not belong to its certificate")
	}
}

func TestLoadCA(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t)
	keyPEM, err := EncodeKey(ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	certPath := writeFile(t, dir, "ca.crt", ca.CertPEM)
	keyPath := writeFile(t, dir, "ca.key", keyPEM)
	missing := filepath.Join(dir, "absent")
	garbage := writeFile(t, dir, "garbage", []byte("not PEM at all\n"))
	wrongType := writeFile(t, dir, "key-as-cert", keyPEM)
	otherKey, err := EncodeKey(newTestCA(t).Key)
	if err != nil {
		t.Fatal(err)
	}
	otherKeyPath := writeFile(t, dir, "other.key", otherKey)

	t.Run("certificate and key", func(t *testing.T) {
		got, err := LoadCA(certPath, keyPath)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Cert.Equal(ca.Cert) || string(got.CertPEM) != string(ca.CertPEM) || got.Key == nil || !got.Key.Equal(ca.Key) {
			t.Fatal("LoadCA does not give back the CA that was written")
		}
	})
	t.Run("no key file: a verifier", func(t *testing.T) {
		got, err := LoadCA(certPath, missing)
		if err != nil || got.Key != nil {
			t.Fatalf("LoadCA = key %v, %v; want the certificate alone", got.Key != nil, err)
		}
	})
	t.Run("no key path", func(t *testing.T) {
		got, err := LoadCA(certPath, "")
		if err != nil || got.Key != nil {
			t.Fatalf("LoadCA = key %v, %v; want the certificate alone", got.Key != nil, err)
		}
	})
	// A member with a foreign ca.key would start and sign certificates no
	// one accepts: it is refused.
	t.Run("key of another CA", func(t *testing.T) {
		got, err := LoadCA(certPath, otherKeyPath)
		if err == nil || !strings.Contains(err.Error(), "is not the key of the CA certificate") {
			t.Fatalf("LoadCA = %v, %v; want the mismatch refused", got, err)
		}
	})
	for _, tt := range []struct {
		name, cert, key string
		err             string
		notExist        bool
	}{
		{name: "missing certificate", cert: missing, key: keyPath, notExist: true},
		{name: "garbage certificate", cert: garbage, key: keyPath, err: "CA certificate " + garbage + ": no PEM certificate"},
		{name: "key where the certificate belongs", cert: wrongType, key: keyPath, err: "no PEM certificate"},
		{name: "garbage key", cert: certPath, key: garbage, err: "CA key " + garbage + ": no PEM key"},
		{name: "certificate where the key belongs", cert: certPath, key: certPath, err: "CA key " + certPath},
		{name: "key path is a directory", cert: certPath, key: dir, err: "is a directory"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := LoadCA(tt.cert, tt.key)
			switch {
			case err == nil:
				t.Fatalf("LoadCA = %+v, want an error", got)
			case tt.notExist && !errors.Is(err, os.ErrNotExist):
				t.Fatalf("LoadCA: %v, want a not-exist error", err)
			case !tt.notExist && !strings.Contains(err.Error(), tt.err):
				t.Fatalf("LoadCA: %v, want an error containing %q", err, tt.err)
			}
		})
	}
}

// During a rotation ca.crt holds both CAs; the CA is the one whose key
// ca.key holds: the old one until the finish, the new one when a crash
// came between the finish's two renames (ca.key already the new key).
func TestLoadCAFromABundle(t *testing.T) {
	old, next := newTestCA(t), newTestCA(t)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if err := os.WriteFile(certPath, append(append([]byte{}, old.CertPEM...), next.CertPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		key  *CA
	}{{"during the rotation", old}, {"after a crash in the finish", next}} {
		k, err := EncodeKey(c.key.Key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyPath, k, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := LoadCA(certPath, keyPath)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if Fingerprint(got.Cert) != Fingerprint(c.key.Cert) || string(got.CertPEM) != string(c.key.CertPEM) {
			t.Fatalf("%s: loaded the CA of the other key", c.name)
		}
	}
	// Without a key (node-only members) the first is the cluster CA.
	got, err := LoadCA(certPath, filepath.Join(dir, "none"))
	if err != nil || Fingerprint(got.Cert) != Fingerprint(old.Cert) {
		t.Fatalf("without a key: %v", err)
	}
}
