package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/recordfmt"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/template"
)

// check-upgrade (process-model seed, "Check with the target program
// before replacing"): run with the target build, may it take this node
// over? On top of check-maintenance --operation upgrade it judges what
// only the target knows: whether it reads every local record, has its
// runtime (its own Platform and the VMM executables), can keep driving
// each running Instance's installation, and speaks each running guest's
// protocol. With Preview it runs beside a live node: no lock, only the
// items that do not depend on quiescence, and what it cannot tell yet is
// pending. It never writes, migrates, creates or bumps anything.

// Upgrade verdicts.
const (
	VerdictOK      = "ok"
	VerdictBlocked = "blocked"
	VerdictPending = "pending"
)

// UpgradeItem is one judged object.
type UpgradeItem struct {
	Verdict string `json:"verdict"`
	Object  string `json:"object"`
	Detail  string `json:"detail"`
}

// UpgradeReport is check-upgrade's conclusion: OK unless an item is
// blocked (pending ones do not count).
type UpgradeReport struct {
	Preview bool          `json:"preview"`
	OK      bool          `json:"ok"`
	Items   []UpgradeItem `json:"items"`
}

// NotJudgedByPreview is what a preview leaves to the check after the
// services stopped; its report ends with it.
const NotJudgedByPreview = "not judged by --preview: quiescence and ownership (helper processes, ownerless leftovers, network namespaces, mounts, staging directories, the use of Volumes and writable layers); stop the node and run the same command without --preview before replacing the program"

// UpgradeTarget is the build being checked for.
type UpgradeTarget struct {
	// Release of the target build ("" unreleased).
	Release string
	// RuntimeDir is the target's own Platform: a Platform directory under
	// the storage root's installations whose guest agent is the target
	// executable (AgentSHA256).
	RuntimeDir  string
	AgentSHA256 string
	// Executables the target runs VMs with, found on PATH.
	Executables []string
	// MinProtocol..MaxProtocol is the guest protocol range the target
	// accepts; Capabilities every capability it may use.
	MinProtocol, MaxProtocol int
	Capabilities             []string
	// GuestTimeout bounds each guest's GuestInfo; default 20s.
	GuestTimeout time.Duration
	Preview      bool
}

// DefaultExecutables are what a node runs VMs with: the VMM, the layer
// tool and the Volume formatter.
var DefaultExecutables = []string{"qemu-system-x86_64", "qemu-img", "mkfs.ext4"}

// CheckUpgrade checks this node's runtime for the target. cfg is as for
// CheckMaintenance.
func CheckUpgrade(ctx context.Context, cfg Config, t UpgradeTarget) (*UpgradeReport, error) {
	if t.GuestTimeout == 0 {
		t.GuestTimeout = 20 * time.Second
	}
	rep := &UpgradeReport{Preview: t.Preview, Items: []UpgradeItem{}}
	rt := &Runtime{cfg: cfg, units: cfg.Units, instancesDir: filepath.Join(cfg.StorageRoot, "runtime", "instances"),
		registryDir: filepath.Join(cfg.StorageRoot, "runtime", "registry")}
	own := rep.runtimeDir(cfg, t)
	rep.recordFormats(cfg, rt.registryDir)
	if t.Preview {
		rep.previewInstances(rt, t, own)
	} else {
		unlock, err := lockForCheck(cfg)
		if err != nil {
			return nil, err
		}
		defer unlock()
		m, err := checkMaintenanceLocked(ctx, rt, cfg, OpUpgrade)
		if err != nil {
			return nil, err
		}
		for _, it := range m.Items {
			if strings.HasPrefix(it.Object, "instance ") && !it.Blocking {
				continue // judged below, with what the target adds
			}
			v := VerdictOK
			if it.Blocking {
				v = VerdictBlocked
			}
			rep.add(v, it.Object, it.State+": "+it.Detail)
		}
		if err := rep.liveInstances(ctx, rt, t, own); err != nil {
			return nil, err
		}
	}
	rep.OK = true
	for _, it := range rep.Items {
		rep.OK = rep.OK && it.Verdict != VerdictBlocked
	}
	return rep, nil
}

