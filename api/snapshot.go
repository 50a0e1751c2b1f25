package api

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Pause and resume. A paused Workspace's guest memory and device state is
// a snapshot in the pool of its writable layer
// (<pool>/snapshots/<workspace>/); its VMM is gone and its node's CPU and
// memory are free. Resume restores the snapshot on any node that reaches
// the pool and can run it: the snapshot records what the restoring VMM
// must match (its compatibility tuple), and a node that does not is never
// tried.

// Workspace states of pause.
const (
	// WorkspacePausing: the node is saving the guest; it runs until done.
	WorkspacePausing = "PAUSING"
	// WorkspacePaused: the snapshot is saved, nothing runs.
	WorkspacePaused = "PAUSED"
)

// WSCmdPause saves the running guest into a snapshot and ends its VMM.
const WSCmdPause = "pause"

// SnapshotCompat is what a VMM restoring a snapshot must match.
type SnapshotCompat struct {
	// InstallationID is the runtime installation (Platform) the guest
	// runs: its kernel is in the saved memory.
	InstallationID string `json:"installation_id"`
	// QEMUVersion is the VMM's own version (query-version).
	QEMUVersion string `json:"qemu_version"`
	Accel       string `json:"accel"`
	CPUModel    string `json:"cpu_model"`
	// CPUFlags is a digest of the host CPU's flags when the guest CPU
	// model is the host's (KVM); "" when the model does not depend on them.
	CPUFlags  string `json:"cpu_flags,omitempty"`
	MemoryMiB int    `json:"memory_mib"`
	VCPUs     int    `json:"vcpus"`
	// Devices is the device layout, in order (disks by serial, network,
	// guest channels): the restoring VMM must have the same.
	Devices []string `json:"devices"`
}

// Snapshot is a paused Workspace's saved state.
type Snapshot struct {
	PoolID string `json:"pool_id"`
	Shared bool   `json:"shared,omitempty"`
	// NodeID is the node that saved it (in a standalone pool the only one
	// that can resume it, unless the pool moved).
	NodeID     string         `json:"node_id"`
	InstanceID string         `json:"instance_id"`
	SizeBytes  uint64         `json:"size_bytes"`
	Compat     SnapshotCompat `json:"compat"`
	TakenAt    time.Time      `json:"taken_at"`
	// Discarded: the Workspace was stopped while paused; the node of its
	// next start or delete removes the files.
	Discarded bool `json:"discarded,omitempty"`
	// From (a fork's, until its first start is over) is the Workspace
	// whose snapshot this is: the node makes the fork's files from its
	// (InstanceID names the source's paused Instance).
	From string `json:"from,omitempty"`
}

// SnapshotReport is what a node's answer to a pause says of the snapshot.
type SnapshotReport struct {
	SizeBytes uint64         `json:"size_bytes"`
	Compat    SnapshotCompat `json:"compat"`
}

// ResumeInfo is what a node's VMM can restore, as its report says.
type ResumeInfo struct {
	QEMUVersion string `json:"qemu_version"`
	Accel       string `json:"accel"`
	CPUModel    string `json:"cpu_model"`
	CPUFlags    string `json:"cpu_flags,omitempty"`
	// Installations are the runtime installations the node has.
	Installations []string `json:"installations,omitempty"`
}

// MaxDevices bounds a snapshot's device layout (it comes from a node).
const MaxDevices = 32

// Check validates a compatibility tuple a node reported.
func (c *SnapshotCompat) Check() error {
	if c.InstallationID == "" || c.QEMUVersion == "" || c.Accel == "" || c.MemoryMiB <= 0 || c.VCPUs <= 0 || len(c.Devices) > MaxDevices {
		return Errorf(CodeInvalidArgument, "snapshot compatibility %+v is incomplete or too large", *c)
	}
	for _, s := range append([]string{c.InstallationID, c.QEMUVersion, c.Accel, c.CPUModel, c.CPUFlags}, c.Devices...) {
		if len(s) > 200 || strings.ContainsAny(s, "\x00\n") {
			return Errorf(CodeInvalidArgument, "snapshot compatibility field %q is not valid", s)
		}
	}
	return nil
}

// Incompatible says why a node whose VMM is r cannot restore a snapshot of
// c, "" when it can.
func (c *SnapshotCompat) Incompatible(r *ResumeInfo) string {
	switch {
	case r == nil:
		return "it does not say what its VMM can restore (an older build)"
	case r.QEMUVersion != c.QEMUVersion:
		return fmt.Sprintf("its QEMU is %s, the snapshot's %s", r.QEMUVersion, c.QEMUVersion)
	case r.Accel != c.Accel:
		return fmt.Sprintf("its accelerator is %s, the snapshot's %s", r.Accel, c.Accel)
	case r.CPUModel != c.CPUModel || r.CPUFlags != c.CPUFlags:
		return fmt.Sprintf("its guest CPU (%s) differs from the snapshot's (%s)", cpuName(r.CPUModel, r.CPUFlags), cpuName(c.CPUModel, c.CPUFlags))
	case !slices.Contains(r.Installations, c.InstallationID):
		return "it lacks the snapshot's runtime installation " + c.InstallationID
	}
	return ""
}

func cpuName(model, flags string) string {
	if flags == "" {
		return model
	}
	return model + " with flags " + flags[:min(len(flags), 12)]
}
