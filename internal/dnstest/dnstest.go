// Package dnstest is a DNS responder for tests that check name resolution
// of a guest or a template: it answers A and AAAA questions for the names
// it is given and remembers every question, so a test can also tell what was
// never asked. It is no resolver: nothing is forwarded.
package dnstest

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Responder answers on one packet connection.
type Responder struct {
	a      map[string][]netip.Addr // fully qualified, lower case
	pc     net.PacketConn
	served chan struct{} // closed when serve returned
	mu     sync.Mutex
	asked  []string
}

// Serve answers on pc until it is closed: A records for the names
// (fully qualified, e.g. "web.example.") of IPv4 addresses, AAAA records
// for those of IPv6 ones, no records for their other types, and NXDOMAIN
// for every other name.
func Serve(pc net.PacketConn, names map[string]netip.Addr) *Responder {
	multi := map[string][]netip.Addr{}
	for n, a := range names {
		multi[n] = []netip.Addr{a}
	}
	return ServeRecords(pc, multi)
}

// ServeRecords is Serve with any number of addresses per name.
func ServeRecords(pc net.PacketConn, names map[string][]netip.Addr) *Responder {
	r := &Responder{a: map[string][]netip.Addr{}, pc: pc, served: make(chan struct{})}
	for n, as := range names {
		r.a[strings.ToLower(n)] = append(r.a[strings.ToLower(n)], as...)
	}
	go func() {
		defer close(r.served)
		r.serve(pc)
	}()
	return r
}

// Close closes the packet connection and returns once the responder
// stopped answering on it. Closing the connection elsewhere ends it too.
func (r *Responder) Close() error {
	err := r.pc.Close()
	<-r.served
	return err
}

// Questions are the questions asked so far, as "name. TypeA".
func (r *Responder) Questions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.asked)
}

func (r *Responder) serve(pc net.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp, err := r.answer(buf[:n]); err == nil {
			pc.WriteTo(resp, from)
		}
	}
}

func (r *Responder) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	name := strings.ToLower(q.Name.String())
	r.mu.Lock()
	r.asked = append(r.asked, name+" "+q.Type.String())
	r.mu.Unlock()
	addrs, known := r.a[name]
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	for _, addr := range addrs {
		var err error
		switch {
		case q.Type == dnsmessage.TypeA && addr.Is4():
			err = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: addr.As4()})
		case q.Type == dnsmessage.TypeAAAA && addr.Is6():
			err = b.AAAAResource(dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeAAAA, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AAAAResource{AAAA: addr.As16()})
		}
		if err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// ListenUDPTCP gives a loopback UDP socket and a TCP listener on the same
// port, as a DNS server has, closed when t ends. The UDP port is picked
// by the kernel and may be taken for TCP by another test running beside
// this one, so it picks again until both are bound.
func ListenUDPTCP(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 100 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp4", pc.LocalAddr().String())
		if err != nil {
			pc.Close()
			continue
		}
		t.Cleanup(func() { ln.Close(); pc.Close() })
		return pc, ln
	}
	t.Fatal("no loopback port free for both UDP and TCP")
	return nil, nil
}
