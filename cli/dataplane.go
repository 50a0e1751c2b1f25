package cli

import (
	"os/signal"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/agent/dataplane"
)

// DataplaneCmd is the data-plane process (internal role). The node starts
// it as its own systemd unit (agent/dataplane.Ensure) and pushes its state
// over the control socket; it never reads the node's state directory.
type DataplaneCmd struct {
	SocketDir  string        `name:"socket-dir" required:"" help:"Directory of the control socket (created 0700)."`
	Listen     string        `name:"listen" required:"" help:"Data-plane address to listen on (HOST:PORT)."`
	Generation uint64        `name:"generation" required:"" help:"Generation number given by the node."`
	Grace      time.Duration `name:"grace" default:"10s" help:"How long connections may take to end after SIGTERM before they are closed."`
	// Set by the node for a generation that takes over a predecessor's
	// listening socket or guest sessions (agent/dataplane.Ensure).
	AwaitListener   bool     `name:"await-listener" help:"Do not bind --listen: serve the listening socket the node hands over on the control socket."`
	Predecessor     uint64   `name:"predecessor" help:"Generation still draining whose guest sessions to borrow while its connections hold them."`
	TLSMinVersion   string   `name:"tls-min-version" default:"1.3" enum:"1.2,1.3" help:"Lowest TLS version accepted (1.2 or 1.3)."`
	TLSCipherSuites []string `name:"tls-cipher-suites" help:"TLS 1.2 cipher suites by Go name, comma-separated (needs --tls-min-version 1.2); default: Go's."`
	LogLevel        string   `name:"log-level" default:"info" enum:"debug,info,warn,error" help:"Log level (debug, info, warn, error)."`
	LogFormat       string   `name:"log-format" default:"text" enum:"text,json" help:"Log format: text, or json (one object per line)."`
}

func (c *DataplaneCmd) Run(g *Globals) error {
	log := newLogger(g.stderr, c.LogLevel, c.LogFormat)
	ctx, stop := signal.NotifyContext(g.ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv, err := dataplane.New(dataplane.Config{
		Listen:        c.Listen,
		AwaitListener: c.AwaitListener,
		Predecessor:   c.Predecessor,
		SocketDir:     c.SocketDir,
		Generation:    c.Generation,
		TLS:           dataplane.TLSSettings{MinVersion: c.TLSMinVersion, CipherSuites: c.TLSCipherSuites},
		Grace:         c.Grace,
		Logger:        log,
	})
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}
