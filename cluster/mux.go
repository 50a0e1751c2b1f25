package cluster

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/trust"
)

// mux serves Raft, control sessions and the HTTP API on one TLS port,
// split by the ALPN protocol the client asked for.
type mux struct {
	life    context.Context // the member's: a handshake under way ends with it
	ln      net.Listener
	tlsConf *tls.Config
	log     *slog.Logger
	// admit authorizes a Raft or session connection by its peer's
	// certificate; admitted connections are watched for revocation.
	admit func(proto string, cs tls.ConnectionState) (trust.Identity, error)
	watch *connWatch

	raft    chan net.Conn
	session chan net.Conn
	http    chan net.Conn

	closeOnce sync.Once
	done      chan struct{}
	// routes are the connections still in their handshake or hand-over;
	// serve returns only after them. Each ends with life (the handshake)
	// or done (the hand-over).
	routes sync.WaitGroup
}

func newMux(life context.Context, ln net.Listener, tlsConf *tls.Config, log *slog.Logger, admit func(string, tls.ConnectionState) (trust.Identity, error), watch *connWatch) *mux {
	return &mux{
		life: life, ln: ln, tlsConf: tlsConf, log: log, admit: admit, watch: watch,
		raft: make(chan net.Conn), session: make(chan net.Conn), http: make(chan net.Conn),
		done: make(chan struct{}),
	}
}

func (m *mux) serve() {
	defer m.routes.Wait()
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
		m.routes.Go(func() { m.route(c) })
	}
}

func (m *mux) route(c net.Conn) {
	tc := tls.Server(c, m.tlsConf)
	ctx, cancel := context.WithTimeout(m.life, 10*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return
	}
	var ch chan net.Conn
	var conn net.Conn = tc
	cs := tc.ConnectionState()
	switch cs.NegotiatedProtocol {
	case datadir.ProtoRaft:
		ch = m.raft
	case datadir.ProtoSession:
		ch = m.session
	default:
		ch = m.http // every request is authorized on its own
	}
	if ch != m.http {
		id, err := m.admit(cs.NegotiatedProtocol, cs)
		if err != nil {
			m.log.Warn("connection refused", "protocol", cs.NegotiatedProtocol, "remote", c.RemoteAddr().String(), "reason", err.Error())
			tc.Close()
			return
		}
		conn = m.watch.wrap(tc, id)
	}
	select {
	case ch <- conn:
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
// member-authenticated TLS asking for the Raft protocol, accepted only from
// a ctrl member holding the address and, when the configuration names the
// server at that address, with that node id.
type raftLayer struct {
	*chanListener
	life      context.Context // the member's: raft's Dial takes none
	advertise net.Addr
	client    trust.Client
	// serverAt names the node id the configuration has at an address ("":
	// not in it, e.g. while a new voter is being added).
	serverAt func(raft.ServerAddress) string
}

func (r *raftLayer) Addr() net.Addr { return r.advertise }

func (r *raftLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	want := trust.Want{Kind: trust.KindMember, Role: trust.RoleCtrl, NodeID: r.serverAt(address)}
	return r.client.Dial(r.life, datadir.ProtoRaft, want, string(address), timeout)
}
