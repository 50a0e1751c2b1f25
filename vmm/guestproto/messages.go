package guestproto

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"time"
)

// Calls. Each call is one yamux stream opened by the node: a Request header
// frame, call-specific data, then a Response header frame.
const (
	CallGuestInfo  = "guest-info"
	CallConfigure  = "configure"
	CallExec       = "exec"
	CallExecAttach = "exec-attach" // attaches a stdio stream to an exec by ID
	// CallExecConnect attaches to a kept exec by pid (ExecConnect): its
	// stdio streams by ID as an exec's, then from the Response on the
	// stream carries what an exec's does (CapExecKeep).
	CallExecConnect = "exec-connect"
	// CallExecList lists the kept execs that run (ExecList).
	CallExecList  = "exec-list"
	CallFileWrite = "file-write"
	CallFileRead  = "file-read"
	CallStat      = "stat"
	CallSync      = "sync"
	CallFreeze    = "freeze"
	CallThaw      = "thaw"
	CallStop      = "stop"
	// CallSetTime sets the guest's clock (after a restore it is behind by
	// the time the guest was saved).
	CallSetTime = "set-time"
	// CallPortForward connects to a TCP port of the guest: after the
	// Response the stream carries the connection's bytes both ways.
	CallPortForward = "port-forward"
	// CallGrowFS grows the ext4 filesystem mounted at a path to fill its
	// device (a Volume grown while its Workspace runs).
	CallGrowFS = "grow-fs"
	// CallIdentity gives a restored fork its own identity (CapIdentity).
	CallIdentity = "identity"
	// CallWatch watches a directory (CapWatch): after the Response the
	// stream carries WatchFrames until the node closes it.
	CallWatch = "watch"
)

// DataPortName is the virtio-serial port of the data-plane channel. The
// guest agent serves it next to the node's port with the same agent state,
// but only the calls of DataCalls; the node's port name stays with the node
// runtime (agent/runtime.AgentPortName).
const DataPortName = "kibotos.data"

// DataCalls are the calls served on the data-plane channel. Configure,
// sync, freeze, thaw, grow-fs and stop change the guest as a whole and stay
// with the node: the data channel answers them with CodeUnsupported.
var DataCalls = []string{CallGuestInfo, CallExec, CallExecAttach, CallExecConnect, CallExecList, CallFileRead, CallFileWrite, CallStat, CallPortForward, CallWatch}

// Capabilities a guest agent announces in GuestInfo.
const (
	CapExec      = "exec"
	CapPTY       = "pty"
	CapFiles     = "files"
	CapConfigure = "configure"
	CapFreeze    = "freeze"
	CapStop      = "stop"
	// CapExecRoot: exec takes Root and runs the process chrooted there
	// (the Workspace's root filesystem mounted by configure).
	CapExecRoot = "exec-root"
	// CapPortForward: CallPortForward.
	CapPortForward = "port-forward"
	// CapBindMount: configure's Mounts take the option "bind": Source, a
	// file or directory of the agent's root, is bind-mounted on Target
	// (how a Workspace's root gets the agent's ResolvConf).
	CapBindMount = "mount-bind"
	// CapMountSerial: configure's Mounts take a Source "serial:SERIAL",
	// the virtio-blk disk with that serial (MountSerialPrefix), and the
	// option "x-grow" (MountOptGrow).
	CapMountSerial = "mount-serial"
	// CapGrowFS: CallGrowFS.
	CapGrowFS = "grow-fs"
	// CapWatch: CallWatch.
	CapWatch = "watch"
)

// MountSerialPrefix begins a Mount Source naming a virtio-blk disk by its
// serial (qemu.Disk.Serial): the guest's vdX names follow the order the
// kernel probes the disks in, which the node does not choose. The agent
// waits for the disk to appear (probing may lag the agent's start), and
// mounts it only on a Target reached without a symbolic link below the
// mount the Target lies in: the files of a Workspace's root are its
// user's, and must not redirect a Volume onto the agent's own root.
const MountSerialPrefix = "serial:"

