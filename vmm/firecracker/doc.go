// Package firecracker is the Firecracker side of a kibotos VMM backend:
// the VM description as a Firecracker --config-file, the jailer command
// line and chroot layout, a client for the Firecracker HTTP API on its unix
// socket, and the host side of the hybrid vsock ("CONNECT <port>\n",
// "OK <hostport>\n") by which the node reaches the guest agent.
//
// What was run, and what was not. Everything here was written against the
// published Firecracker documentation (src/firecracker/swagger/firecracker.yaml,
// docs/jailer.md, docs/vsock.md, the argument parser of src/firecracker/src/main.rs
// and the config-file example tests/framework/vm_config.json). It has only
// been run by its unit tests, against fakes: the config-file JSON is compared
// with golden text, the jailer argv with expected slices, the API client with
// an httptest server on a unix socket, the vsock dialer with a fake unix
// socket server that answers the handshake correctly, wrongly or not at all.
// A real Firecracker or jailer has never been run against this code: no
// firecracker or jailer binary is available on the machines this was
// developed on. Field names, the jailer
// argv and the handshake therefore follow the documents, not an observed
// run; the first real run is still to come and may find what documents
// leave out (for example how the jailer places itself in cgroups when no
// --cgroup is given and the process already lives in a systemd unit).
//
// Not done here, and needed before a first real run: the guest agent
// listens on a virtio-serial port today and must also listen on AF_VSOCK
// port Backend.AgentPort (with vsock support in the Platform kernel); and
// agent/runtime needs hooks it lacks: Prepare (stage the jail after the
// writable disk exists, before the unit starts), Remove (delete the jail
// after the VMM exited) and ExecPath (the unit's main process ends up
// running the jailer's copy of firecracker, not Argv's first element).
//
// The runtime (agent/runtime) is not imported here: it imports the vmm
// packages, so this package describes an Instance with its own Instance and
// Files types and agent/runtime adapts its Spec and Paths to them, as it
// does for vmm/qemu. The external test package shows that adapter compiles
// against runtime.Backend.
package firecracker
