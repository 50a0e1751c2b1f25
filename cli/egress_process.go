package cli

import (
	"time"

	"github.com/kibotos/kibotos/agent/egress"
)

// EgressServeCmd is the egress process (internal role, `kibotos egress
// serve`: `kibo egress` is the operator's Egress objects). The node starts it as
// its own systemd unit under the kibotos-egress user without capabilities,
// then hands it its sockets, routes and credentials over the control
// socket (package agent/egress documents the protocol and what the node
// sets up).
type EgressServeCmd struct {
	SocketDir  string        `name:"socket-dir" required:"" help:"Directory of the control socket, made by the node: owned by this user, mode 0700."`
	Generation uint64        `name:"generation" required:"" help:"Generation number given by the node."`
	Grace      time.Duration `name:"grace" default:"10s" help:"On SIGTERM: how long carried connections may go on before they are closed."`
	// Warm's default is egress.DefaultWarmConnections (a test holds them equal).
	Warm      int    `name:"warm-connections" default:"2" help:"Greeted, authenticated connections kept ready per proxy revision while guests use it, so a guest's connection costs one round trip to the proxy (0: none, at most 16)."`
	AllowRoot bool   `name:"allow-root" hidden:"" help:"Run as root or with capabilities (tests only)."`
	LogLevel  string `name:"log-level" default:"info" enum:"debug,info,warn,error" help:"Log level (debug, info, warn, error)."`
	LogFormat string `name:"log-format" default:"text" enum:"text,json" help:"Log format: text, or json (one object per line)."`
}

func (c *EgressServeCmd) Run(g *Globals) error {
	if !c.AllowRoot {
		if err := egress.CheckUnprivileged(); err != nil {
			return err
		}
	}
	log := newLogger(g.stderr, c.LogLevel, c.LogFormat)
	return egress.RunProcess(g.ctx, egress.Options{SocketDir: c.SocketDir, Generation: c.Generation, WarmConnections: c.Warm, Logger: log}, c.Grace)
}
