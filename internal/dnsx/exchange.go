// Package dnsx holds the DNS client steps the node's resolvers share: the
// egress process's (Resolver objects) and the node's domain filter.
package dnsx

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// DialFunc opens a connection to a DNS server; a resolver serving guests
// of another network namespace dials from that namespace with one.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Exchange sends q to srv over UDP, again over TCP when the answer is
// truncated, and checks the answer is for q's question. dial nil dials
// from this thread's network namespace.
func Exchange(ctx context.Context, dial DialFunc, q *dns.Msg, srv netip.AddrPort, timeout time.Duration) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	r, err := exchangeOver(ctx, dial, "udp", q, srv)
	if err == nil && r.Truncated {
		r, err = exchangeOver(ctx, dial, "tcp", q, srv)
	}
	if err != nil {
		return nil, err
	}
	if !SameQuestion(q, r) {
		return nil, errors.New("the answer is for another question")
	}
	return r, nil
}

func exchangeOver(ctx context.Context, dial DialFunc, network string, q *dns.Msg, srv netip.AddrPort) (*dns.Msg, error) {
	conn, err := dial(ctx, network, srv.String())
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	co := &dns.Conn{Conn: conn}
	if network == "udp" {
		// As large an answer as a guest could take over UDP.
		co.UDPSize = dns.DefaultMsgSize
	}
	if err := co.WriteMsg(q); err != nil {
		return nil, err
	}
	for {
		r, err := co.ReadMsg()
		if err != nil {
			return nil, err
		}
		// Over UDP a stray datagram may come first: only q's answer ends it.
		if r.Id == q.Id {
			return r, nil
		}
	}
}

// SameQuestion says whether r answers q's question.
func SameQuestion(q, r *dns.Msg) bool {
	if len(q.Question) != len(r.Question) {
		return false
	}
	for i, a := range q.Question {
		b := r.Question[i]
		if a.Qtype != b.Qtype || a.Qclass != b.Qclass || !strings.EqualFold(a.Name, b.Name) {
			return false
		}
	}
	return true
}
