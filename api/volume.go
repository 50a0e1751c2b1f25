package api

import (
	"path"
	"regexp"
	"strings"
	"time"
)

// Volumes. A Volume is a block file (raw, ext4 inside) in a storage pool,
// attached to at most one Workspace and mounted in its guest at a path.
// It outlives the Workspace: deleting the Workspace detaches it. Its use
// right follows the Workspace's execution, like the retained layer's: the
// node running the Workspace holds both. Every change of the file is a
// command ctrl sends to one node (create, resize, delete); a Volume
// created along with a Workspace (--new-volume) is made by the
// Workspace's first start instead.

// Volume states.
const (
	// VolumeCreating: a node is making the file, or (created along with a
	// Workspace) the Workspace's first start will.
	VolumeCreating  = "CREATING"
	VolumeAvailable = "AVAILABLE"
	// VolumeFailed: its node could not make it; delete it.
	VolumeFailed   = "FAILED"
	VolumeDeleting = "DELETING"
	// VolumeLost: its pool was declared lost; it can only be deleted.
	VolumeLost = "LOST"
)

// Volume command kinds a node executes.
const (
	VolCmdCreate = "create"
	VolCmdResize = "resize"
	VolCmdDelete = "delete"
)

// Limits of Volumes.
const (
	MinVolumeSize = 16 << 20
	MaxVolumeSize = 16 << 40
	// VolumeSizeUnit: sizes are whole MiB (QEMU resizes block devices in
	// sectors; whole MiB keep every layer of the stack aligned).
	VolumeSizeUnit = 1 << 20
	// MaxWorkspaceVolumes bounds the Volumes of one Workspace (each is a
	// virtio-blk device of its VM).
	MaxWorkspaceVolumes = 8
)

// Volume is one Volume as ctrl stores it.
type Volume struct {
	VolumeID string `json:"volume_id"`
	Name     string `json:"name"`
	// Namespace is the namespace it belongs to (its name is unique
	// there); absent: default.
	Namespace string `json:"namespace,omitempty"`
	Version   uint64 `json:"version"`
	State     string `json:"state"`
	PoolID    string `json:"pool_id"`
	Shared    bool   `json:"shared,omitempty"`
	// SizeBytes is the size of the file (and of its filesystem, grown
	// online or at the next mount).
	SizeBytes uint64 `json:"size_bytes"`
	// NodeID holds the use right while Held; otherwise it is the node that
	// made or last used the Volume (in a standalone pool the only one that
	// can use it, unless the pool moved to another host).
	NodeID string `json:"node_id,omitempty"`
	Held   bool   `json:"held"`
	// Made: a node made the file. A Volume created along with a Workspace
	// is made by that Workspace's first start.
	Made bool `json:"made"`
	// WorkspaceID and MountPath: the Workspace it is attached to and where
	// its guest mounts it; empty when detached.
	WorkspaceID string `json:"workspace_id,omitempty"`
	MountPath   string `json:"mount_path,omitempty"`
	// Pending is the command a node has not answered yet.
	Pending *VolumeCommand `json:"pending,omitempty"`
	// Expansion is a resize that has not completed: in progress (a resize
	// command pending), or done on the file with the guest's filesystem
	// still to grow (it grows when the guest next mounts the Volume).
	Expansion *VolumeExpansion `json:"expansion,omitempty"`
	// Error is why the latest command on it failed ("" after a success).
	Error string `json:"error,omitempty"`
	// DeleteWaitsForPool: DELETING, and no node that can remove the file
	// is a member of its pool yet.
	DeleteWaitsForPool string     `json:"delete_waits_for_pool,omitempty"`
	CreatedAt          time.Time  `json:"created_at"`
	UpdatedAt          time.Time  `json:"updated_at"`
	DeletedAt          *time.Time `json:"deleted_at,omitempty"`
}

// VolumeCommand is a command ctrl sent (or will send) to a node.
type VolumeCommand struct {
	Kind      string    `json:"kind"`
	CommandID string    `json:"command_id"`
	NodeID    string    `json:"node_id"`
	IssuedAt  time.Time `json:"issued_at"`
	// SizeBytes is the size to create or grow to.
	SizeBytes uint64 `json:"size_bytes,omitempty"`
	// InstanceID (resize): the running Instance the Volume is attached to,
	// whose guest sees the new size at once.
	InstanceID string `json:"instance_id,omitempty"`
}

// VolumeExpansion is a resize that has not completed.
type VolumeExpansion struct {
	TargetBytes uint64    `json:"target_bytes"`
	Since       time.Time `json:"since"`
	// FilesystemPending: the file has the new size but the running guest
	// did not grow its filesystem (the grow happens at its next mount).
	FilesystemPending bool   `json:"filesystem_pending,omitempty"`
	Reason            string `json:"reason,omitempty"`
}

// VolumeList is one page of Volumes, by id.
type VolumeList struct {
	Volumes       []Volume `json:"volumes"`
	NextPageToken string   `json:"next_page_token,omitempty"`
}

// VolumeCreateRequest is `volume create`.
type VolumeCreateRequest struct {
	WriteMeta
	Name      string `json:"name"`
	SizeBytes uint64 `json:"size_bytes"`
	PoolID    string `json:"pool_id,omitempty"`
	NodeID    string `json:"node_id,omitempty"`
}

