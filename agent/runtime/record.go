package runtime

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/recordfmt"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// RecordVersion is the format of launch and registry records this build
// writes and the newest it reads. Older formats get an explicit upgrade here
// when there are any; newer ones are refused.
const RecordVersion = 1

// LaunchRecordFile is the launch record's name in the Instance directory.
const LaunchRecordFile = "systemd.json"

// LaunchRecord is systemd.json: written before the VMM unit starts, then
// completed with what identifies the running process.
type LaunchRecord struct {
	FormatVersion int    `json:"format_version"`
	InstanceID    string `json:"instance_id"`
	// NodeID is the node that launched it.
	NodeID string `json:"node_id,omitempty"`
	// LaunchID is unique per launch of the Instance.
	LaunchID string `json:"launch_id"`
	Unit     string `json:"unit"`
	// Host, when set, is the warm guest this Instance was made from
	// (Adopt): its unit, directory and network keep that guest's names.
	Host    string `json:"host,omitempty"`
	Backend string `json:"backend"`
	// Argv is the command the unit runs (ExecStart).
	Argv []string `json:"argv"`
	// VMMArgv is the VMM's own command line, what the main process runs
	// once the log wrapper exec'd it.
	VMMArgv         []string `json:"vmm_argv"`
	InstallationID  string   `json:"installation_id"`
	InstallationDir string   `json:"installation_dir"`
	VCPUs           int      `json:"vcpus"`
	MemoryMiB       int      `json:"memory_mib"`
	DiskMiB         int      `json:"disk_mib"`
	// RootImage and LayerPath: the template image and the retained layer.
	RootImage string `json:"root_image,omitempty"`
	LayerPath string `json:"layer_path,omitempty"`
	// Volumes are the Volume disks attached at launch.
	Volumes   []VolumeDisk `json:"volumes,omitempty"`
	CreatedAt time.Time    `json:"created_at"`

	// Confinement is how the VMM was confined at launch. nil: a launch by
	// a build from before VMM confinement (QEMU as root, no seccomp, serial
	// console appended by QEMU to console.log without bound, sockets in the
	// Instance directory); such VMMs keep running that way until their next
	// start, and takeover accepts both.
	Confinement *Confinement `json:"confinement,omitempty"`

	// Network is the Instance's network (Spec.Network), reserved before
	// the namespace is made.
	Network *NetworkRecord `json:"network,omitempty"`
	// Process is set once the unit runs the VMM.
	Process *ProcessRecord `json:"process,omitempty"`
	// Guest is the guest claimed at the readiness check, or the one a
	// restart of it brought up (a new boot id) once it was reconfigured.
	Guest *GuestRecord `json:"guest,omitempty"`
	// Configured is the launch-time configuration beyond the network:
	// the hostname and the mounts the guest was told since it booted
	// (or, restored, since the guest it was saved from booted). A guest
	// that restarts is told them again (syncGuest), after its network.
	Configured *guestproto.ConfigureRequest `json:"configured,omitempty"`
	// Stopped is set when the node stopped the VMM on purpose.
	Stopped *time.Time `json:"stopped,omitempty"`
	// Unfinished is set from a launch's first record until its start is
	// done: the guest told its configuration and, when the starter has
	// steps of its own after Start (Spec.Staged), those done as well
	// (Finish). A node that restarts in between finds the start cut
	// short, its guest perhaps never told its filesystem: takeover makes
	// the Instance FAILED, its VMM left running for Delete, and the start
	// is done again. Records from before this field have none: their
	// starts are taken as done.
	Unfinished bool `json:"unfinished,omitempty"`
}

