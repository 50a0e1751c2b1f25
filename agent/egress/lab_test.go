package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/netpol/netlab"
)

// The lab: a "node" namespace where the egress process runs with the
// TPROXY plumbing the node would set up, two guests routed through it (one
// with routes, one without) and an "internet" with an HTTP server, an echo
// server, first-byte servers, dnsmasq and two microsocks (one with
// credentials) whose outgoing connections leave from their own address.
const (
	labGuest      = "10.200.0.2"
	labGuestGW    = "10.200.0.1"
	labGuest2     = "10.201.0.2"
	labNodeUp     = "203.0.113.1"
	labInternet   = "203.0.113.2"
	labProxy      = "203.0.113.3"
	labTPROXYPort = 15001
	labDNS        = labGuestGW + ":5300"
	labHTTPBody   = "hello from the internet"
	directPort    = 81 // not TPROXYed: the public path, for comparison
	firstBytePort = 82 // TPROXYed first-byte server
)

type egressLab struct {
	lab       *netlab.Lab
	http      *netlab.Server
	socks     *microsocks // no credentials, port 1080
	socksAuth *microsocks // alice/s3cret, port 1081
	proc      *proc
	client    *Client
}

// sh runs a command in a lab namespace.
func (e *egressLab) sh(t testing.TB, ns string, argv ...string) {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + e.lab.NS.Path(ns), "--"}, argv...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v: %s", strings.Join(argv, " "), ns, err, out)
	}
}

// nodeRules is what the node installs in its namespace: TPROXY of the
// guests' TCP to the egress listener, and a reset for what TPROXY could
// not deliver (no egress process), so nothing is forwarded directly.
const nodeRules = `table ip kibotos_egress_test {
	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		iifname { "kbg0", "kbg1" } meta l4proto tcp tcp dport != %[2]d tproxy to :%[1]d meta mark set 1 accept
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname { "kbg0", "kbg1" } meta l4proto tcp tcp dport != %[2]d reject with tcp reset
	}
}
`

func newEgressLab(t testing.TB) *egressLab {
	t.Helper()
	return newEgressLabAt(t, 0)
}

