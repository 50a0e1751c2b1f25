package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/internal/recordfmt"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// Snapshots: pause and resume. Pause stops the guest's vCPUs, has QEMU
// write the VM's whole state (memory and devices) into a file the node
// opened in the snapshot directory, makes it durable and checksummed, and
// ends the VMM; the disks (layer, Volumes) are flushed by QEMU as the
// stream completes. A restore starts the same VMM command line with
// -incoming defer, checks the snapshot against what this node would run
// (the compatibility tuple) before QEMU starts, loads it while it checks
// the state file against its checksum, and starts the vCPUs once that
// matched. A snapshot
// directory holds:
//
//	state          the migration stream (written under a temporary name
//	               of the node's, renamed once complete and fsynced)
//	snapshot.json  written last: a snapshot without it is not one
//
// Nothing but the files of one complete save is ever restored.

// Snapshot file names.
const (
	SnapshotStateFile = "state"
	SnapshotMetaFile  = "snapshot.json"
)

// snapshotFormat is the format version of snapshot.json this build
// writes; snapshotFormats, those it reads. Format 1 recorded the state's
// sha256; format 2 records its xxh3-128 (stateHash). Format 3 was a warm
// guest's, saved without its RAM (kept in a memory file): this build
// keeps warm guests running instead, and reads it no more.
const snapshotFormat = 2

var snapshotFormats = recordfmt.Range{Min: 1, Max: snapshotFormat}

// maxSnapshotMeta bounds what is read of snapshot.json (from a pool):
// room for a Workspace's environment in Configured
// (api.MaxWorkspaceEnvBytes, up to six times that escaped in JSON)
// beside the rest.
const maxSnapshotMeta = 1 << 20

// SnapshotMeta is snapshot.json.
type SnapshotMeta struct {
	FormatVersion int                `json:"format_version"`
	InstanceID    string             `json:"instance_id"`
	NodeID        string             `json:"node_id"`
	Compat        api.SnapshotCompat `json:"compat"`
	StateBytes    uint64             `json:"state_bytes"`
	StateSHA256   string             `json:"state_sha256,omitempty"` // format 1
	StateXXH3     string             `json:"state_xxh3,omitempty"`   // format 2
	TakenAt       time.Time          `json:"taken_at"`
	// Network is the guest's network when it was saved; absent for a
	// guest without one or saved by a build before it was recorded.
	Network *SnapshotNetwork `json:"network,omitempty"`
	// Configured is the saved guest's launch-time configuration beyond
	// its network (LaunchRecord.Configured), which a restart of a guest
	// restored from it is told again; absent from a build before it was
	// recorded.
	Configured *guestproto.ConfigureRequest `json:"configured,omitempty"`
}

// SnapshotNetwork is a saved guest's network: a restore that gets the
// same addresses on a tap of the same hardware address finds the guest
// configured already, and leaves its addresses and configuration as they
// were instead of flushing them for new ones.
type SnapshotNetwork struct {
	Guest  netip.Addr `json:"guest_ipv4"`
	Guest6 netip.Addr `json:"guest_ipv6,omitzero"`
	TapMAC string     `json:"tap_mac"`
	// Configured is what the guest was told.
	Configured guestproto.ConfigureRequest `json:"configured"`
}

// snapshotNetwork is the SnapshotNetwork of a launch, nil when its tap's
// hardware address was not fixed.
func snapshotNetwork(nr *NetworkRecord) *SnapshotNetwork {
	if nr == nil || nr.TapMAC == "" {
		return nil
	}
	return &SnapshotNetwork{Guest: nr.Guest, Guest6: nr.Guest6, TapMAC: nr.TapMAC, Configured: guestNetwork(nr)}
}

// keeps says whether a guest saved with network s, restored onto nr, is
// configured already.
func (s *SnapshotNetwork) keeps(nr *NetworkRecord) bool {
	return s != nil && nr != nil && s.TapMAC != "" && s.TapMAC == nr.TapMAC && s.Guest == nr.Guest && s.Guest6 == nr.Guest6 &&
		reflect.DeepEqual(s.Configured, guestNetwork(nr))
}

// ErrSnapshotUnusable marks a restore that failed because of the snapshot
// itself (missing, torn, of another VMM): it can never be restored.
var ErrSnapshotUnusable = errors.New("snapshot cannot be restored")

// ErrVMMGone marks a pause during which the VMM ended.
var ErrVMMGone = errors.New("the VMM ended")

