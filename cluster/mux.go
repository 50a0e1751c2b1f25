package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kibotos/kibotos/datadir"
)

// mux serves Raft, control sessions and the HTTP API on one TLS port,
// split by the ALPN protocol the client asked for.
type mux struct {
	ln      net.Listener
	tlsConf *tls.Config
	log     *slog.Logger

	raft    chan net.Conn
	session chan net.Conn
	http    chan net.Conn

	closeOnce sync.Once
	done      chan struct{}
}

func newMux(ln net.Listener, tlsConf *tls.Config, log *slog.Logger) *mux {
	return &mux{
		ln: ln, tlsConf: tlsConf, log: log,
		raft: make(chan net.Conn), session: make(chan net.Conn), http: make(chan net.Conn),
		done: make(chan struct{}),
	}
}

func (m *mux) serve() {
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.done:
				return
			default:
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			m.log.Error("listener stopped", "err", err)
			return
		}
		go m.route(c)
	}
}

func (m *mux) route(c net.Conn) {
	tc := tls.Server(c, m.tlsConf)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return
	}
	var ch chan net.Conn
	switch tc.ConnectionState().NegotiatedProtocol {
	case datadir.ProtoRaft:
		ch = m.raft
	case datadir.ProtoSession:
		ch = m.session
	default:
		ch = m.http
	}
	if (ch == m.raft || ch == m.session) && len(tc.ConnectionState().PeerCertificates) == 0 {
		tc.Close() // Raft and sessions are members only
		return
	}
	select {
	case ch <- tc:
	case <-m.done:
		tc.Close()
	}
}

func (m *mux) close() {
	m.closeOnce.Do(func() {
		close(m.done)
		m.ln.Close()
	})
}

// chanListener is a net.Listener fed by the mux. Closing it ends Accept
// (http.Server.Shutdown waits for that) without closing the shared port.
type chanListener struct {
	m      *mux
	ch     chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func newChanListener(m *mux, ch chan net.Conn) *chanListener {
	return &chanListener{m: m, ch: ch, closed: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.m.done:
		return nil, net.ErrClosed
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.m.ln.Addr() }

// raftLayer is the raft.StreamLayer over the mux: outgoing connections are
// member-authenticated TLS asking for the Raft protocol.
type raftLayer struct {
	*chanListener
	advertise net.Addr
	clientTLS *tls.Config
}

func (r *raftLayer) Addr() net.Addr { return r.advertise }

func (r *raftLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	c, err := tls.DialWithDialer(d, "tcp", string(address), r.clientTLS)
	if err != nil {
		return nil, err
	}
	if c.ConnectionState().NegotiatedProtocol != datadir.ProtoRaft {
		c.Close()
		return nil, errors.New("peer " + string(address) + " does not speak the Raft protocol")
	}
	return c, nil
}
