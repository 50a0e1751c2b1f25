package egress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// A routed guest's connections count apart, by outcome, for as long as
// the Config routes it: dropped from it, the guest is forgotten, and
// routed again it starts from zero.
func TestGuestStats(t *testing.T) {
	s, c, listen := listeningServer(t, Options{})
	ctx := ctxT(t)
	// Loopback stands for a guest (as in TestClientAPI).
	guest, other := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.3")
	resolverOnly := Route{Guest: other, Resolver: &Resolver{Name: "r1", Upstreams: []string{"192.0.2.1"}}}
	configure := func(routes ...Route) {
		t.Helper()
		if err := c.SetConfig(ctx, Config{Routes: routes}); err != nil {
			t.Fatal(err)
		}
	}
	// connect opens one guest connection and waits until the process
	// ended it (say is "" for a refused or failed one).
	connect := func(say string) {
		t.Helper()
		conn, err := net.Dial("tcp4", listen)
		if say == "" && errors.Is(err, syscall.ECONNRESET) {
			return // accepted and reset before the dial returned
		}
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if say != "" {
			echo(t, conn, say)
			return
		}
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadAll(conn); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("a refused connection: %v", err)
		}
	}
	want := func(what string, ws ...GuestStats) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("%s: guest stats %+v", what, ws), func() (bool, string) {
			got, err := c.GuestStats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return reflect.DeepEqual(got, ws), fmt.Sprintf("%+v", got)
		})
	}

	socks := newSocksServer(t, "", "")
	proxied := Route{Guest: guest, Egress: &Proxy{Name: "e1", Revision: 1, Address: socks.addr()}}
	configure(proxied, resolverOnly)
	connect("carried")
	dead := proxied
	dead.Egress = &Proxy{Name: "e1", Revision: 2, Address: testenv.LoopbackAddr(t)} // nothing listens
	configure(dead, resolverOnly)
	connect("")
	configure(Route{Guest: guest, Resolver: resolverOnly.Resolver}, resolverOnly)
	connect("")
	want("the guest's three connections", GuestStats{Guest: other}, GuestStats{Guest: guest, Accepted: 3, Failed: 1, Refused: 1})

	configure(resolverOnly)
	want("the guest forgotten", GuestStats{Guest: other})
	configure(proxied, resolverOnly)
	want("the guest from zero", GuestStats{Guest: other}, GuestStats{Guest: guest})
	if st := s.Stats(); st.Accepted != 3 || st.Failed != 1 || st.Refused != 1 {
		t.Fatalf("the totals keep every connection: %+v", st)
	}
}
