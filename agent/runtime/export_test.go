package runtime

import "net"

// UnconfinedVMM makes the Runtime launch VMMs as builds before VMM
// confinement did (root, no seccomp, file console): the Instances an
// upgraded node has to take over.
func UnconfinedVMM(c Config) Config {
	c.unconfinedVMM = true
	return c
}

// VMMLimits is vmmLimits for tests.
var VMMLimits = vmmLimits

// BeforeSave runs f during every pause just before QEMU saves the guest
// (to kill the VMM mid-pause).
func BeforeSave(c Config, f func(hostPID int)) Config {
	c.beforeSave = f
	return c
}

// GuestConn puts f between the node and each new connection to a guest
// agent's channel.
func GuestConn(c Config, f func(net.Conn) net.Conn) Config {
	c.guestConn = f
	return c
}