// newEgressLabAt is the lab with the internet (its servers and proxies)
// oneWay away from the node: a delayed wire instead of a veth pair when
// oneWay > 0.
func newEgressLabAt(t testing.TB, oneWay time.Duration) *egressLab {
	t.Helper()
	testenv.LookPath(t, "nft", "nftables")
	testenv.LookPath(t, "ip", "iproute2")
	testenv.LookPath(t, "microsocks", "microsocks")
	lab := netlab.New(t, filepath.Join(t.TempDir(), "netns"))
	e := &egressLab{lab: lab}
	for _, ns := range []string{"node", "guest", "guest2", "internet"} {
		lab.Namespace(ns)
	}
	lab.Wire("node", "kbg0", labGuestGW+"/24", "guest", "eth0", labGuest+"/24")
	lab.Wire("node", "kbg1", "10.201.0.1/24", "guest2", "eth0", labGuest2+"/24")
	if oneWay > 0 {
		lab.WireDelayed("node", "up0", labNodeUp+"/24", "internet", "eth0", labInternet+"/24", oneWay)
	} else {
		lab.Wire("node", "up0", labNodeUp+"/24", "internet", "eth0", labInternet+"/24")
	}
	lab.Route("guest", "default", labGuestGW)
	lab.Route("guest2", "default", "10.201.0.1")
	lab.Route("internet", "10.200.0.0/15", labNodeUp)
	e.sh(t, "internet", "ip", "addr", "add", labProxy+"/32", "dev", "eth0")
	e.sh(t, "node", "sysctl", "-qw", "net.ipv4.ip_forward=1")
	rules := filepath.Join(t.TempDir(), "rules.nft")
	if err := os.WriteFile(rules, fmt.Appendf(nil, nodeRules, labTPROXYPort, directPort), 0o600); err != nil {
		t.Fatal(err)
	}
	e.sh(t, "node", "nft", "-f", rules)
	e.sh(t, "node", "ip", "rule", "add", "fwmark", "1", "lookup", "100")
	e.sh(t, "node", "ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "100")

	e.http = lab.HTTP("internet", labInternet+":80", labHTTPBody)
	lab.Echo("internet", labInternet+":7")
	serveFirstByte(lab.Listen("internet", fmt.Sprintf("%s:%d", labInternet, directPort)))
	serveFirstByte(lab.Listen("internet", fmt.Sprintf("%s:%d", labInternet, firstBytePort)))
	lab.DNS("internet", netip.MustParseAddr(labInternet), map[string]netip.Addr{
		"example.test": netip.MustParseAddr("192.0.2.10"),
		"socks.test":   netip.MustParseAddr(labProxy),
	})
	inet := lab.NS.Path("internet")
	e.socks = startMicrosocks(t, inet, labProxy, 1080, "", "", labProxy)
	e.socksAuth = startMicrosocks(t, inet, labProxy, 1081, "alice", "s3cret", labProxy)

	// The egress process runs in the node namespace as nobody, without
	// capabilities; the node (this test, root) makes its sockets there.
	e.proc = startProcess(t, lab.NS.Path("node"), nobody, 1, 2*time.Second)
	var socks Sockets
	if err := lab.Do("node", func() (err error) {
		socks, err = ListenSockets(t.Context(), fmt.Sprintf("0.0.0.0:%d", labTPROXYPort), labDNS)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.client = e.proc.dial(t)
	if err := e.client.SendListeners(ctxT(t), socks); err != nil {
		t.Fatal(err)
	}
	// The node keeps no copy: once the process is gone, so are the sockets.
	socks.Close()
	if err := e.client.SetConfig(ctxT(t), e.config(Proxy{Name: "corp", Revision: 1, Address: "socks.test:1080"})); err != nil {
		t.Fatal(err)
	}
	return e
}

// config routes the first guest through p and its DNS to dnsmasq; the
// second guest has no route.
func (e *egressLab) config(p Proxy) Config {
	return Config{
		Resolvers: []string{labInternet + ":53"},
		Routes: []Route{{
			Guest:    netip.MustParseAddr(labGuest),
			Egress:   &p,
			Resolver: &Resolver{Name: "corp-dns", Upstreams: []string{labInternet}},
		}},
	}
}

// serveFirstByte answers every connection with one byte and closes it.
func serveFirstByte(ln net.Listener) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte{'!'})
			c.Close()
		}
	}()
}

