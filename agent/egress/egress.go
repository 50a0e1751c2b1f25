// Package egress is the node's egress process (`kibotos egress serve`) and the
// node's side of it: a Client for its control socket and the two privileged
// sockets only the node can make.
//
// The process forwards every TCP connection of a guest whose policy names an
// Egress (a caller's SOCKS5 proxy) through that proxy, and answers the DNS of
// a guest whose policy names a Resolver from that Resolver's upstreams. It
// runs as the unprivileged user kibotos-egress with no capabilities, so it
// never opens a privileged socket itself: the node creates them and hands
// them over on the control socket, together with the routes and the
// credentials, which live only in memory.
//
// It must never: connect a guest's destination directly (a guest without an
// Egress route has its connection closed at once, there is no fallback);
// read /etc/resolv.conf (hostnames of proxies and upstreams are resolved
// with the node's deployment resolvers from Config); write any file but its
// control socket; take control messages from anyone but root.
//
// # What the node sets up
//
// Sockets, made as root in the node's (host) network namespace and sent
// with Client.SendListeners:
//   - ListenTransparentTCP(ctx, "0.0.0.0:PORT"): a listener
//     with IP_TRANSPARENT, so connections TPROXYed to it keep their original
//     destination as the accepted socket's local address. Because the node
//     creates it, it belongs to the node unit's cgroup for as long as it
//     exists (systemd IP access rules of the node apply to it).
//   - ListenDNS("ADDR:PORT") on a specific node address (never 0.0.0.0):
//     answers leave from that address, which the Instance namespace's
//     conntrack needs to un-DNAT them.
//
// Rules, in the node namespace (guest veths are kb-*, @proxied the guest
// addresses whose policy names an Egress):
//
//	table ip kibotos_egress {
//	  chain prerouting {
//	    type filter hook prerouting priority mangle; policy accept;
//	    iifname "kb-*" ip saddr @proxied meta l4proto tcp tproxy to :PORT meta mark set 1 accept
//	  }
//	  chain forward {
//	    type filter hook forward priority filter; policy accept;
//	    iifname "kb-*" ip saddr @proxied meta l4proto tcp reject with tcp reset
//	  }
//	}
//	ip rule add fwmark 1 lookup 100
//	ip route add local 0.0.0.0/0 dev lo table 100
//
// TPROXY finds no socket when no egress process holds the listener; the
// packet then goes on to the forward chain, whose reset makes the guest's
// connect fail at once instead of leaving directly. The Instance namespace
// of a proxied guest forwards its TCP to the node unchanged (no redirect,
// no NAT): routes are looked up by the guest's source address, and the
// original destination must still be the packet's. A listener on 0.0.0.0
// also takes plain connections to the node's own addresses on PORT: the
// node's input chain should drop those (tcp dport PORT meta mark != 1).
// The DNS of
// a Resolver-referencing guest is DNATed in its Instance namespace to the
// ListenDNS address (netpol TableSpec.Resolver), source unchanged.
//
// The unit (Supervisor starts it): kibotos-egress-<scope>-<generation>.service
// in kibotos-egress.slice, User=kibotos-egress, no capabilities
// (CapabilityBoundingSet= and AmbientCapabilities= empty,
// NoNewPrivileges=yes), ProtectSystem=strict with only the socket
// directory writable, the node's state directory inaccessible,
// `kibotos egress serve --socket-dir DIR --generation N`. The
// command refuses root and capabilities (CheckUnprivileged). SIGTERM
// drains with --grace (10 s); the node normally drains over the control
// socket with its own deadline. Proxies and upstreams are dialed from the
// host namespace as that user, so host rules on the node's own outbound
// traffic apply to them.
//
// # Control protocol
//
// A unix socket <socket dir>/control-<generation>.sock (ControlSocket); the
// directory is made by the node, owned by kibotos-egress, mode 0700. Only a
// peer with uid 0 (SO_PEERCRED) is served, one connection at a time. Each
// request and reply is a frame: a 4-byte big-endian length and that many
// bytes (at most MaxFrame) of JSON, decoded strictly (unknown fields,
// trailing data and descriptors on the wrong request are errors). Requests:
// hello, listeners (the TCP listener and the DNS socket ride on that frame
// as SCM_RIGHTS, in that order), take-listeners (copies of them come back
// with the reply), config (replaces the whole Config), drain (a deadline),
// stats, guest-stats (the counters by routed guest, guests.go; a process
// of an earlier build answers it with an error, and the node then counts
// none of its guests).
//
// # Replacing a generation
//
// The node keeps no copy of the sockets. To switch builds it asks the old
// generation for copies (Client.Listeners), sends them to the new one with
// its Config, then drains the old one: both accept from the same socket
// until the old one stops, so no connection is refused in between. After a
// node restart the running process keeps its sockets and the node only
// reconnects. If the process dies, its sockets die with it: new guest
// connections then fail (they find no listener) until the node makes new
// sockets for a new generation.
//
// Supervisor does all of this for the node: it starts a generation when
// Apply brings the first routes, drains it when the last go, adopts the
// running ones when it opens, replaces a serving one that dies (within a
// watch interval, 500 ms, plus its start) and switches builds (Switch)
// with at most two generations running.
//
// Config changes apply to new connections and queries; connections already
// carried keep their proxy until they end, are drained or the process ends.
//
// Options.WarmConnections (--warm-connections, DefaultWarmConnections)
// keeps a few connections per proxy revision in use greeted and
// authenticated ahead of need, leaving one round trip to the proxy per
// guest connection instead of three or four: across a network with
// latency that is what brings a proxied connect within reach of a direct
// one (BenchmarkConnectWAN).
package egress

