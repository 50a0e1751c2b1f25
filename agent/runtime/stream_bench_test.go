package runtime_test

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// streamBytes is what one guest stream carries: enough that connection
// setup is noise.
const streamBytes = 32 << 20

// BenchmarkGuestStream measures one guest TCP stream to a server on the
// lab's internet, through public egress (forwarded and masqueraded by the
// node) and through a SOCKS5 Egress (TPROXY, the egress process,
// microsocks), each iteration one stream of each; it reports both in MB/s
// and the ratio SOCKS5 / public. Under TCG the guest's virtio-net is bound
// by the CPU, which both paths share with the guests.
//
//	go test ./agent/runtime -run X -bench GuestStream -benchtime 5x
func BenchmarkGuestStream(b *testing.B) {
	h := newHarness(b)
	inst := platformFixture(b)
	microsocks := testenv.LookPath(b, "microsocks", "microsocks")
	exe := buildKibotos(b)
	lab := h.lab
	h.wireInternet()
	lab.Start("inet", microsocks, "-i", labInternet, "-p", "1080")
	rt, _ := openWithEgress(b, h, exe)
	ctx := testCtx(b, 30*time.Minute)
	proxied := runtime.NetworkPolicy{Egress: runtime.EgressProxyMode,
		Proxy: &runtime.EgressProxy{Name: "corp", Revision: 1, SOCKS5: labInternet + ":1080"}}
	for id, p := range map[string]runtime.NetworkPolicy{"pub": {Egress: "public"}, "px": proxied} {
		if _, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true, Policy: p}); err != nil {
			b.Fatal(err)
		}
	}
	sink := lab.Listen("inet", labInternet+":9200")
	// stream sends streamBytes from the guest and returns how long the
	// server took to receive them, from the exec's start.
	stream := func(id string) time.Duration {
		b.Helper()
		t0 := time.Now()
		p, err := rt.Exec(ctx, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c",
			"dd if=/dev/zero bs=65536 count=" + strconv.Itoa(streamBytes/65536) + " 2>/dev/null | nc " + labInternet + " 9200"}})
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		c, err := sink.Accept()
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Minute))
		if n, err := io.CopyN(io.Discard, c, streamBytes); err != nil {
			b.Fatalf("%s: stream ended after %d bytes: %v", id, n, err)
		}
		return time.Since(t0)
	}
	stream("pub") // warm both paths up: first connections, ARP, the proxy
	stream("px")
	var public, socks []time.Duration
	b.ResetTimer()
	for range b.N {
		public = append(public, stream("pub"))
		socks = append(socks, stream("px"))
	}
	b.StopTimer()
	mbps := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(streamBytes) / 1e6 / ds[len(ds)/2].Seconds()
	}
	pub, px := mbps(public), mbps(socks)
	b.ReportMetric(pub, "public-MB/s")
	b.ReportMetric(px, "socks5-MB/s")
	b.ReportMetric(px/pub, "socks5/public")
	b.Log(fmt.Sprintf("median of %d: public %.1f MB/s, SOCKS5 egress %.1f MB/s (%.2f×)", b.N, pub, px, px/pub))
}
