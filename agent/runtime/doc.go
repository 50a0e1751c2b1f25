// Package runtime runs a node's Instances: every Instance's VMM is a systemd
// transient unit (kibotos-vmm-<instance id>.service) started through package
// units, described by a launch record (systemd.json) in the Instance
// directory, and taken over by the next node process from that record.
//
// Layout under the storage root:
//
//	runtime/lock                        exclusive lock of the running node, naming its process and cgroup
//	runtime/instances/<id>/systemd.json launch record (format RecordVersion)
//	runtime/instances/<id>/...          disk, console.log, vmm.log, sockets
//	runtime/registry/<id>.json          records of ended Instances
//	machine-logs/<id>/                  console and VMM log tails of ended machines
//
// What it must never do: find or kill processes by name (a VMM is addressed
// by its unit name and verified by InvocationID, MainPID, process start time
// and executable dev:ino), guess ownership (a record that does not match the
// running unit, or a kibotos-vmm unit without a record, stops Open), or read
// a temporary file left by an interrupted write (they are deleted unread).
package runtime
