package clusterlab

import (
	"net"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// The link faults of the fault harness, on two hosts of a real lab: a
// one-way cut drops one direction only, a flaky link loses some of what
// crosses it, and Unimpair gives the link back whole.
func TestLinkImpairments(t *testing.T) {
	testenv.LookPath(t, "nft", "nftables")
	l := New(t, 2)
	a, b := l.Hosts[0], l.Hosts[1]
	if got := arrived(t, a, b, 20); got != 20 {
		t.Fatalf("before any fault, %d of 20 datagrams from %s reached %s", got, a.IP, b.IP)
	}

	if err := a.CutOneWay(true); err != nil {
		t.Fatal(err)
	}
	if got := arrived(t, a, b, 20); got != 0 {
		t.Errorf("outbound cut of %s: %d of 20 of its datagrams arrived, want none", a.IP, got)
	}
	if got := arrived(t, b, a, 20); got != 20 {
		t.Errorf("outbound cut of %s: %d of 20 datagrams to it arrived, want all", a.IP, got)
	}
	if err := a.Unimpair(); err != nil {
		t.Fatal(err)
	}

	if err := a.CutOneWay(false); err != nil {
		t.Fatal(err)
	}
	if got := arrived(t, b, a, 20); got != 0 {
		t.Errorf("inbound cut of %s: %d of 20 datagrams to it arrived, want none", a.IP, got)
	}
	if got := arrived(t, a, b, 20); got != 20 {
		t.Errorf("inbound cut of %s: %d of 20 of its datagrams arrived, want all", a.IP, got)
	}
	if err := a.Unimpair(); err != nil {
		t.Fatal(err)
	}

	// 30% loss each way: of 200 datagrams about 140 arrive; the bounds are
	// more than six standard deviations away.
	if err := a.Flaky(30, 4096); err != nil {
		t.Fatal(err)
	}
	if got := arrived(t, a, b, 200); got < 100 || got > 185 {
		t.Errorf("flaky link of %s: %d of 200 of its datagrams arrived, want about 140", a.IP, got)
	}
	if got := arrived(t, b, a, 200); got < 100 || got > 185 {
		t.Errorf("flaky link of %s: %d of 200 datagrams to it arrived, want about 140", a.IP, got)
	}
	if err := a.Unimpair(); err != nil {
		t.Fatal(err)
	}
	if err := a.Unimpair(); err != nil {
		t.Errorf("Unimpair of a link not impaired: %v", err)
	}
	if got := arrived(t, a, b, 20); got != 20 {
		t.Errorf("after Unimpair, %d of 20 datagrams from %s reached %s", got, a.IP, b.IP)
	}
}

// arrived sends n UDP datagrams from one host to the other, paced, and
// counts those that arrive within a second of the last.
func arrived(t *testing.T, from, to *Host, n int) int {
	t.Helper()
	var rx, tx *net.UDPConn
	if err := InNetns(to.NS, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(to.IP)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if err := InNetns(from.NS, func() (err error) {
		tx, err = net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	for i := range n {
		tx.Write([]byte{byte(i)})
		time.Sleep(2 * time.Millisecond) // paced: no queue of the rate limit overflows
	}
	got := 0
	buf := make([]byte, 16)
	for {
		rx.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := rx.Read(buf); err != nil {
			return got
		}
		got++
	}
}