// get fetches http://internet/ from a guest namespace.
func (e *egressLab) get(t testing.TB, ns string) (string, error) {
	t.Helper()
	c, err := e.lab.Dial(ns, labInternet+":80", 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\nHost: internet\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// query asks the egress DNS socket for name from a guest namespace; a nil
// answer means none came within wait.
func (e *egressLab) query(t testing.TB, ns, name string, wait time.Duration) *dns.Msg {
	t.Helper()
	var r *dns.Msg
	err := e.lab.Do(ns, func() error {
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		c := &dns.Client{Net: "udp", Timeout: wait}
		var err error
		r, _, err = c.Exchange(q, labDNS)
		return err
	})
	// A socket that is gone answers with ICMP: also no answer.
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	if err != nil {
		t.Fatalf("query %s from %s: %v", name, ns, err)
	}
	return r
}

func (e *egressLab) stats(t testing.TB) Stats {
	t.Helper()
	st, err := e.client.Stats(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestEgressInNetlab(t *testing.T) {
	e := newEgressLab(t)
	outer := t

	t.Run("tcp goes through the proxy", func(t *testing.T) {
		body, err := e.get(t, "guest")
		if err != nil || body != labHTTPBody {
			t.Fatalf("GET from the guest: %q, %v\n%s", body, err, e.proc.log())
		}
		hits := e.http.Hits()
		if len(hits) != 1 || !strings.HasPrefix(hits[0], labProxy+":") {
			t.Fatalf("the HTTP server saw %v; want one connection from microsocks at %s", hits, labProxy)
		}
		want := fmt.Sprintf("%s: connected to %s:80", labNodeUp, labInternet)
		testenv.WaitFor(t, 5*time.Second, "microsocks to log the connection", func() (bool, string) {
			l := e.socks.log()
			return strings.Contains(l, want), "microsocks log:\n" + l
		})
	})

	t.Run("a guest without an egress route is closed at once", func(t *testing.T) {
		before := e.stats(t).Refused
		// TPROXY completes the handshake; the reset may come before the
		// guest's connect returns or on its first read.
		c, err := e.lab.Dial("guest2", labInternet+":80", 5*time.Second)
		if err == nil {
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
			var n int
			n, err = c.Read(make([]byte, 64))
			if n != 0 || os.IsTimeout(err) {
				t.Fatalf("read on a refused connection: %d bytes, %v; want it closed", n, err)
			}
		}
		if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
			t.Fatalf("a guest without egress: %v; want the connection reset", err)
		}
		if hits := e.http.Hits(); len(hits) != 0 {
			t.Fatalf("the HTTP server saw %v from a guest without egress", hits)
		}
		if st := e.stats(t); st.Refused != before+1 {
			t.Fatalf("refused %d, want %d", st.Refused, before+1)
		}
		if strings.Contains(e.socks.log(), labGuest2) {
			t.Fatal("the refused guest reached microsocks")
		}
	})

	t.Run("a new config with credentials applies to new connections", func(t *testing.T) {
		if err := e.client.SetConfig(ctxT(t), e.config(Proxy{Name: "corp", Revision: 2, Address: labProxy + ":1081", Username: "alice", Password: "s3cret"})); err != nil {
			t.Fatal(err)
		}
		body, err := e.get(t, "guest")
		if err != nil || body != labHTTPBody {
			t.Fatalf("GET through the authenticated proxy: %q, %v\n%s", body, err, e.proc.log())
		}
		want := fmt.Sprintf("connected to %s:80", labInternet)
		testenv.WaitFor(t, 5*time.Second, "the authenticated microsocks to log it", func() (bool, string) {
			l := e.socksAuth.log()
			return strings.Contains(l, want), "microsocks log:\n" + l
		})
		e.http.Hits()
		// A wrong password fails the connection: still nothing direct.
		if err := e.client.SetConfig(ctxT(t), e.config(Proxy{Name: "corp", Revision: 3, Address: labProxy + ":1081", Username: "alice", Password: "wrong"})); err != nil {
			t.Fatal(err)
		}
		failed := e.stats(t).Failed
		if body, err := e.get(t, "guest"); err == nil {
			t.Fatalf("GET with a wrong proxy password answered %q", body)
		}
		if hits := e.http.Hits(); len(hits) != 0 {
			t.Fatalf("the HTTP server saw %v with a wrong proxy password", hits)
		}
		if st := e.stats(t); st.Failed != failed+1 {
			t.Fatalf("failed %d, want %d", st.Failed, failed+1)
		}
		if err := e.client.SetConfig(ctxT(t), e.config(Proxy{Name: "corp", Revision: 4, Address: "socks.test:1080"})); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("dns is answered for a resolver route only", func(t *testing.T) {
		r := e.query(t, "guest", "example.test", 5*time.Second)
		if r == nil || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "192.0.2.10" {
			t.Fatalf("answer for the guest with a resolver: %v\n%s", r, e.proc.log())
		}
		st := e.stats(t)
		if r := e.query(t, "guest2", "example.test", 500*time.Millisecond); r != nil {
			t.Fatalf("the guest without a resolver got an answer: %v", r)
		}
		testenv.WaitFor(t, 5*time.Second, "the dropped query in the stats", func() (bool, string) {
			n := e.stats(t).DNSDropped
			return n == st.DNSDropped+1, fmt.Sprintf("%d dropped, %d before", n, st.DNSDropped)
		})
		if st.DNSAnswered != 1 {
			t.Fatalf("dns answered %d, want 1", st.DNSAnswered)
		}
	})

	t.Run("a newer generation takes the sockets without refusing a connection", func(t *testing.T) {
		old, oldClient := e.proc, e.client
		c, err := e.lab.Dial("guest", labInternet+":7", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		echo(t, c, "on generation 1")
		// Made for the whole test: the drain below runs on it.
		next := startProcess(outer, e.lab.NS.Path("node"), nobody, 2, 2*time.Second)
		nextClient := next.dial(outer)
		socks, err := oldClient.Listeners(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := nextClient.SendListeners(ctxT(t), socks); err != nil {
			t.Fatal(err)
		}
		socks.Close()
		if err := nextClient.SetConfig(ctxT(t), e.config(Proxy{Name: "corp", Revision: 4, Address: "socks.test:1080"})); err != nil {
			t.Fatal(err)
		}
		if err := oldClient.Drain(ctxT(t), time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		e.http.Hits()
		if body, err := e.get(t, "guest"); err != nil || body != labHTTPBody {
			t.Fatalf("GET after the switch: %q, %v\n%s", body, err, next.log())
		}
		if st, err := nextClient.Stats(ctxT(t)); err != nil || st.Accepted != 1 {
			t.Fatalf("generation 2 stats %+v, %v; want the new connection there", st, err)
		}
		echo(t, c, "on generation 1 while it drains")
		// Its last connection ends long before the deadline: it exits then.
		c.Close()
		if err := old.wait(t, 10*time.Second); err != nil {
			t.Fatalf("generation 1 exit: %v\n%s", err, old.log())
		}
		e.proc, e.client = next, nextClient
	})

	t.Run("drain keeps open connections until the deadline, then the process exits", func(t *testing.T) {
		c, err := e.lab.Dial("guest", labInternet+":7", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		echo(t, c, "before the drain")
		// The GET of the switch above ended on the guest's side; the
		// process counts it closed once its relay noticed.
		testenv.WaitFor(t, 10*time.Second, "the earlier connections to end", func() (bool, string) {
			st := e.stats(t)
			return st.Active == 1, fmt.Sprintf("%+v", st)
		})
		deadline := time.Now().Add(1500 * time.Millisecond)
		if err := e.client.Drain(ctxT(t), deadline); err != nil {
			t.Fatal(err)
		}
		if st := e.stats(t); !st.Draining || st.Listening || st.Routes != 0 || st.Active != 1 {
			t.Fatalf("stats while draining: %+v", st)
		}
		echo(t, c, "during the drain")
		// The listener is gone with the process's copy: TPROXY finds no
		// socket and the node's forward rule resets the connection.
		if c2, err := e.lab.Dial("guest", labInternet+":80", 2*time.Second); err == nil {
			c2.Close()
			t.Fatal("a new connection was accepted during the drain")
		}
		if r := e.query(t, "guest", "example.test", 500*time.Millisecond); r != nil {
			t.Fatalf("a query was answered during the drain: %v", r)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(make([]byte, 16))
		if n != 0 || err == nil || os.IsTimeout(err) {
			t.Fatalf("read at the deadline: %d, %v; want the connection closed", n, err)
		}
		if early := time.Until(deadline); early > 50*time.Millisecond {
			t.Fatalf("the connection was closed %v before the deadline", early)
		}
		if err := e.proc.wait(t, 10*time.Second); err != nil {
			t.Fatalf("egress process exit: %v\n%s", err, e.proc.log())
		}
		if !strings.Contains(e.proc.log(), "egress connections closed at the drain deadline") {
			t.Fatalf("no deadline line in the log:\n%s", e.proc.log())
		}
	})
}