// RestoreSpec asks Start to restore a snapshot instead of booting.
type RestoreSpec struct {
	Dir string // the snapshot directory
}

// Pause saves Instance id into the snapshot directory dir and ends its
// VMM: the Instance is then STOPPED (how "paused") for the caller to
// Delete. A save that fails leaves the guest running (its vCPUs started
// again) and no file of it behind; one during which the VMM ended is
// ErrVMMGone.
func (rt *Runtime) Pause(ctx context.Context, id, dir string) (SnapshotMeta, error) {
	in, err := rt.get(id)
	if err != nil {
		return SnapshotMeta{}, err
	}
	in.mu.Lock()
	state, rec, control := in.state, in.rec, in.paths.Control
	in.mu.Unlock()
	fail := func(err error) (SnapshotMeta, error) {
		return SnapshotMeta{}, fmt.Errorf("runtime: pause instance %s: %w", id, err)
	}
	switch {
	case state != StateRunning:
		return fail(fmt.Errorf("it is %s; only a running Instance is paused", state))
	case rec.Backend != (&QEMU{}).Name():
		return fail(fmt.Errorf("backend %s cannot save a VM", rec.Backend))
	}
	t0 := time.Now()
	meta, err := rt.save(ctx, in, rec, control, dir)
	if err != nil {
		// A VMM killed mid-save may take a moment to be reaped.
		if rt.waitProcessGone(ctx, rec.Process, time.Second) {
			err = fmt.Errorf("%w: %w", ErrVMMGone, err)
		}
		return fail(err)
	}
	tSaved := time.Since(t0)
	// Saved: the VMM ends as a stop would end it, without asking the guest.
	in.mu.Lock()
	in.state = StateStopping
	in.notify()
	in.mu.Unlock()
	if err := rt.ensureEnded(ctx, in); err != nil {
		// The snapshot is whole; Delete ends what is left.
		rt.log.Warn("paused instance's VMM not ended yet", "instance_id", id, "err", err)
	}
	now := time.Now().UTC()
	stopped := *rec
	stopped.Stopped = &now
	if err := WriteLaunchRecord(in.paths.Dir, &stopped); err != nil {
		rt.log.Warn("paused instance's record not updated", "instance_id", id, "err", err)
	}
	in.mu.Lock()
	in.rec, in.state, in.err, in.how = &stopped, StateStopped, "", "paused"
	in.notify()
	in.mu.Unlock()
	rt.log.Info("instance paused", "instance_id", id, "dir", dir, "state_bytes", meta.StateBytes, "saved_in", tSaved.Round(time.Millisecond), "took", time.Since(t0).Round(time.Millisecond))
	return meta, nil
}