func (r *UpgradeReport) add(verdict, object, detail string) {
	r.Items = append(r.Items, UpgradeItem{Verdict: verdict, Object: object, Detail: detail})
}

// runtimeDir judges the target's runtime: its own Platform (whole, its
// agent the target executable, where the node looks for Platforms) and
// the VMM executables. It returns the Platform's id, "" when unusable.
func (r *UpgradeReport) runtimeDir(cfg Config, t UpgradeTarget) string {
	for _, name := range t.Executables {
		if path, err := exec.LookPath(name); err != nil {
			r.add(VerdictBlocked, "executable "+name, "not found on PATH: the target runs VMs with it; install it (Debian: qemu-system-x86 for qemu-system-x86_64, qemu-utils for qemu-img, e2fsprogs for mkfs.ext4)")
		} else {
			r.add(VerdictOK, "executable "+name, path)
		}
	}
	obj := "runtime directory " + t.RuntimeDir
	in, err := platform.Load(t.RuntimeDir)
	if err != nil {
		r.add(VerdictBlocked, obj, err.Error()+": build the target's Platform with the target binary (kibotos platform build) and name its directory")
		return ""
	}
	if err := in.Verify(); err != nil {
		r.add(VerdictBlocked, obj, err.Error()+": build it again with the target binary")
		return ""
	}
	if in.AgentSHA256 != t.AgentSHA256 {
		r.add(VerdictBlocked, obj, fmt.Sprintf("platform %s carries guest agent sha256 %.12s, not the target executable's %.12s: build it with the target binary (kibotos platform build)", in.ID, in.AgentSHA256, t.AgentSHA256))
		return ""
	}
	want := filepath.Join(platform.InstallationsDir(cfg.StorageRoot), in.ID)
	if abs, _ := filepath.Abs(t.RuntimeDir); filepath.Clean(abs) != want {
		r.add(VerdictBlocked, obj, fmt.Sprintf("platform %s is not in %s, where the node starts Instances from: build it there with the target binary (kibotos platform build --storage-root %s)", in.ID, want, cfg.StorageRoot))
		return ""
	}
	r.add(VerdictOK, obj, fmt.Sprintf("platform %s (kernel %s, guest agent %s) is the target's own", in.ID, in.KernelVersion, releaseOrUnknown(in.AgentRelease)))
	return in.ID
}

func releaseOrUnknown(r string) string {
	if r == "" {
		return "of an unknown release"
	}
	return r
}