// MountOptGrow is a Mount option the agent acts on and never passes to
// mount(2): once mounted, an ext4 filesystem smaller than its device is
// grown online to fill it (a Volume grown while its Workspace was
// stopped shows its new size at the next start).
const MountOptGrow = "x-grow"

// CapSetTime: CallSetTime, and configure's Interface.Flush.
const CapSetTime = "set-time"

// CapStopPrepare: stop prepares before it powers off: every filesystem of
// a disk mounted by configure (the Workspace's writable layer, its
// Volumes) is synced and frozen, and a stop whose processes do not end or
// whose filesystems cannot be synced or frozen fails (CodeDeadlineExceeded
// or CodeFailed) and leaves the guest running, those filesystems frozen.
const CapStopPrepare = "stop-prepare"

// CapExecImageConfig: an exec with Root takes its defaults from the
// root's ImageConfigPath when the file is there (a template built from an
// OCI image), and takes ExecRequest.DefaultEnv. A guest without it reads
// only Env: send it the defaults in Env.
const CapExecImageConfig = "exec-image-config"

// CapIdentity: CallIdentity. A fork of a paused Workspace is restored from
// the same memory as its source and its other forks: the same kernel
// random state, hostname and machine id. The call reseeds the kernel's
// CRNG with the node's random bytes (credited: RNDADDENTROPY, then
// RNDRESEEDCRNG) before it does anything else, then sets the hostname and
// writes a new machine id. The agent never reads the kernel's boot_id
// itself (GuestInfo.BootID is its own random id), so the kernel makes
// boot_id on its first read in the guest: after a fork's reseed, its own.
const CapIdentity = "identity"

// CapExecKeep: ExecRequest.Keep and Meta, CallExecConnect, CallExecList
// and ExecControl.Input and CloseStdin.
const CapExecKeep = "exec-keep"

// Bounds of kept execs: how many one guest keeps, and the size of each
// one's Meta.
const (
	MaxKeptExecs = 1024
	MaxExecMeta  = 8 << 10
)

// CapFilesAs: FileWriteRequest.Root, User and MakeDirs, and
// FileReadRequest.Root and User.
const CapFilesAs = "files-as"

// CapExecUser: an exec with Root takes ExecRequest.User, the account of
// the root's /etc/passwd it runs as instead of the image config's.
const CapExecUser = "exec-user"

// IdentityRequest is a fork's new identity.
type IdentityRequest struct {
	// Entropy is random bytes of the node, mixed into the kernel's pool
	// and credited (MinIdentityEntropy to MaxIdentityEntropy bytes).
	Entropy []byte `json:"entropy"`
	// Hostname, when set, replaces the kernel's hostname.
	Hostname string `json:"hostname,omitempty"`
	// MachineID (32 lowercase hex digits) is written to etc/machine-id
	// of each of Roots ("/" is the agent's own) whose etc is a directory.
	MachineID string   `json:"machine_id,omitempty"`
	Roots     []string `json:"roots,omitempty"`
}

// Bounds of IdentityRequest.Entropy: 32 bytes reseed the CRNG fully.
const (
	MinIdentityEntropy = 32
	MaxIdentityEntropy = 512
)

// CapWorkspaceEnv: configure takes Env, the Workspace's environment,
// which the agent keeps in memory (a restored guest has it still) and
// gives to every exec with Root, above DefaultEnv or the image config's
// env and below the exec's own Env. A guest without it would drop the
// variables: the node fails the start of a Workspace that has some.
const CapWorkspaceEnv = "workspace-env"

