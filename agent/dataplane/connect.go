package dataplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/trust"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// RefusedError is a connection the data plane refused; Code is one of the
// Code* constants (expired: fetch a new credential and retry).
type RefusedError struct {
	NodeID, Address string
	Code, Message   string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("data plane of node %s (%s) refused the connection: %s", e.NodeID, e.Address, e.Message)
}

// Connect opens a guest protocol session to cred's Workspace through the
// data plane of the node that runs it. The server must present the
// data-plane certificate the cluster CA in roots issued to cred.NodeID.
// The returned client offers Exec, ReadFile, WriteFile, Stat, PortForward.
func Connect(ctx context.Context, cred api.DataPlaneCredential, roots *x509.CertPool) (*guestproto.Client, error) {
	if cred.Address == "" || cred.NodeID == "" || cred.Credential == "" {
		return nil, fmt.Errorf("dataplane: connect to workspace %s: the credential lacks address, node or token: request a new one", cred.WorkspaceID)
	}
	if roots == nil {
		return nil, errors.New("dataplane: connect: no cluster CA given: load it from the data directory (tls/ca.crt)")
	}
	d := tls.Dialer{Config: &tls.Config{
		InsecureSkipVerify: true, // the chain and the node are checked by VerifyConnection
		VerifyConnection:   verifyNode(roots, cred.NodeID),
		NextProtos:         []string{ALPN},
		MinVersion:         tls.VersionTLS13,
	}}
	nc, err := d.DialContext(ctx, "tcp", cred.Address)
	if err != nil {
		return nil, fmt.Errorf("dataplane: connect to node %s at %s: %w", cred.NodeID, cred.Address, err)
	}
	conn := nc.(*tls.Conn)
	if p := conn.ConnectionState().NegotiatedProtocol; p != ALPN {
		conn.Close()
		return nil, fmt.Errorf("dataplane: %s is not a data-plane address (protocol %q): check the node's data-plane address", cred.Address, p)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	var reply connectReply
	err = guestproto.WriteFrame(conn, connectRequest{Credential: cred.Credential})
	if err == nil {
		err = guestproto.ReadFrame(conn, &reply)
	}
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("dataplane: connect to node %s at %s: %w", cred.NodeID, cred.Address, context.Cause(ctx))
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("dataplane: connect to node %s at %s: no answer to the credential: %w", cred.NodeID, cred.Address, err)
	}
	if !reply.OK {
		conn.Close()
		return nil, &RefusedError{NodeID: cred.NodeID, Address: cred.Address, Code: reply.Code, Message: reply.Message}
	}
	c, err := guestproto.Dial(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("dataplane: connect to node %s at %s: %w", cred.NodeID, cred.Address, err)
	}
	return c, nil
}

// verifyNode accepts only the data-plane certificate the cluster CA in
// roots issued to nodeID: a credential goes to the node it names and
// nowhere else (not to that node's member port, not to another node).
func verifyNode(roots *x509.CertPool, nodeID string) func(tls.ConnectionState) error {
	return trust.ServerCheck(roots, trust.Want{Kind: trust.KindDataPlane, NodeID: nodeID}, "")
}
