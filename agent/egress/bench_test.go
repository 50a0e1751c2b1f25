package egress

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"
)

// BenchmarkConnect is a guest's TCP connect and first byte from a server
// in the lab's internet: "direct" is public egress (the node forwards
// it), "egress" goes through TPROXY, the egress process (with the
// product's warm pool; EGRESS_WARM=0 for none) and microsocks across the
// same namespaces. The egress run reports its ratio to direct; the
// issue's target is 1.2.
//
// Here the internet is a veth pair away: no network latency, so the
// figures are the CPU and wake-ups of each hop (two proxies, on two
// cores). BenchmarkConnectWAN is the same across a network.
func BenchmarkConnect(b *testing.B) {
	benchConnect(b, newEgressLab(b))
}

// BenchmarkConnectWAN is BenchmarkConnect with the internet, its servers
// and the SOCKS5 proxy 5 ms away each way (a 10 ms round trip, a nearby
// region): what a guest sees, where a direct connect and first byte
// costs two round trips, a proxied one with a warm connection one (the
// CONNECT), and without one three (connect, greeting, CONNECT).
// -benchtime 200x: each iteration is tens of milliseconds.
// EGRESS_BENCH_ONE_WAY (a duration, e.g. 1ms) sets another distance.
func BenchmarkConnectWAN(b *testing.B) {
	oneWay := 5 * time.Millisecond
	if v := os.Getenv("EGRESS_BENCH_ONE_WAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("EGRESS_BENCH_ONE_WAY=%q: want a positive duration such as 1ms", v)
		}
		oneWay = d
	}
	e := newEgressLabAt(b, oneWay)
	b.Logf("round trip across the lab's wire (TCP connect from the node, median of 20): %v", e.connectRTT(b))
	benchConnect(b, e)
}

func benchConnect(b *testing.B, e *egressLab) {
	var direct float64
	connect := func(b *testing.B, port int) {
		addr := fmt.Sprintf("%s:%d", labInternet, port)
		one := make([]byte, 1)
		for b.Loop() {
			c, err := e.lab.Dial("guest", addr, 5*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, one); err != nil {
				b.Fatalf("first byte from %s: %v\n%s", addr, err, e.proc.log())
			}
			c.Close()
		}
	}
	// vsDirect reports a run's time per connect as a ratio to direct's.
	vsDirect := func(b *testing.B) {
		if direct > 0 {
			b.ReportMetric(float64(b.Elapsed())/float64(b.N)/direct, "x-direct")
		}
	}
	b.Run("direct", func(b *testing.B) {
		connect(b, directPort)
		direct = float64(b.Elapsed()) / float64(b.N)
	})
	// The proxy's own share: a SOCKS5 client in the node namespace (where
	// the egress process runs) straight to microsocks, greeting included.
	b.Run("socks-only", func(b *testing.B) {
		dst := netip.AddrPortFrom(netip.MustParseAddr(labInternet), firstBytePort)
		one := make([]byte, 1)
		for b.Loop() {
			c, err := e.lab.Dial("node", e.socks.addr, 5*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if err := socksHandshake(c, dst, "", ""); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, one); err != nil {
				b.Fatal(err)
			}
			c.Close()
		}
		vsDirect(b)
	})
	b.Run("egress", func(b *testing.B) {
		connect(b, firstBytePort)
		vsDirect(b)
	})
	// The other placement of a caller's proxy: next to the node (a
	// company's proxy in the same site), the servers beyond it.
	near := startMicrosocks(b, e.lab.NS.Path("node"), labNodeUp, 1082, "", "", labNodeUp)
	if err := e.client.SetConfig(ctxT(b), e.config(Proxy{Name: "near", Revision: 1, Address: near.addr})); err != nil {
		b.Fatal(err)
	}
	b.Run("egress-proxy-near", func(b *testing.B) {
		connect(b, firstBytePort)
		vsDirect(b)
	})
}

// connectRTT is the median time of a TCP connect from the node namespace
// to the internet: one round trip.
func (e *egressLab) connectRTT(b *testing.B) time.Duration {
	addr := fmt.Sprintf("%s:%d", labInternet, directPort)
	var took []time.Duration
	for range 20 {
		start := time.Now()
		c, err := e.lab.Dial("node", addr, 5*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
		c.Close()
	}
	slices.Sort(took)
	return took[len(took)/2]
}
