package cli

import (
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/vmm/guest"
)

// GuestAgentCmd is the agent inside a micro-VM (internal role, PID 1 of the
// Platform initramfs). It serves the node on a virtio-serial port.
type GuestAgentCmd struct {
	PortName  string `name:"port-name" default:"kibotos.agent" help:"Name of the virtio-serial port to serve the node on."`
	DeviceDir string `name:"device-dir" default:"/dev/virtio-ports" help:"Directory of the named virtio-serial port links."`
	Init      bool   `name:"init" help:"Do the PID 1 duties (mounts, modules, reaping, poweroff) even when not PID 1."`
}

func (c *GuestAgentCmd) Run(g *Globals) error {
	return guest.Run(g.ctx, guest.RunOptions{
		PortName:     c.PortName,
		DeviceDir:    c.DeviceDir,
		Init:         c.Init,
		AgentVersion: buildinfo.ReleaseName(),
	})
}
