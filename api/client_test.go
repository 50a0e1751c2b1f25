package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/trust"
)

// A member that refuses the CLI's certificate at the handshake (a CA it no
// longer trusts) is named as refusing it, exit 18 at once, not as
// unreachable after retries.
func TestRefusedCertificateIsUnauthenticated(t *testing.T) {
	serverCA, err := trust.NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := trust.NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	pair := func(ca *trust.CA, id trust.Identity, hosts []string) tls.Certificate {
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
	admitted := time.Unix(1700000000, 0).UTC()
	srvCert := pair(serverCA, trust.Identity{ClusterID: "c1", Kind: trust.KindMember, NodeID: "n1", Roles: []string{trust.RoleCtrl}, Admitted: admitted}, []string{"127.0.0.1"})
	// The CLI's credential, from a CA the member does not trust.
	cliCert := pair(otherCA, trust.Identity{ClusterID: "c1", Kind: trust.KindAdmin, NodeID: "n1", Admitted: admitted}, nil)
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(serverCA.Cert)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"result":{}}`)) }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{srvCert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs, MinVersion: tls.VersionTLS13}
	var conns atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()

	roots := x509.NewCertPool()
	roots.AddCert(serverCA.Cert)
	c := NewClient(strings.TrimPrefix(srv.URL, "https://"), trust.Client{Pool: roots, Cert: trust.Static(cliCert)})
	_, err = c.Do(context.Background(), "GET", "/v1/nodes", nil, nil)
	if CodeOf(err) != CodeUnauthenticated || !strings.Contains(err.Error(), "refused this CLI's certificate") {
		t.Fatalf("call with a certificate of another CA: %v; want unauthenticated naming the refusal", err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("the member saw %d connections: a refusal was retried as if the member were unreachable", n)
	}
}