import (
	"net/netip"
	"time"

	"github.com/kibotos/kibotos/agent/generations"
)

// ProtocolVersion is the control protocol; Hello carries it and Dial
// refuses a process that speaks another.
const ProtocolVersion = 1

// MaxFrame bounds one control frame (a Config of many routes fits well).
const MaxFrame = 1 << 20

// DNSAnswerWindow is how long a query already received is still answered
// after a drain (the seed's 4 seconds).
const DNSAnswerWindow = 4 * time.Second

// ControlSocket is the control socket of generation gen in socketDir.
func ControlSocket(socketDir string, gen uint64) string {
	return generations.ControlSocket(socketDir, gen)
}

// Config is everything the process forwards by; each push replaces the
// previous one whole.
type Config struct {
	// Routes say, per guest address, where its TCP and its DNS go. A guest
	// not listed (or listed without Egress) gets no TCP, one without
	// Resolver gets no DNS answer from this process.
	Routes []Route `json:"routes"`
	// Resolvers is the node's deployment resolver list (IP or IP:port, port
	// 53 by default), used in order only to resolve the hostnames of
	// proxies and upstreams.
	Resolvers []string `json:"resolvers"`
}

// Route is one guest's egress and resolver; at least one is set.
type Route struct {
	Guest    netip.Addr `json:"guest"`
	Egress   *Proxy     `json:"egress,omitempty"`
	Resolver *Resolver  `json:"resolver,omitempty"`
}

// Proxy is one revision of an Egress: a SOCKS5 server (RFC 1928) and, when
// Username is set, its RFC 1929 credentials.
type Proxy struct {
	Name     string `json:"name"`
	Revision uint64 `json:"revision"`
	// Address is HOST:PORT; a hostname is resolved with Config.Resolvers.
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// Resolver is a caller's Resolver: upstreams (HOST or HOST:PORT, port 53 by
// default) asked in order until one answers.
type Resolver struct {
	Name      string   `json:"name"`
	Upstreams []string `json:"upstreams"`
}

// Hello is what a process says about itself when a node connects.
type Hello struct {
	Protocol int    `json:"protocol"`
	Revision string `json:"revision"` // source revision of its build
	// Release of its build ("" from builds before release lines counted).
	Release    string `json:"release,omitempty"`
	Generation uint64 `json:"generation"`
	PID        int    `json:"pid"`
}

// Stats are the process's state and counters; counters never decrease.
type Stats struct {
	Listening  bool `json:"listening"`  // has its sockets and is accepting
	Configured bool `json:"configured"` // a Config was applied
	Draining   bool `json:"draining"`
	Routes     int  `json:"routes"`

	Active   int64  `json:"active"`   // connections being carried now
	Accepted uint64 `json:"accepted"` // connections accepted in all
	Refused  uint64 `json:"refused"`  // closed at once: no egress route, too many, draining
	Failed   uint64 `json:"failed"`   // the proxy could not be reached or refused the connect
	Closed   uint64 `json:"closed"`   // carried ones closed by the drain deadline
	Warm     int    `json:"warm"`     // greeted proxy connections ready in the warm pools

	DNSAnswered uint64 `json:"dns_answered"`
	DNSFailed   uint64 `json:"dns_failed"`  // no upstream answered in time
	DNSDropped  uint64 `json:"dns_dropped"` // no resolver route, not a DNS query, too many in flight
}