// Capabilities are every capability this build's guest agent announces
// and its node may use. A guest of an earlier build lacking some is still
// driven; only the calls that need those fail until it restarts.
var Capabilities = []string{CapExec, CapPTY, CapFiles, CapConfigure, CapFreeze, CapStop, CapExecRoot,
	CapPortForward, CapBindMount, CapMountSerial, CapGrowFS, CapSetTime, CapStopPrepare, CapExecImageConfig, CapIdentity, CapExecUser, CapExecKeep, CapWatch, CapFilesAs,
	CapWorkspaceEnv}

// SetTimeRequest is the time to set, Unix nanoseconds of the node's clock.
type SetTimeRequest struct {
	UnixNano int64 `json:"unix_nano"`
}

// ResolvConf is where configure writes the DNS servers, in the guest
// agent's own root. It is rewritten in place, so a bind mount of it (a
// Workspace root's /etc/resolv.conf) follows every later configure.
const ResolvConf = "/etc/resolv.conf"

// Request is the first frame of every stream.
type Request struct {
	Call string          `json:"call"`
	Args json.RawMessage `json:"args,omitempty"`
}

// Response is the reply frame of a call.
type Response struct {
	Error  *Error          `json:"error,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
}

// Error codes carried in Error.Code.
const (
	CodeInvalid     = "invalid"
	CodeNotFound    = "not_found"
	CodeUnsupported = "unsupported"
	CodeFailed      = "failed"
	// CodeDeadlineExceeded: the managed processes did not end in time.
	CodeDeadlineExceeded = "deadline_exceeded"
	// CodeResourceExhausted: a bound of the agent was reached (watches).
	CodeResourceExhausted = "resource_exhausted"
	// CodePermissionDenied: the user a call acts as may not (a file
	// write as a user).
	CodePermissionDenied = "permission_denied"
)

// Error is a call that failed in the guest.
type Error struct {
	Call    string `json:"call,omitempty"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Call != "" {
		return fmt.Sprintf("guest agent: %s: %s", e.Call, e.Message)
	}
	return "guest agent: " + e.Message
}

// GuestInfo describes the agent; it is the handshake reply and the
// result of CallGuestInfo.
type GuestInfo struct {
	Nonce        string   `json:"nonce"`
	Protocol     int      `json:"protocol"` // chosen version; 0 when refused
	MinProtocol  int      `json:"min_protocol"`
	MaxProtocol  int      `json:"max_protocol"`
	Capabilities []string `json:"capabilities,omitempty"`
	BootID       string   `json:"boot_id,omitempty"`
	AgentVersion string   `json:"agent_version,omitempty"`
	Refused      string   `json:"refused,omitempty"` // why the handshake was refused
}

// Has reports whether the agent announced capability c.
func (g GuestInfo) Has(c string) bool {
	for _, x := range g.Capabilities {
		if x == c {
			return true
		}
	}
	return false
}

// ConfigureRequest sets the guest's identity and network.
type ConfigureRequest struct {
	Hostname   string      `json:"hostname,omitempty"`
	Interfaces []Interface `json:"interfaces,omitempty"`
	DNS        []string    `json:"dns,omitempty"`
	Mounts     []Mount     `json:"mounts,omitempty"`
	// Env (CapWorkspaceEnv) is the Workspace's environment, NAME=value
	// sorted by name; it replaces the one the agent keeps, and nil keeps
	// that one. The values may be secrets: neither side logs them.
	Env []string `json:"env,omitempty"`
}

// Interface is one guest network interface, matched by name or MAC.
type Interface struct {
	Name      string   `json:"name,omitempty"`
	MAC       string   `json:"mac,omitempty"`
	Addresses []string `json:"addresses,omitempty"` // CIDR, e.g. 10.0.0.2/24
	Routes    []Route  `json:"routes,omitempty"`
	MTU       int      `json:"mtu,omitempty"`
	// Flush removes the interface's global addresses first (a restored
	// guest still has those of the VM it was saved from).
	Flush bool `json:"flush,omitempty"`
}

// Route is a route via an interface; Destination "default" or a CIDR.
type Route struct {
	Destination string `json:"destination"`
	Gateway     string `json:"gateway,omitempty"`
}

