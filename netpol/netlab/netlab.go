// Package netlab builds throw-away networks of namespaces for tests: a
// "node" namespace for a runtime under test, and outside namespaces (an
// "internet", a management network) joined to it by veth pairs, with
// servers listening in them. Everything is removed at test cleanup, also
// on failure; processes it starts are killed by the PID it started.
package netlab

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/netpol"
)

// Lab is a set of namespaces pinned under one directory.
type Lab struct {
	t  testing.TB
	NS netpol.Namespaces
}

// New makes a lab whose namespaces live under dir (made and removed here).
func New(t testing.TB, dir string) *Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "netlab: needs root for network namespaces")
	}
	l := &Lab{t: t, NS: netpol.Namespaces{Dir: dir}}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if err := l.NS.Delete(e.Name()); err != nil {
				t.Errorf("netlab cleanup: %v", err)
			}
		}
		os.Remove(dir)
	})
	return l
}

// Namespace makes a namespace with its loopback up and returns its path.
func (l *Lab) Namespace(name string) string {
	l.t.Helper()
	if err := l.NS.Create(name); err != nil {
		l.t.Fatal(err)
	}
	nl := l.handle(name)
	defer nl.Close()
	lo, err := nl.LinkByName("lo")
	if err == nil {
		err = nl.LinkSetUp(lo)
	}
	if err != nil {
		l.t.Fatalf("netlab: %s: loopback up: %v", name, err)
	}
	return l.NS.Path(name)
}

// handle is a netlink handle into a namespace of the lab; the caller
// closes it.
func (l *Lab) handle(name string) *netlink.Handle {
	l.t.Helper()
	h := l.open(name)
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		l.t.Fatalf("netlab: %s: netlink: %v", name, err)
	}
	return nl
}

func (l *Lab) open(name string) netns.NsHandle {
	l.t.Helper()
	h, err := l.NS.Open(name)
	if err != nil {
		l.t.Fatal(err)
	}
	return h
}

// Wire joins namespace a (link aName, address aAddr) to b (bName, bAddr)
// with a veth pair; addresses are CIDRs such as 198.51.100.1/24 (IPv6 ones
// usable at once: no duplicate address detection).
func (l *Lab) Wire(a, aName, aAddr, b, bName, bAddr string) {
	l.t.Helper()
	hb := l.open(b)
	defer hb.Close()
	na, nb := l.handle(a), l.handle(b)
	defer na.Close()
	defer nb.Close()
	if err := na.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName}, PeerName: bName, PeerNamespace: netlink.NsFd(int(hb))}); err != nil {
		l.t.Fatalf("netlab: veth %s/%s - %s/%s: %v", a, aName, b, bName, err)
	}
	l.configure(a, aName, aAddr)
	l.configure(b, bName, bAddr)
}

// configure gives a link of namespace ns its address (a CIDR) and brings
// it up.
func (l *Lab) configure(ns, link, cidr string) {
	l.t.Helper()
	nl := l.handle(ns)
	defer nl.Close()
	if err := nl.LinkSetUp(l.addAddr(nl, ns, link, cidr)); err != nil {
		l.t.Fatalf("netlab: %s up in %s: %v", link, ns, err)
	}
}

// Addr adds an address (CIDR) to a link of a namespace.
func (l *Lab) Addr(ns, link, cidr string) {
	l.t.Helper()
	nl := l.handle(ns)
	defer nl.Close()
	l.addAddr(nl, ns, link, cidr)
}

// addAddr adds an address to a link through nl (a handle into ns) and
// returns the link.
func (l *Lab) addAddr(nl *netlink.Handle, ns, link, cidr string) netlink.Link {
	l.t.Helper()
	lk, err := nl.LinkByName(link)
	if err != nil {
		l.t.Fatal(err)
	}
	ad, err := parseAddr(cidr)
	if err == nil {
		err = nl.AddrAdd(lk, ad)
	}
	if err != nil {
		l.t.Fatalf("netlab: address %s on %s in %s: %v", cidr, link, ns, err)
	}
	return lk
}

// parseAddr parses a CIDR; an IPv6 one skips duplicate address detection,
// which would leave it unusable for a second or two.
func parseAddr(cidr string) (*netlink.Addr, error) {
	a, err := netlink.ParseAddr(cidr)
	if err == nil && a.IP.To4() == nil {
		a.Flags |= unix.IFA_F_NODAD
	}
	return a, err
}