// recordFormats reads every local record the runtime keeps, refusing
// one the target does not read: ended-Instance records, holder records
// and snapshots in the pools, the installations' and templates'
// manifests. (Launch records are read with the Instances.)
func (r *UpgradeReport) recordFormats(cfg Config, registryDir string) {
	seen, bad := 0, 0
	fail := func(object string, err error) {
		bad++
		if errors.Is(err, recordfmt.ErrOutOfRange) {
			r.add(VerdictBlocked, object, err.Error())
			return
		}
		r.add(VerdictBlocked, object, "unreadable: "+err.Error())
	}
	ents, _ := os.ReadDir(registryDir)
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".json") || strings.HasPrefix(n, ".") || n == VolumeCommandsFile {
			continue
		}
		seen++
		if _, err := ReadEndedRecord(filepath.Join(registryDir, n)); err != nil {
			fail("ended record "+n, err)
		}
	}
	for _, p := range cfg.Pools {
		holders, _ := filepath.Glob(filepath.Join(p.Path, "*", "*"+storagepool.HolderSuffix))
		more, _ := filepath.Glob(filepath.Join(p.Path, "volumes", "data", "*"+storagepool.HolderSuffix))
		for _, h := range append(holders, more...) {
			seen++
			if _, err := storagepool.ReadHolder(strings.TrimSuffix(h, storagepool.HolderSuffix)); err != nil {
				fail("holder record "+h, err)
			}
		}
		snaps, _ := filepath.Glob(filepath.Join(p.Path, "snapshots", "*", SnapshotMetaFile))
		for _, s := range snaps {
			seen++
			if err := checkSnapshotFormat(s); err != nil {
				fail("snapshot "+filepath.Dir(s), fmt.Errorf("%w: resume its Workspace before the upgrade, or it starts afresh after it", err))
			}
		}
	}
	insts, _ := os.ReadDir(platform.InstallationsDir(cfg.StorageRoot))
	for _, e := range insts {
		if e.IsDir() && strings.HasPrefix(e.Name(), "sha256-") {
			seen++
			if _, err := platform.Load(filepath.Join(platform.InstallationsDir(cfg.StorageRoot), e.Name())); err != nil {
				fail("installation "+e.Name(), err)
			}
		}
	}
	tpls, _ := os.ReadDir(template.Dir(cfg.StorageRoot))
	for _, e := range tpls {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			seen++
			if _, err := template.Load(filepath.Join(template.Dir(cfg.StorageRoot), e.Name())); err != nil {
				fail("template "+e.Name(), err)
			}
		}
	}
	r.add(VerdictOK, "records", fmt.Sprintf("%d ended-Instance, holder, snapshot, installation and template records read in formats this build reads", seen-bad))
}

// checkSnapshotFormat checks only the format of a snapshot.json (the
// state file is checked whole at the restore).
func checkSnapshotFormat(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxSnapshotMeta+1))
	if err != nil {
		return err
	}
	if len(raw) > maxSnapshotMeta {
		return fmt.Errorf("%s is over %d bytes", path, maxSnapshotMeta)
	}
	return snapshotFormats.CheckJSON(path, raw, 0)
}

// previewInstances judges the Instances of a live node from their launch
// records: the installation each runs on and the guest its node claimed
// (GuestInfo of the handshake, recorded). A record mid-launch or a guest
// that has not answered yet is pending.
func (r *UpgradeReport) previewInstances(rt *Runtime, t UpgradeTarget, own string) {
	ents, err := os.ReadDir(rt.instancesDir)
	if err != nil {
		return // no Instance ever ran here
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		obj := "instance " + e.Name()
		rec, err := ReadLaunchRecord(filepath.Join(rt.instancesDir, e.Name(), LaunchRecordFile))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			r.add(VerdictPending, obj, "no launch record yet: a start is being prepared")
			continue
		case errors.Is(err, recordfmt.ErrOutOfRange):
			r.add(VerdictBlocked, obj, err.Error())
			continue
		case err != nil:
			r.add(VerdictBlocked, obj, "launch record unreadable: "+err.Error())
			continue
		case rec.Stopped != nil:
			continue // ended: the target keeps its record
		case rec.Process == nil:
			r.add(VerdictPending, obj, "starting: its VMM is not recorded as running yet")
			continue
		case rec.Guest == nil:
			r.add(VerdictPending, obj, "starting: its guest has not answered yet")
			continue
		}
		r.instance(rec, t, own, rec.Guest.Protocol, rec.Guest.Capabilities)
	}
}