// save writes the snapshot of a running Instance; on failure the guest
// runs on and nothing of the snapshot is left.
func (rt *Runtime) save(ctx context.Context, in *instance, rec *LaunchRecord, control, dir string) (SnapshotMeta, error) {
	q, err := qemu.DialQMP(ctx, control)
	if err != nil {
		return SnapshotMeta{}, err
	}
	defer q.Close()
	version, err := q.Version(ctx)
	if err != nil {
		return SnapshotMeta{}, err
	}
	meta := SnapshotMeta{FormatVersion: snapshotFormat, InstanceID: in.id, NodeID: rt.cfg.NodeID, Compat: rt.compatOf(rec, version), TakenAt: time.Now().UTC(),
		Network: snapshotNetwork(rec.Network), Configured: rec.Configured}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return SnapshotMeta{}, err
	}
	tmp, err := storagepool.TempPath(dir, storagepool.Temp{Node: rt.cfg.NodeID, Purpose: "pause-" + in.id})
	if err != nil {
		return SnapshotMeta{}, err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return SnapshotMeta{}, err
	}
	undo := func(err error) (SnapshotMeta, error) {
		f.Close()
		os.Remove(tmp)
		os.Remove(filepath.Join(dir, SnapshotStateFile))
		// Under load QEMU may take seconds to end its migration.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		t0 := time.Now()
		if cerr := q.Abandon(cctx); cerr != nil {
			rt.log.Error("pause not undone: the guest may stay stopped", "instance_id", in.id, "err", cerr, "took", time.Since(t0).Round(time.Millisecond))
			err = errors.Join(err, fmt.Errorf("start the guest's vCPUs again: %w", cerr))
		} else {
			rt.log.Info("pause undone: the guest runs on", "instance_id", in.id, "why", err, "took", time.Since(t0).Round(time.Millisecond))
		}
		return SnapshotMeta{}, err
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if h := rt.cfg.beforeSave; h != nil {
		h(rec.Process.HostPID)
	}
	digest, err := followDigest(sctx, tmp)
	if err != nil {
		return undo(err)
	}
	defer digest.stop()
	if err := q.Save(sctx, f); err != nil {
		return undo(err)
	}
	if meta.StateBytes, meta.StateXXH3, err = digest.finish(); err != nil {
		return undo(err)
	}
	if err := f.Sync(); err != nil {
		return undo(err)
	}
	if st, err := f.Stat(); err != nil || uint64(st.Size()) != meta.StateBytes {
		return undo(fmt.Errorf("the state file changed while it was hashed (%d bytes hashed): %v", meta.StateBytes, err))
	}
	if err := f.Close(); err != nil {
		return undo(err)
	}
	if err := storagepool.Commit(tmp, filepath.Join(dir, SnapshotStateFile)); err != nil {
		return undo(err)
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err == nil {
		err = storagepool.WriteFile(filepath.Join(dir, SnapshotMetaFile), append(b, '\n'), 0o600, storagepool.Temp{Node: rt.cfg.NodeID, Purpose: "snapshot"})
	}
	if err != nil {
		return undo(err)
	}
	return meta, nil
}

// readSnapshotMeta reads and checks snapshot.json in dir: a format this
// build reads, with its checksum, and a valid compatibility tuple.
// Anything else is ErrSnapshotUnusable, but a newer build's format: that
// snapshot is whole for the build that wrote it. The state file is
// checked against it by checkState.
func readSnapshotMeta(dir string) (SnapshotMeta, error) {
	unusable := func(format string, args ...any) (SnapshotMeta, error) {
		return SnapshotMeta{}, fmt.Errorf("%w: %s: %s", ErrSnapshotUnusable, dir, fmt.Sprintf(format, args...))
	}
	f, err := os.Open(filepath.Join(dir, SnapshotMetaFile))
	if err != nil {
		return unusable("%v", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSnapshotMeta+1))
	f.Close()
	if err != nil || len(b) > maxSnapshotMeta {
		return unusable("%s unreadable or over %d bytes", SnapshotMetaFile, maxSnapshotMeta)
	}
	var m SnapshotMeta
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&m); err != nil {
		return unusable("%s: %v", SnapshotMetaFile, err)
	}
	if err := snapshotFormats.Check(filepath.Join(dir, SnapshotMetaFile), m.FormatVersion); err != nil {
		if m.FormatVersion > snapshotFormats.Max {
			// A newer build's snapshot is whole for that build: kept.
			return SnapshotMeta{}, fmt.Errorf("snapshot %s: %w", dir, err)
		}
		return unusable("%v", err)
	}
	if _, err := m.stateSum(); err != nil {
		return unusable("%s: %v", SnapshotMetaFile, err)
	}
	if err := m.Compat.Check(); err != nil {
		return unusable("%v", err)
	}
	if err := checkConfigured(m.Configured); err != nil {
		return unusable("%s: %v", SnapshotMetaFile, err)
	}
	return m, nil
}

// compatOf is the compatibility tuple of a launch under QEMU version.
func (rt *Runtime) compatOf(rec *LaunchRecord, version string) api.SnapshotCompat {
	r := rt.resume(version)
	return api.SnapshotCompat{InstallationID: rec.InstallationID, QEMUVersion: r.QEMUVersion, Accel: r.Accel, CPUModel: r.CPUModel, CPUFlags: r.CPUFlags,
		MemoryMiB: rec.MemoryMiB, VCPUs: rec.VCPUs, Devices: deviceLayout(rec)}
}

// deviceLayout names a launch's devices in the order of its command line:
// a restored VM must have the same.
func deviceLayout(rec *LaunchRecord) []string {
	var d []string
	if rec.LayerPath != "" {
		d = append(d, "disk:"+LayerSerial)
	}
	if rec.DiskMiB > 0 {
		d = append(d, "disk:scratch")
	}
	for _, v := range rec.Volumes {
		d = append(d, "disk:"+v.Serial)
	}
	if rec.Network != nil {
		d = append(d, "net")
	}
	d = append(d, "chan:"+AgentPortName)
	if slices.ContainsFunc(rec.VMMArgv, func(a string) bool { return strings.Contains(a, "name="+guestproto.DataPortName) }) {
		d = append(d, "chan:"+guestproto.DataPortName)
	}
	return d
}

