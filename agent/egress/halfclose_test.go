package egress

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/netpol/netlab"
)

const (
	halfClosePort  = 83   // TPROXYed: answers once its client finished sending
	halfCloseSOCKS = 1090 // the SOCKS5 server that carries half-closes
)

// A guest that shuts down its sending side and then waits for the answer
// (printf REQUEST | nc SERVER PORT) gets it whole: the egress process
// passes the end of stream on to the SOCKS5 server as a half-close and
// relays the other direction to its end. The server here answers only
// after that end of stream, so a relay that held the FIN back, or one
// that closed both directions at it, would fail. (microsocks ends both
// directions when its client half-closes: the answer is lost there, not
// in the relay; docs/operating/networks-and-egress.md says so.)
func TestEgressCarriesHalfClose(t *testing.T) {
	e := newEgressLab(t)
	serveAfterEOF(e.lab.Listen("internet", fmt.Sprintf("%s:%d", labInternet, halfClosePort)))
	serveHalfCloseSOCKS5(t, e.lab, "internet", e.lab.Listen("internet", fmt.Sprintf("%s:%d", labProxy, halfCloseSOCKS)))
	if err := e.client.SetConfig(ctxT(t), e.config(Proxy{Name: "corp", Revision: 5, Address: fmt.Sprintf("%s:%d", labProxy, halfCloseSOCKS)})); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c, err := e.lab.Dial("guest", fmt.Sprintf("%s:%d", labInternet, halfClosePort), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		req := fmt.Sprintf("GET /%d HTTP/1.0\r\n\r\n", i)
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		c.Close()
		if want := "after EOF: " + req; err != nil || string(got) != want {
			t.Fatalf("round %d: answer %q, %v; want %q\n%s", i, got, err, want, e.proc.log())
		}
	}
}

// serveAfterEOF answers each connection with what it read, once its
// client ended its sending side.
func serveAfterEOF(ln net.Listener) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				b, err := io.ReadAll(c)
				if err == nil {
					c.Write(append([]byte("after EOF: "), b...))
				}
			}()
		}
	}()
}

// serveHalfCloseSOCKS5 is a SOCKS5 server (CONNECT, no authentication)
// that carries a half-close each way, as Dante does: the client's end of
// stream becomes a shutdown of the sending side towards the destination,
// and the answer is relayed until the destination ends it. It dials from
// namespace ns and serves until the test ends, which closes its
// connections (the egress process keeps greeted ones waiting) and waits
// for them.
func serveHalfCloseSOCKS5(t *testing.T, lab *netlab.Lab, ns string, ln net.Listener) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
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
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				dst, err := socks5Connect(c)
				if err != nil {
					return
				}
				var up net.Conn
				if err := lab.Do(ns, func() (err error) {
					up, err = net.DialTimeout("tcp", dst.String(), 5*time.Second)
					return err
				}); err != nil {
					c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0}) // connection refused
					return
				}
				defer up.Close()
				up.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0}); err != nil {
					return
				}
				var half sync.WaitGroup
				half.Go(func() {
					io.Copy(up, c)
					up.(*net.TCPConn).CloseWrite()
				})
				io.Copy(c, up)
				c.(*net.TCPConn).CloseWrite()
				half.Wait()
			})
		}
	})
}

// socks5Connect reads a greeting offering no authentication and a
// CONNECT to an IPv4 address, and answers the greeting.
func socks5Connect(c net.Conn) (netip.AddrPort, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil || hdr[0] != 5 {
		return netip.AddrPort{}, errors.New("not a SOCKS5 greeting")
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil || !bytes.Contains(methods, []byte{0}) {
		c.Write([]byte{5, 0xff})
		return netip.AddrPort{}, errors.New("no acceptable method")
	}
	if _, err := c.Write([]byte{5, 0}); err != nil {
		return netip.AddrPort{}, err
	}
	var req [10]byte // VER CMD RSV ATYP=1 ADDR(4) PORT(2)
	if _, err := io.ReadFull(c, req[:]); err != nil || req[0] != 5 || req[1] != 1 || req[3] != 1 {
		return netip.AddrPort{}, fmt.Errorf("not a CONNECT to an IPv4 address: % x", req)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(req[4:8])), binary.BigEndian.Uint16(req[8:])), nil
}