// VolumeResizeRequest is `volume resize`.
type VolumeResizeRequest struct {
	WriteMeta
	SizeBytes uint64 `json:"size_bytes"`
}

// VolumeMount is one Volume of a Workspace and where its guest mounts it.
type VolumeMount struct {
	VolumeID string `json:"volume_id"`
	Name     string `json:"name"`
	Path     string `json:"path"`
}

// VolumeAttach asks create to attach an existing Volume (name or id).
type VolumeAttach struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
}

// NewVolume asks create to make a Volume along with the Workspace.
type NewVolume struct {
	SizeBytes uint64 `json:"size_bytes"`
	Path      string `json:"path"`
}

// VolumeTask is a Volume command for a node, with what it needs.
type VolumeTask struct {
	Command  VolumeCommand `json:"command"`
	VolumeID string        `json:"volume_id"`
	PoolID   string        `json:"pool_id"`
	// MountPath (resize of an attached Volume): where the running guest
	// mounts it, to grow its filesystem there.
	MountPath   string `json:"mount_path,omitempty"`
	WorkspaceID string `json:"workspace_id,omitempty"`
}

// VolumeTaskResult is the node's answer to a VolumeTask.
type VolumeTaskResult struct {
	VolumeID  string `json:"volume_id"`
	CommandID string `json:"command_id"`
	Outcome   string `json:"outcome"` // ok, failed
	Error     string `json:"error,omitempty"`
	// FilesystemPending (resize ok): the file grew but the running
	// guest's filesystem did not; Error says why.
	FilesystemPending bool `json:"filesystem_pending,omitempty"`
}

// TaskVolume is one Volume of a start command: the node attaches its file
// to the VM and the guest mounts it at Path.
type TaskVolume struct {
	VolumeID  string `json:"volume_id"`
	PoolID    string `json:"pool_id"`
	Path      string `json:"path"`
	SizeBytes uint64 `json:"size_bytes"`
	// Create: the file is not made yet (a Volume created along with the
	// Workspace); the node makes it. Without it a missing file fails the
	// start rather than being made empty.
	Create bool `json:"create,omitempty"`
}

var (
	volumeNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)
	volumeIDPattern   = regexp.MustCompile(`^vol-[a-z2-7]{26}$`)
)

// VolumeIDPrefix starts every Volume id; names may not start with it.
const VolumeIDPrefix = "vol-"

// ValidVolumeName checks a Volume name: 1-63 lowercase letters, digits,
// '.' or '-', not starting with "vol-" (that is how ids look).
func ValidVolumeName(name string) error {
	if !volumeNamePattern.MatchString(name) || strings.HasPrefix(name, VolumeIDPrefix) {
		return Errorf(CodeInvalidArgument, "volume name %q is not valid: use 1-63 lowercase letters, digits, '.' or '-', not starting with %q", name, VolumeIDPrefix)
	}
	return nil
}

// IsVolumeID reports whether s has the form of a Volume id.
func IsVolumeID(s string) bool { return volumeIDPattern.MatchString(s) }

// ValidVolumeRef checks a name or id given to name a Volume.
func ValidVolumeRef(s string) error {
	if IsVolumeID(s) {
		return nil
	}
	return ValidVolumeName(s)
}

// ValidVolumeSize checks a size to create or grow a Volume to.
func ValidVolumeSize(what string, n uint64) error {
	if n < MinVolumeSize || n > MaxVolumeSize || n%VolumeSizeUnit != 0 {
		return Errorf(CodeInvalidArgument, "%s: size %d bytes (%s) is not valid: give whole MiB from 16MiB to 16TiB, such as 10GiB", what, n, FormatBytes(n))
	}
	return nil
}

// reservedMounts are guest paths a Volume may not be mounted on or under:
// the Workspace's pseudo filesystems.
var reservedMounts = []string{"/proc", "/sys", "/dev"}

// ValidMountPath checks where a guest mounts a Volume: an absolute, clean
// path of at most 255 bytes, not / and not under /proc, /sys or /dev.
func ValidMountPath(p string) error {
	bad := func(why string) error {
		return Errorf(CodeInvalidArgument, "mount path %q is not valid: %s", p, why)
	}
	switch {
	case len(p) == 0 || len(p) > 255:
		return bad("give an absolute path of 1-255 bytes, such as /data")
	case !strings.HasPrefix(p, "/") || path.Clean(p) != p:
		return bad("give an absolute path without '.', '..' or a trailing '/', such as /data")
	case p == "/":
		return bad("the Workspace's root is its writable layer; mount the Volume below it, such as /data")
	case strings.ContainsAny(p, ",\x00\n\r\t\\"):
		return bad("it contains a comma, a backslash or a control character")
	}
	for _, r := range reservedMounts {
		if p == r || strings.HasPrefix(p, r+"/") {
			return bad("it is on or under " + r + ", which the Workspace's own filesystems use")
		}
	}
	return nil
}

// MountsOverlap reports whether one of two mount paths is the other or
// lies under it (mounting both would hide one).
func MountsOverlap(a, b string) bool {
	return a == b || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}

// VolumeFilePath is where a Volume's file lives in its pool's directory.
func VolumeFilePath(poolDir, volumeID string) string {
	return path.Join(poolDir, "volumes", "data", volumeID+".img")
}