// ResumeInfo is what this node's VMM can restore.
func (rt *Runtime) ResumeInfo() api.ResumeInfo { return rt.resume(rt.version()) }

// version is the QEMU binary's version, once Open's question answered.
func (rt *Runtime) version() string {
	<-rt.qemuVersionDone
	return rt.qemuVersion
}

func (rt *Runtime) resume(version string) api.ResumeInfo {
	r := api.ResumeInfo{QEMUVersion: version}
	if q, ok := rt.backend.(*QEMU); ok {
		r.Accel = string(q.Accel)
		r.CPUModel = "max"
		if q.Accel == qemu.AccelKVM {
			// The host's CPU is the guest's: its flags must match.
			r.CPUModel, r.CPUFlags = "host", cpuFlagsDigest()
		}
	}
	return r
}

// cpuFlagsDigest is a digest of the first CPU's flags in /proc/cpuinfo.
func cpuFlagsDigest() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "flags" {
			sum := sha256.Sum256([]byte(strings.Join(strings.Fields(v), " ")))
			return hex.EncodeToString(sum[:8])
		}
	}
	return "unknown"
}

var qemuVersionRE = regexp.MustCompile(`version ([0-9]+\.[0-9]+\.[0-9]+)`)

// binaryVersion is what `qemu --version` says, "MAJOR.MINOR.MICRO".
func binaryVersion(binary string) (string, error) {
	out, err := exec.Command(binary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", binary, err)
	}
	m := qemuVersionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s --version: no version in %q", binary, out)
	}
	return string(m[1]), nil
}

// checkRestore is the check of a launch that restores: the snapshot's
// record m (readSnapshotMeta) says this launch is what it needs. Its
// state file is checked apart (checkState).
func (rt *Runtime) checkRestore(rec *LaunchRecord, m SnapshotMeta) error {
	var err error
	want := rt.compatOf(rec, rt.version())
	got := m.Compat
	why := got.Incompatible(&api.ResumeInfo{QEMUVersion: want.QEMUVersion, Accel: want.Accel, CPUModel: want.CPUModel, CPUFlags: want.CPUFlags, Installations: []string{want.InstallationID}})
	switch {
	case got.InstallationID != want.InstallationID:
		err = fmt.Errorf("%w: it ran installation %s, this launch %s", ErrSnapshotUnusable, got.InstallationID, want.InstallationID)
	case why != "":
		err = fmt.Errorf("%w: this node cannot restore it: %s", ErrSnapshotUnusable, why)
	case got.MemoryMiB != want.MemoryMiB || got.VCPUs != want.VCPUs:
		err = fmt.Errorf("%w: it has %d MiB and %d vCPUs, this launch %d MiB and %d", ErrSnapshotUnusable, got.MemoryMiB, got.VCPUs, want.MemoryMiB, want.VCPUs)
	case !slices.Equal(got.Devices, want.Devices):
		err = fmt.Errorf("%w: its devices are %v, this launch's %v", ErrSnapshotUnusable, got.Devices, want.Devices)
	}
	return err
}

// restore loads the snapshot into the launched VMM (started with
// -incoming defer) and starts the guest's vCPUs once the state file
// passed its check, which runs meanwhile: QEMU may have parsed a torn
// stream (and failed, or loaded garbage into a VM that never runs), but
// no guest ever runs from one.
func (rt *Runtime) restore(ctx context.Context, control, dir string, stateOK *stateCheck) error {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var q *qemu.QMP
	for {
		var err error
		if q, err = qemu.DialQMP(rctx, control); err == nil {
			break
		}
		// The socket appears once QEMU is up.
		if ctxsleep.Sleep(rctx, 5*time.Millisecond) != nil {
			return fmt.Errorf("restore: %w", err)
		}
	}
	defer q.Close()
	f, err := os.Open(filepath.Join(dir, SnapshotStateFile))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrSnapshotUnusable, err)
	}
	defer f.Close()
	loadErr := q.Load(rctx, f)
	if err := stateOK.wait(); err != nil {
		return err
	}
	switch {
	case loadErr != nil && rctx.Err() != nil:
		// Cut short (the start was cancelled, or the load took over
		// the limit): nothing says the snapshot is bad; it is kept.
		return fmt.Errorf("load the snapshot: %w", loadErr)
	case loadErr != nil:
		return fmt.Errorf("%w: %v", ErrSnapshotUnusable, loadErr)
	}
	return q.Cont(rctx)
}
