package egress

import (
	"fmt"
	"io"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkConnect is a guest's TCP connect and first byte from a server
// in the lab's internet: "direct" is public egress (the node forwards
// it), "egress" goes through TPROXY, the egress process and microsocks
// across the same namespaces. The egress run reports its ratio to direct;
// the target is 1.2.
func BenchmarkConnect(b *testing.B) {
	e := newEgressLab(b)
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
		if direct > 0 {
			b.ReportMetric(float64(b.Elapsed())/float64(b.N)/direct, "x-direct")
		}
	})
	b.Run("egress", func(b *testing.B) {
		connect(b, firstBytePort)
		if direct > 0 {
			b.ReportMetric(float64(b.Elapsed())/float64(b.N)/direct, "x-direct")
		}
	})
}