// liveInstances judges the running Instances of a stopped node: each one's
// installation, and its guest asked for GuestInfo through its own VMM.
func (r *UpgradeReport) liveInstances(ctx context.Context, rt *Runtime, t UpgradeTarget, own string) error {
	if _, err := os.Stat(rt.instancesDir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	verdicts, _, _, err := rt.inspect(ctx)
	if err != nil {
		return err
	}
	sort.Slice(verdicts, func(i, j int) bool { return verdicts[i].rec.InstanceID < verdicts[j].rec.InstanceID })
	for _, v := range verdicts {
		if v.state != StateRunning {
			continue // starting ones are blocked by the maintenance items
		}
		obj := "instance " + v.rec.InstanceID
		info, err := askGuest(ctx, filepath.Join(rt.instancesDir, v.rec.dirName()), v.rec, t)
		var verr *guestproto.VersionError
		switch {
		case errors.As(err, &verr):
			r.add(VerdictBlocked, obj, fmt.Sprintf("guest protocol out of range: %v: stop its Workspace normally before the upgrade", verr))
			continue
		case err != nil:
			r.add(VerdictBlocked, obj, fmt.Sprintf("guest does not answer GuestInfo through its VMM: %v: stop its Workspace normally before the upgrade", err))
			continue
		}
		r.instance(v.rec, t, own, info.Protocol, info.Capabilities)
	}
	return nil
}

// askGuest performs a guest agent handshake through the Instance's own
// VMM, offering the target's protocol range, and closes it: the agent
// goes back to waiting for its node, nothing of the guest changes. Like
// the node's reconnects it tries again on a new connection with a fresh
// hello, each attempt longer than the last (the first hello after a
// node's session ended can be lost in the guest, and a loaded host slows
// the answer), within t.GuestTimeout.
func askGuest(ctx context.Context, dir string, rec *LaunchRecord, t UpgradeTarget) (guestproto.GuestInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, t.GuestTimeout)
	defer cancel()
	attempt := guestAttemptTimeout
	for {
		info, err := askGuestOnce(ctx, attempt, pathsOf(dir, rec).AgentSocket, t)
		var verr *guestproto.VersionError
		if err == nil || errors.As(err, &verr) || ctx.Err() != nil {
			return info, err
		}
		attempt = min(attempt*2, guestAttemptMax)
	}
}

func askGuestOnce(ctx context.Context, attempt time.Duration, socket string, t UpgradeTarget) (guestproto.GuestInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, attempt)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return guestproto.GuestInfo{}, err
	}
	c, err := guestproto.DialWith(ctx, conn, guestproto.DialOptions{MinProtocol: t.MinProtocol, MaxProtocol: t.MaxProtocol})
	if err != nil {
		return guestproto.GuestInfo{}, err
	}
	c.Close()
	return c.Info(), nil
}

// instance judges one running Instance for the target: its installation
// (blocking when the target cannot keep it), the guest's protocol
// (blocking out of range) and missing capabilities (listed only).
func (r *UpgradeReport) instance(rec *LaunchRecord, t UpgradeTarget, own string, protocol int, caps []string) {
	obj := "instance " + rec.InstanceID
	blocked := false
	if rec.InstallationDir != "" {
		if why := InstallationProblem(rec.InstallationDir, own, t.Release); why != "" {
			blocked = true
			r.add(VerdictBlocked, obj, fmt.Sprintf("runtime installation %s cannot be kept: %s: stop its Workspace normally before the upgrade; it starts on %s next", rec.InstallationID, why, ownOrNone(own)))
		}
	}
	if protocol < t.MinProtocol || protocol > t.MaxProtocol {
		blocked = true
		r.add(VerdictBlocked, obj, fmt.Sprintf("guest protocol %d is outside what the target accepts [%d %d]: stop its Workspace normally before the upgrade", protocol, t.MinProtocol, t.MaxProtocol))
	}
	if blocked {
		return
	}
	var missing []string
	for _, c := range t.Capabilities {
		if !slices.Contains(caps, c) {
			missing = append(missing, c)
		}
	}
	detail := fmt.Sprintf("taken over: guest protocol %d", protocol)
	if len(missing) > 0 {
		detail += fmt.Sprintf("; its guest lacks capabilities %s: calls using them fail until it restarts", strings.Join(missing, ", "))
	}
	if rec.InstallationID != own {
		detail += fmt.Sprintf("; keeps runtime installation %s until its next start, then %s", rec.InstallationID, ownOrNone(own))
	}
	r.add(VerdictOK, obj, detail)
}

func ownOrNone(own string) string {
	if own == "" {
		return "the target's own Platform (none usable yet)"
	}
	return own
}