// Mount is a filesystem to mount in the guest. Source is a path (a block
// device, or with the option "bind" a file or directory of the agent's
// root) or MountSerialPrefix and a disk serial.
type Mount struct {
	Source  string   `json:"source"`
	Target  string   `json:"target"`
	FSType  string   `json:"fstype"`
	Options []string `json:"options,omitempty"`
}

// WinSize is a terminal size.
type WinSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ExecRequest starts a process. Stdio streams are attached with
// CallExecAttach streams carrying the same ID: stdin (0), stdout (1) and,
// without PTY, stderr (2).
type ExecRequest struct {
	ID   string   `json:"id"`
	Argv []string `json:"argv"`
	// Env are the variables the caller asks for. With DefaultEnv they are
	// the user's own and override any default by name.
	Env []string `json:"env,omitempty"`
	// DefaultEnv is the caller's idea of a base environment (PATH, HOME,
	// LANG). Without an image config it comes first, then Env, as if both
	// were sent in Env; an image config's env takes its place (needs
	// CapExecImageConfig).
	DefaultEnv []string `json:"default_env,omitempty"`
	// Dir is the working directory; "" is the image config's working
	// directory under Root, else the top of Root.
	Dir string `json:"dir,omitempty"`
	// Root, if set, is a directory of the guest the process is chrooted to
	// before Dir and Argv[0] are resolved (needs CapExecRoot).
	Root string `json:"root,omitempty"`
	// User, with Root, is the account the process runs as (a name or
	// uid of the root's /etc/passwd, as an image config's User), in its
	// home unless Dir says otherwise, with its HOME, USER and LOGNAME;
	// "" is the image config's user, else root (needs CapExecUser).
	User  string   `json:"user,omitempty"`
	PTY   *WinSize `json:"pty,omitempty"`
	Stdin bool     `json:"stdin,omitempty"` // false: the process gets /dev/null
	// Keep makes the process outlive its exec stream and the session:
	// when the stream ends, the agent keeps the process running and
	// reads its output on, dropping it, until a CallExecConnect attaches
	// new streams. A kept process's stdin is closed by
	// ExecControl.CloseStdin only: the end of a stdin stream detaches it
	// (needs CapExecKeep).
	Keep bool `json:"keep,omitempty"`
	// Meta is the caller's own note of a kept exec, answered by
	// CallExecList: a JSON value of at most MaxExecMeta bytes.
	Meta json.RawMessage `json:"meta,omitempty"`
}

// ExecConnect attaches to the kept exec PID: stdio streams with ID as an
// exec's (stdin only with Stdin; stderr unless PTY). Several
// may be attached at once: each gets the output from then on, and the
// exit.
type ExecConnect struct {
	ID    string `json:"id"`
	PID   int    `json:"pid"`
	Stdin bool   `json:"stdin,omitempty"`
	// PTY says the caller attaches no stderr: the exec has a terminal
	// (KeptExec.PTY).
	PTY bool `json:"pty,omitempty"`
	// ControlOnly: the caller attaches no stdio streams and gets no
	// output; it sends control frames, then ends its side of the stream,
	// and the agent ends its own once it took them all.
	ControlOnly bool `json:"control_only,omitempty"`
}

// ExecList is the answer of CallExecList, by pid.
type ExecList struct {
	Processes []KeptExec `json:"processes"`
}

// KeptExec is one kept exec that runs.
type KeptExec struct {
	PID  int             `json:"pid"`
	PTY  bool            `json:"pty,omitempty"`
	Meta json.RawMessage `json:"meta,omitempty"`
}

// ExecAttach is the request of a stdio stream.
type ExecAttach struct {
	ID string `json:"id"`
	FD int    `json:"fd"`
}

// ExecStarted is the result of CallExec.
type ExecStarted struct {
	PID int `json:"pid"`
}

