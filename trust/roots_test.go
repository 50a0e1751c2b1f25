package trust

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"sync"
	"testing"
	"time"
)

// rootsServer accepts TLS connections whose client certificate chains to
// the CAs roots trusts at the handshake, as a member's listener does.
func rootsServer(t *testing.T, roots *Roots, cert tls.Certificate) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13, NextProtos: []string{"t"}}
	conf := &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.ClientCAs = roots.Pool()
		return c, nil
	}}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				tc := tls.Server(c, conf)
				tc.Handshake()
				tc.Close()
			})
		}
	})
	return ln.Addr().String()
}

func keyPair(t *testing.T, ca *CA, id Identity, hosts []string) tls.Certificate {
	t.Helper()
	certPEM, keyPEM, err := ca.IssueKeyPair(id, hosts, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dialWith reports whether a handshake with the client certificate of ca
// went through both ways (server and client trusting roots now).
func dialWith(roots *Roots, cert tls.Certificate, addr string) error {
	c := Client{Roots: roots, Cert: Static(cert)}
	conn, err := c.Dial(context.Background(), "t", Want{Kind: KindMember}, addr, 5*time.Second)
	if err != nil {
		return err
	}
	// TLS 1.3: the server's verdict on the client certificate arrives
	// with the first read.
	var b [1]byte
	_, err = conn.Read(b[:])
	conn.Close()
	if err != nil && err.Error() == "EOF" {
		return nil
	}
	return err
}

func TestRootsSwapTakesEffectAtNextHandshake(t *testing.T) {
	oldCA, newCA := newTestCA(t), newTestCA(t)
	roots, err := NewRoots(oldCA.Cert)
	if err != nil {
		t.Fatal(err)
	}
	// The server presents a certificate of each CA in turn; one of the
	// old CA until the overlap.
	srvOld := keyPair(t, oldCA, memberID("srv", RoleCtrl), []string{"127.0.0.1"})
	srvNew := keyPair(t, newCA, memberID("srv", RoleCtrl), []string{"127.0.0.1"})
	cliOld := keyPair(t, oldCA, memberID("cli", RoleNode), nil)
	cliNew := keyPair(t, newCA, memberID("cli", RoleNode), nil)
	addrOld := rootsServer(t, roots, srvOld)
	addrNew := rootsServer(t, roots, srvNew)

	if err := dialWith(roots, cliOld, addrOld); err != nil {
		t.Fatalf("old CA only, old certificates: %v", err)
	}
	if err := dialWith(roots, cliNew, addrOld); err == nil {
		t.Fatal("a client certificate of a CA not trusted yet was accepted")
	}
	if err := roots.Set([]*x509.Certificate{oldCA.Cert, newCA.Cert}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cert tls.Certificate
		addr string
	}{{cliOld, addrOld}, {cliNew, addrOld}, {cliOld, addrNew}, {cliNew, addrNew}} {
		if err := dialWith(roots, c.cert, c.addr); err != nil {
			t.Fatalf("during the overlap every combination must work: %v", err)
		}
	}
	if err := roots.Set([]*x509.Certificate{newCA.Cert}); err != nil {
		t.Fatal(err)
	}
	if err := dialWith(roots, cliNew, addrNew); err != nil {
		t.Fatalf("new CA only, new certificates: %v", err)
	}
	if err := dialWith(roots, cliOld, addrNew); err == nil {
		t.Fatal("a client certificate of the dropped CA was accepted")
	}
	if err := dialWith(roots, cliNew, addrOld); err == nil {
		t.Fatal("a server certificate of the dropped CA was accepted")
	}
	if roots.Trusts(oldCA.Cert) || !roots.Trusts(newCA.Cert) || len(roots.Fingerprints()) != 1 {
		t.Fatalf("trusted set after the drop: %v", roots.Fingerprints())
	}
}

// TestRootsSwapUnderConcurrentHandshakes is for the race detector: sets
// swapped while handshakes read them; a certificate of the CA trusted
// throughout is never refused.
func TestRootsSwapUnderConcurrentHandshakes(t *testing.T) {
	keep, other := newTestCA(t), newTestCA(t)
	roots, err := NewRoots(keep.Cert)
	if err != nil {
		t.Fatal(err)
	}
	addr := rootsServer(t, roots, keyPair(t, keep, memberID("srv", RoleCtrl), []string{"127.0.0.1"}))
	cli := keyPair(t, keep, memberID("cli", RoleNode), nil)
	done := make(chan struct{})
	var swapper sync.WaitGroup
	swapper.Go(func() {
		sets := [][]*x509.Certificate{{keep.Cert, other.Cert}, {keep.Cert}, {other.Cert, keep.Cert}}
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if err := roots.Set(sets[i%len(sets)]); err != nil {
				t.Error(err)
				return
			}
		}
	})
	errs := make(chan error, 4)
	var dialers sync.WaitGroup
	for range 4 {
		dialers.Go(func() {
			for range 10 {
				if err := dialWith(roots, cli, addr); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	dialers.Wait()
	close(done)
	swapper.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a certificate of the CA trusted throughout was refused: %v", err)
	}
}

func TestRootsRefuseAnEmptySetAndNonCA(t *testing.T) {
	ca := newTestCA(t)
	roots, err := NewRoots(ca.Cert)
	if err != nil {
		t.Fatal(err)
	}
	if err := roots.Set(nil); err == nil {
		t.Fatal("an empty set was taken")
	}
	leaf := keyPair(t, ca, memberID("n1", RoleNode), nil)
	if err := roots.Set([]*x509.Certificate{leaf.Leaf}); err == nil {
		t.Fatal("a leaf certificate was taken as a CA")
	}
	if !roots.Trusts(ca.Cert) {
		t.Fatal("a refused Set changed the set")
	}
	got, err := ParseCertsPEM(append(append([]byte{}, ca.CertPEM...), roots.Bundle()...))
	if err != nil || len(got) != 2 {
		t.Fatalf("bundle: %d certificates, %v", len(got), err)
	}
}
