package trust

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"strings"
	"testing"
)

// The fixtures were made by openssl, an encoder independent of ours:
//
//	openssl ecparam -name prime256v1 -genkey -noout -out fixture-ca.key
//	openssl req -x509 -key fixture-ca.key -subj "/CN=kibotos trust fixture" -days 36500 -out fixture-ca.crt
//	openssl ec -in fixture-ca.key -pubout -out fixture-ca.pub
//	openssl x509 -in fixture-ca.crt -noout -fingerprint -sha256
const fixtureFingerprint = "eddd2a904f1373ce531f32e23604d3cf5397dea9673749b28f7c2ccb17d75e5b"

// Grants carry the CA's fingerprint and joining hosts of another build
// compare it: its form must never change.
func TestFingerprint(t *testing.T) {
	c, err := ParseCertPEM(readFixture(t, "fixture-ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if got := Fingerprint(c); got != fixtureFingerprint {
		t.Fatalf("Fingerprint = %s, openssl says %s", got, fixtureFingerprint)
	}
	a, b := newTestCA(t), newTestCA(t)
	fa := Fingerprint(a.Cert)
	if fa == Fingerprint(b.Cert) {
		t.Fatal("two CAs have one fingerprint")
	}
	again, err := ParseCertPEM(a.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if Fingerprint(again) != fa {
		t.Fatal("the fingerprint changes when the certificate is read again")
	}
	if _, err := hex.DecodeString(fa); err != nil || len(fa) != 64 || strings.ToLower(fa) != fa {
		t.Fatalf("fingerprint %q is not 64 lower-case hex digits", fa)
	}
}

// The keys in the data directory and in join requests are read by older
// builds too: the same PEM types, the same encodings as openssl's.
func TestKeyPEMForms(t *testing.T) {
	key, err := ParseKeyPEM(readFixture(t, "fixture-ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	enc, err := EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(enc, readFixture(t, "fixture-ca.key")) {
		t.Fatalf("EncodeKey differs from openssl's EC PRIVATE KEY:\n%s", enc)
	}
	pub := PublicKeyPEM(&key.PublicKey)
	if pub != string(readFixture(t, "fixture-ca.pub")) {
		t.Fatalf("PublicKeyPEM differs from openssl's PUBLIC KEY:\n%s", pub)
	}
	back, err := ParsePublicKeyPEM(pub)
	if err != nil || !back.Equal(&key.PublicKey) {
		t.Fatalf("ParsePublicKeyPEM(PublicKeyPEM(k)) = %v", err)
	}
	c, err := ParseCertPEM(readFixture(t, "fixture-ca.crt"))
	if err != nil || !key.PublicKey.Equal(c.PublicKey) {
		t.Fatalf("the fixture key does not belong to the fixture certificate: %v", err)
	}
}

func TestReadPublicKeyOf(t *testing.T) {
	dir := t.TempDir()
	key, err := ReadPublicKeyOf("testdata/fixture-ca.key")
	if err != nil {
		t.Fatal(err)
	}
	want, err := ParsePublicKeyPEM(string(readFixture(t, "fixture-ca.pub")))
	if err != nil || !key.Equal(want) {
		t.Fatalf("ReadPublicKeyOf = %v, want the fixture's public key", err)
	}
	bad := writeFile(t, dir, "bad.key", []byte("nothing"))
	if _, err := ReadPublicKeyOf(bad); err == nil || !strings.Contains(err.Error(), "key "+bad+": no PEM key") {
		t.Fatalf("ReadPublicKeyOf(garbage) = %v", err)
	}
	if _, err := ReadPublicKeyOf(dir + "/absent"); err == nil {
		t.Fatal("ReadPublicKeyOf(absent file) succeeded")
	}
}

func TestPEMParsersRefuse(t *testing.T) {
	edPub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	edDER, err := x509.MarshalPKIXPublicKey(edPub)
	if err != nil {
		t.Fatal(err)
	}
	block := func(typ string, b []byte) string { return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b})) }
	certPEM := string(readFixture(t, "fixture-ca.crt"))
	keyPEM := string(readFixture(t, "fixture-ca.key"))
	tests := []struct {
		name  string
		parse func(string) error
		in    string
		err   string
	}{
		{"cert: empty", parseCert, "", "no PEM certificate"},
		{"cert: not PEM", parseCert, "MIIB", "no PEM certificate"},
		{"cert: a key", parseCert, keyPEM, "no PEM certificate"},
		{"cert: bad DER", parseCert, block("CERTIFICATE", []byte{0x30, 0x01}), "x509"},
		{"key: empty", parseKey, "", "no PEM key"},
		{"key: a certificate", parseKey, certPEM, "x509"},
		{"key: bad DER", parseKey, block("EC PRIVATE KEY", []byte("junk")), "x509"},
		{"public: empty", parsePub, "", "no PEM block"},
		{"public: bad DER", parsePub, block("PUBLIC KEY", []byte("junk")), "asn1"},
		{"public: not ECDSA", parsePub, block("PUBLIC KEY", edDER), "not an ECDSA key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.parse(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("parse: %v, want an error containing %q", err, tt.err)
			}
		})
	}
}

func parseCert(s string) error { _, err := ParseCertPEM([]byte(s)); return err }
func parseKey(s string) error  { _, err := ParseKeyPEM([]byte(s)); return err }
func parsePub(s string) error  { _, err := ParsePublicKeyPEM(s); return err }

// The parsers read files and request bodies; whatever they accept they
// must write back as the same object.
func FuzzParsePEM(f *testing.F) {
	for _, name := range []string{"fixture-ca.crt", "fixture-ca.key", "fixture-ca.pub"} {
		f.Add(readFixture(f, name))
	}
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("-----BEGIN EC PRIVATE KEY-----\n-----END EC PRIVATE KEY-----\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := ParseCertPEM(b); err == nil {
			again, err := ParseCertPEM(pemEncode(pemCertificate, c.Raw))
			if err != nil || Fingerprint(again) != Fingerprint(c) {
				t.Fatalf("certificate does not read back: %v", err)
			}
		}
		if k, err := ParseKeyPEM(b); err == nil {
			enc, err := EncodeKey(k)
			if err != nil {
				t.Fatalf("EncodeKey of a parsed key: %v", err)
			}
			again, err := ParseKeyPEM(enc)
			if err != nil || !again.Equal(k) {
				t.Fatalf("key does not read back: %v", err)
			}
		}
		if k, err := ParsePublicKeyPEM(string(b)); err == nil {
			again, err := ParsePublicKeyPEM(PublicKeyPEM(k))
			if err != nil || !again.Equal(k) {
				t.Fatalf("public key does not read back: %v", err)
			}
		}
	})
}
