// Package guest is the guest agent: the process that runs inside a micro-VM
// (`kibotos guest-agent`, PID 1 of the initramfs) and serves the node over
// the guestproto protocol on a virtio-serial port.
//
// Serve holds the protocol logic and runs anywhere (tests drive it over a
// socketpair). The PID 1 duties — loading modules, mounting the pseudo
// filesystems, reaping orphans, powering off — live in init.go and only run
// when the agent is PID 1 or is told to.
//
// The agent must never reap a process it did not start through its single
// reaper (exec exit statuses are dispatched by pid), never trust the node's
// bytes to be framed correctly, never power off except through
// Options.PowerOff, and never mount a disk the node names by serial on a
// path a Workspace's files could redirect (a symbolic link under the
// Workspace root).
package guest
