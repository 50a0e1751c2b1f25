package cli

import (
	"crypto/x509"
	"os"

	"github.com/kibotos/kibotos/api"
)

// Remote use (--api-url): the CLI of an application's host holds no
// member data directory and no operator credential, only the URL of a
// ctrl member's API listener, an API key and, for a listener serving a
// certificate of the cluster CA or for the data plane, the cluster CA
// file. Every call then goes to that URL with the key.

// tokenClient is the client of --api-url with --token.
func (g *Globals) tokenClient() (*api.Client, error) {
	if g.Token == "" {
		return nil, api.Errorf(api.CodeUnauthenticated, "--api-url %s needs an API key: pass --token KEY or set KIBOTOS_TOKEN", g.APIURL)
	}
	pool, err := g.apiPool()
	if err != nil {
		return nil, err
	}
	c, err := api.NewTokenClient(g.APIURL, g.Token, pool)
	if err != nil {
		return nil, err
	}
	c.Consistent = g.Consistent
	c.Namespace, c.AllNamespaces = g.Namespace, g.AllNamespaces
	return c, nil
}

// apiPool is what the API listener's certificate is checked against:
// the host's trust store (a certificate from a public CA) and --ca-file
// (the cluster CA's), so that one --ca-file serves the API and the data
// plane whichever certificate the listener has.
func (g *Globals) apiPool() (*x509.CertPool, error) {
	if g.CAFile == "" {
		return nil, nil // the system roots
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool() // a host without a trust store
	}
	return pool, g.addCAFile(pool)
}

// clusterCAPool is --ca-file alone: a node's data plane serves a
// certificate of the cluster CA, and no other CA may vouch for it.
func (g *Globals) clusterCAPool() (*x509.CertPool, error) {
	if g.CAFile == "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "the data plane of the Workspace's node serves a certificate of the cluster CA: give the cluster CA file (tls/ca.crt of a ctrl member) with --ca-file or KIBOTOS_CA_FILE")
	}
	pool := x509.NewCertPool()
	return pool, g.addCAFile(pool)
}

func (g *Globals) addCAFile(pool *x509.CertPool) error {
	pem, err := os.ReadFile(g.CAFile)
	if err != nil {
		return api.Errorf(api.CodeInvalidArgument, "--ca-file: %v; give the PEM file of the CA (tls/ca.crt of a ctrl member for the cluster CA)", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return api.Errorf(api.CodeInvalidArgument, "--ca-file %s holds no PEM certificate; give the PEM file of the CA (tls/ca.crt of a ctrl member for the cluster CA)", g.CAFile)
	}
	return nil
}

// dataPlaneRoots is the cluster CA a node's data plane is checked
// against: --ca-file with --api-url, else the CA of the operator
// credential the API calls use (a person's brings it, off a member's
// host too).
func (g *Globals) dataPlaneRoots() (*x509.CertPool, error) {
	if g.APIURL != "" {
		return g.clusterCAPool()
	}
	tc, err := g.findCredentials(g.dir())
	if err != nil {
		return nil, err
	}
	return tc.Pool, nil
}
