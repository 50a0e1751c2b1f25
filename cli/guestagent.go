package cli

import (
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/vmm/guest"
)

// GuestAgentCmd is the agent inside a micro-VM (internal role, PID 1 of the
// Platform initramfs). It serves the node on one virtio-serial port and the
// data plane on another.
type GuestAgentCmd struct {
	PortName     string `name:"port-name" default:"kibotos.agent" help:"Name of the virtio-serial port to serve the node on."`
	DataPortName string `name:"data-port-name" default:"kibotos.data" help:"Name of the virtio-serial port to serve the data plane on (a subset of the calls); empty for none. Its absence on the host does not keep the node's port from being served."`
	DeviceDir    string `name:"device-dir" default:"/dev/virtio-ports" help:"Directory of the named virtio-serial port links."`
	Init         bool   `name:"init" help:"Do the PID 1 duties (mounts, modules, reaping, poweroff) even when not PID 1."`
}

func (c *GuestAgentCmd) Run(g *Globals) error {
	return guest.Run(g.ctx, guest.RunOptions{
		PortName:     c.PortName,
		DataPortName: c.DataPortName,
		DeviceDir:    c.DeviceDir,
		Init:         c.Init,
		AgentVersion: buildinfo.ReleaseName(),
	})
}
