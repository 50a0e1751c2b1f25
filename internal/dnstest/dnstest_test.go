package dnstest

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// Go's own resolver, pointed at the responder, gets the A record of a
// known name and NXDOMAIN for another; both questions are remembered.
func TestResponder(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	r := Serve(pc, map[string]netip.Addr{"Web.Example.": netip.MustParseAddr("192.0.2.7")})
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := res.LookupHost(ctx, "web.example")
	if err != nil || !slices.Equal(addrs, []string{"192.0.2.7"}) {
		t.Fatalf("web.example: %v, %v; want 192.0.2.7", addrs, err)
	}
	var dnsErr *net.DNSError
	if _, err := res.LookupHost(ctx, "other.example"); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Fatalf("other.example: %v; want not found", err)
	}
	q := r.Questions()
	if !slices.Contains(q, "web.example. TypeA") || !slices.Contains(q, "other.example. TypeA") {
		t.Fatalf("questions %v", q)
	}
}