// Confinement is what a confined VMM launch was given.
type Confinement struct {
	// User is the VMM account, UID its uid: takeover checks the running
	// process has it.
	User string `json:"user"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	// Seccomp: QEMU runs with -sandbox (qemu.SandboxOptions).
	Seccomp bool `json:"seccomp"`
	// Console is "socket": the node reads the serial console into a
	// size-capped console.log (console.go).
	Console   string `json:"console"`
	MemoryMax uint64 `json:"memory_max"`
	TasksMax  uint64 `json:"tasks_max"`
}

// ProcessRecord identifies the VMM process of one run of the unit.
type ProcessRecord struct {
	InvocationID string `json:"invocation_id"`
	// MainPID is the PID in the systemd manager's namespace, HostPID in ours.
	MainPID uint32 `json:"main_pid"`
	HostPID int    `json:"host_pid"`
	// StartTime is field 22 of /proc/<pid>/stat (clock ticks since boot).
	StartTime    uint64    `json:"start_time"`
	Exe          string    `json:"exe"`
	ExeDev       uint64    `json:"exe_dev"`
	ExeIno       uint64    `json:"exe_ino"`
	ControlGroup string    `json:"control_group"`
	NetNS        string    `json:"netns"`
	StartedAt    time.Time `json:"started_at"`
}

// GuestRecord is the guest the node claimed when it first answered.
type GuestRecord struct {
	BootID       string   `json:"boot_id"`
	Protocol     int      `json:"protocol"`
	AgentVersion string   `json:"agent_version,omitempty"`
	Capabilities []string `json:"capabilities,omitempty"`
}

// EndedRecord is runtime/registry/<id>.json: kept until ctrl no longer needs it.
type EndedRecord struct {
	FormatVersion int          `json:"format_version"`
	InstanceID    string       `json:"instance_id"`
	EndedAt       time.Time    `json:"ended_at"`
	How           string       `json:"how"` // stopped, forced, machine exited, never started
	Error         string       `json:"error,omitempty"`
	Launch        LaunchRecord `json:"launch"`
}

// ErrNewerRecord: the record's format is one this build does not read
// (a newer kibotos wrote it).
var ErrNewerRecord = recordfmt.ErrOutOfRange

// recordRange is the formats of launch and registry records this build reads.
var recordRange = recordfmt.Current(RecordVersion)

// writeFileAtomic writes a local record (0600) through a temporary file
// (storagepool.WriteFile).
func writeFileAtomic(path string, data []byte) error {
	return storagepool.WriteFile(path, data, 0o600, storagepool.Temp{Purpose: "record"})
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	if err := writeFileAtomic(path, append(b, '\n')); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// WriteLaunchRecord writes r as the launch record in dir.
func WriteLaunchRecord(dir string, r *LaunchRecord) error {
	r.FormatVersion = RecordVersion
	return writeJSON(filepath.Join(dir, LaunchRecordFile), r)
}

// ReadLaunchRecord reads the launch record at path, refusing formats newer
// than RecordVersion and records that lack what identifies the launch.
func ReadLaunchRecord(path string) (*LaunchRecord, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("launch record %s: %w", path, err)
	}
	var head struct {
		FormatVersion int `json:"format_version"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("launch record %s is corrupt: %w; keep it and inspect the unit it names", path, err)
	}
	if head.FormatVersion < 1 {
		return nil, fmt.Errorf("launch record %s has no format version: it is corrupt", path)
	}
	if err := recordRange.Check(path, head.FormatVersion); err != nil {
		return nil, fmt.Errorf("launch record %w", err)
	}
	var r LaunchRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("launch record %s is corrupt: %w", path, err)
	}
	if r.InstanceID == "" || r.Unit == "" || r.LaunchID == "" {
		return nil, fmt.Errorf("launch record %s is incomplete: instance id %q, unit %q, launch id %q", path, r.InstanceID, r.Unit, r.LaunchID)
	}
	if r.Host != "" && (!IsWarm(r.Host) || !idRE.MatchString(r.Host)) {
		return nil, fmt.Errorf("launch record %s says instance %s was made from %q, which is not a warm guest's id", path, r.InstanceID, r.Host)
	}
	if r.Unit != UnitName(r.dirName()) {
		return nil, fmt.Errorf("launch record %s names unit %q, but instance %s runs as %s", path, r.Unit, r.InstanceID, UnitName(r.dirName()))
	}
	if want := filepath.Base(filepath.Dir(path)); r.dirName() != want {
		return nil, fmt.Errorf("launch record %s names instance %q, but lives in the directory of %q", path, r.dirName(), want)
	}
	return &r, nil
}

// dirName names the Instance's directory and unit: its own id, or the
// warm guest's it was made from.
func (r *LaunchRecord) dirName() string {
	if r.Host != "" {
		return r.Host
	}
	return r.InstanceID
}

// ReadEndedRecord reads a registry record, <instance id>.json, refusing
// formats newer than RecordVersion and records of another Instance (ctrl
// would store a cleanup conclusion under the wrong id, or none at all).
func ReadEndedRecord(path string) (*EndedRecord, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ended-instance record %s: %w", path, err)
	}
	var r EndedRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("ended-instance record %s is corrupt: %w", path, err)
	}
	if r.FormatVersion < 1 {
		return nil, fmt.Errorf("ended-instance record %s has no format version: it is corrupt", path)
	}
	if err := recordRange.Check(path, r.FormatVersion); err != nil {
		return nil, fmt.Errorf("ended-instance record %w", err)
	}
	if want := strings.TrimSuffix(filepath.Base(path), ".json"); r.InstanceID != want {
		return nil, fmt.Errorf("ended-instance record %s names instance %q, but is the record of %q", path, r.InstanceID, want)
	}
	return &r, nil
}