// Start runs argv in a namespace (nsenter execs it, so the PID is its
// own) with its output in a file of the test, and kills that PID at
// cleanup. It returns the output file's path.
func (l *Lab) Start(ns string, argv ...string) string {
	l.t.Helper()
	out := filepath.Join(l.t.TempDir(), filepath.Base(argv[0])+".log")
	f, err := os.Create(out)
	if err != nil {
		l.t.Fatal(err)
	}
	cmd := exec.Command("nsenter", append([]string{"--net=" + l.NS.Path(ns), "--"}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		l.t.Fatalf("netlab: start %v in %s: %v", argv, ns, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	l.t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		f.Close()
	})
	return out
}

// Route adds a route in a namespace: dst (CIDR or "default") via gw.
func (l *Lab) Route(ns, dst, gw string) {
	l.t.Helper()
	nl := l.handle(ns)
	defer nl.Close()
	r := &netlink.Route{Gw: net.ParseIP(gw)}
	if dst != "default" {
		_, n, err := net.ParseCIDR(dst)
		if err != nil {
			l.t.Fatal(err)
		}
		r.Dst = n
	}
	if err := nl.RouteAdd(r); err != nil {
		l.t.Fatalf("netlab: route %s via %s in %s: %v", dst, gw, ns, err)
	}
}

// Do runs f on a thread in namespace ns.
func (l *Lab) Do(ns string, f func() error) error {
	h := l.open(ns)
	defer h.Close()
	return netpol.InNamespace(h, f)
}

// Listen opens a TCP listener in a namespace (a socket stays in the
// namespace it was made in); closed at cleanup.
func (l *Lab) Listen(ns string, addr string) net.Listener {
	l.t.Helper()
	var ln net.Listener
	if err := l.Do(ns, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		l.t.Fatalf("netlab: listen on %s in %s: %v", addr, ns, err)
	}
	l.t.Cleanup(func() { ln.Close() })
	return ln
}

// Echo serves TCP echo on addr in a namespace until cleanup, which
// closes the listener and the live connections and waits for their
// goroutines.
func (l *Lab) Echo(ns, addr string) {
	l.t.Helper()
	ln := l.Listen(ns, addr)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		done  bool
	)
	l.t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		done = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if done {
				mu.Unlock()
				c.Close()
				return
			}
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				io.Copy(c, c)
			})
		}
	})
}

// Dial connects from a namespace.
func (l *Lab) Dial(ns, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := l.Do(ns, func() (err error) {
		c, err = net.DialTimeout("tcp", addr, timeout)
		return err
	})
	return c, err
}

// HTTP serves body on addr in a namespace and records the remote address
// of every request it answered.
func (l *Lab) HTTP(ns, addr, body string) *Server {
	l.t.Helper()
	s := &Server{hits: make(chan string, 64)}
	ln := l.Listen(ns, addr)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case s.hits <- r.RemoteAddr:
		default:
		}
		io.WriteString(w, body)
	}), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	l.t.Cleanup(func() {
		srv.Close() // closes ln and the live connections: Serve returns
		<-served
	})
	return s
}

// Server is an HTTP server of the lab.
type Server struct{ hits chan string }

// Hits returns the remote addresses seen so far.
func (s *Server) Hits() []string {
	var out []string
	for {
		select {
		case h := <-s.hits:
			out = append(out, h)
		default:
			return out
		}
	}
}

// DNS runs dnsmasq in a namespace on addr (port 53), answering each name
// of records with its address and refusing to forward anything else.
func (l *Lab) DNS(ns string, addr netip.Addr, records map[string]netip.Addr) {
	l.t.Helper()
	multi := map[string][]netip.Addr{}
	for name, a := range records {
		multi[name] = []netip.Addr{a}
	}
	l.DNSRecords(ns, addr, multi)
}

// DNSRecords is DNS with any number of addresses per name: IPv4 ones
// answer A questions, IPv6 ones AAAA questions.
func (l *Lab) DNSRecords(ns string, addr netip.Addr, records map[string][]netip.Addr) {
	l.t.Helper()
	bin := testenv.LookPath(l.t, "dnsmasq", "dnsmasq")
	dir := l.t.TempDir()
	args := []string{"--net=" + l.NS.Path(ns), bin, "--keep-in-foreground", "--no-resolv", "--no-hosts", "--no-poll",
		"--bind-interfaces", "--listen-address=" + addr.String(), "--except-interface=lo", "--user=root", "--group=root",
		"--pid-file=" + filepath.Join(dir, "pid"), "--conf-file=/dev/null", "--log-facility=" + filepath.Join(dir, "log"), "--log-queries"}
	for name, addrs := range records {
		for _, a := range addrs {
			args = append(args, "--address=/"+name+"/"+a.String())
		}
	}
	cmd := exec.Command("nsenter", args...)
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		l.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		l.t.Fatalf("netlab: dnsmasq: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	l.t.Cleanup(func() {
		cmd.Process.Kill() // nsenter execs dnsmasq: this is its PID
		<-exited
		out.Close()
	})
	// Ready when it answers on its TCP port.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := l.Dial(ns, netip.AddrPortFrom(addr, 53).String(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "out"))
			l.t.Fatalf("netlab: dnsmasq exited: %s", strings.TrimSpace(string(b)))
		default:
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("netlab: dnsmasq did not listen on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// String names the lab for messages.
func (l *Lab) String() string { return fmt.Sprintf("netlab %s", l.NS.Dir) }