// ExecControl is sent by the node on the exec stream after the start.
type ExecControl struct {
	Signal int      `json:"signal,omitempty"`
	Resize *WinSize `json:"resize,omitempty"`
	// Input is written to a kept exec's stdin or terminal, in order with
	// the other frames (CapExecKeep).
	Input []byte `json:"input,omitempty"`
	// CloseStdin closes a kept exec's stdin (CapExecKeep).
	CloseStdin bool `json:"close_stdin,omitempty"`
}

// ExecExit is the last frame of the exec stream.
type ExecExit struct {
	ExitCode int    `json:"exit_code"`        // -1 when killed by a signal
	Signal   int    `json:"signal,omitempty"` // the signal that ended it
	Error    string `json:"error,omitempty"`
}

// FileWriteRequest is followed by the data as chunks; the file is replaced
// atomically once the end chunk arrived.
type FileWriteRequest struct {
	Path string      `json:"path"`
	Mode fs.FileMode `json:"mode"`
	// Root (CapFilesAs): Path is resolved inside Root, as a process
	// chrooted there would (its symbolic links stay in it), a relative
	// one from the user's home, and the file and the directories made for
	// it are written as User of Root's /etc/passwd ("": the image
	// config's user, else root), with that user's permissions and as its
	// own.
	Root string `json:"root,omitempty"`
	User string `json:"user,omitempty"`
	// MakeDirs makes Path's missing directories first (with User).
	MakeDirs bool `json:"make_dirs,omitempty"`
}

// FileReadRequest is answered by a Response with FileInfo, the data as
// chunks, and a trailing Response reporting errors during the transfer.
type FileReadRequest struct {
	Path string `json:"path"`
	// Root and User (CapFilesAs): as FileWriteRequest's, the file is
	// opened inside Root as User would open it.
	Root string `json:"root,omitempty"`
	User string `json:"user,omitempty"`
}

// StatRequest asks for one path's metadata (lstat).
type StatRequest struct {
	Path string `json:"path"`
}

// FileInfo is a path's metadata.
type FileInfo struct {
	Path    string      `json:"path"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mod_time"`
	UID     int         `json:"uid"`
	GID     int         `json:"gid"`
}

// FreezeRequest names a mount point to freeze or thaw.
type FreezeRequest struct {
	Path string `json:"path"`
}

// PortForwardRequest names the TCP endpoint CallPortForward connects to,
// as seen from inside the guest.
type PortForwardRequest struct {
	Port int    `json:"port"`
	Host string `json:"host,omitempty"` // default 127.0.0.1 (the guest's loopback)
}

// GrowFSRequest names the mount point of an ext4 filesystem to grow.
// MinBytes, if set, is the size the node gave its device: the guest
// kernel learns a new capacity asynchronously (a virtio config-change
// interrupt after QMP block_resize), so the agent waits for the device to
// reach it before growing.
type GrowFSRequest struct {
	Path     string `json:"path"`
	MinBytes uint64 `json:"min_bytes,omitempty"`
}

// GrowFSResult is the device's size and the filesystem's (block count
// times block size) after the grow; an ext4 filesystem ends at a whole
// block, so it may be a little smaller than its device.
type GrowFSResult struct {
	DeviceBytes     uint64 `json:"device_bytes"`
	FilesystemBytes uint64 `json:"filesystem_bytes"`
}

// StopRequest stops the guest: managed processes get SIGTERM, then SIGKILL
// after Grace, filesystems are synced, then the guest powers off.
type StopRequest struct {
	Grace time.Duration `json:"grace"`
}

// StopResult reports what Stop did before the poweroff.
type StopResult struct {
	Terminated int `json:"terminated"` // ended after SIGTERM
	Killed     int `json:"killed"`     // needed SIGKILL
	// Frozen are the retained filesystems synced and frozen (CapStopPrepare).
	Frozen []string `json:"frozen,omitempty"`
}
