package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// Warm guests: a guest of a template booted ahead of any Workspace and
// paused, so that a create restores it instead of booting one (a node's
// [templates.NAME] warm = N). A warm guest boots with egress none and a
// new layer over the template image, and mounts what every Workspace of
// the template mounts the same way (WarmSpec.Mounts: the template's
// filesystem with /proc, /sys, /dev and resolv.conf in it), so that a
// start sends it no configure: under TCG every call a restored guest
// serves first translates its code afresh. Mounting writes to the
// layer, and the guest's memory then holds that filesystem's state: the
// layer is kept with the snapshot, and a start restores over a copy of
// it (RestoreSpec.Layer). Nothing of any Workspace is in either.
//
// With Config.WarmMemoryDir (a tmpfs) a warm guest runs on a memory file
// there (Spec.MemoryFile), allocated whole as its VMM starts, and is saved
// without its RAM: the Instance restored from it maps that file as its
// own RAM instead of loading a copy from the state file into fresh pages,
// which on a host that hands freed memory back to its hypervisor was
// most of a warm create. A waiting warm guest then costs its memory, not
// only disk. A slot:
//
//	<dir>/<slot>/state, snapshot.json   the snapshot, as Pause writes it
//	<dir>/<slot>/layer.qcow2            the layer, as the guest left it
//	<dir>/<slot>/warm.json              written last: the slot is complete
//	<memory dir>/<template>/<slot>.ram  its RAM (with WarmMemoryDir)
//
// A slot is restored once: Take moves it to a name no other take lists,
// the start unlinks its memory file once the VMM has it, and whoever
// took it removes it after the start. Every restore of a warm guest is
// given a new identity (random state, hostname, machine id), as a fork
// is. The slot's files, its memory file too, are root's alone while it
// waits: the VMM account (every VMM's) has them only while a guest runs
// on them.

// WarmMetaFile completes a warm slot.
const WarmMetaFile = "warm.json"

// WarmLayerFile is a slot's layer.
const WarmLayerFile = "layer.qcow2"

// WarmMemorySuffix ends a slot's memory file.
const WarmMemorySuffix = ".ram"

// warmFormat is the format version of warm.json. Earlier formats are not
// read, nor this one by earlier builds, and each removes the other's
// slots: format 1 (a layer never mounted, not kept) would be restored
// over a new layer the guest's memory does not match, format 2 had no
// memory file, which an earlier build would not map.
const warmFormat = 3

// warmPrefix starts the Instance ids of warm guests (ctrl's start "inst-").
const warmPrefix = "warm-"

// takenPrefix marks a slot a start took.
const takenPrefix = ".taken-"

// IsWarm says whether an Instance is a warm guest being made, which no
// Workspace owns.
func IsWarm(id string) bool { return strings.HasPrefix(id, warmPrefix) }

// WarmKey is what a warm guest was made as; a start restores only a slot
// of exactly the key it would boot.
type WarmKey struct {
	Template string `json:"template"`
	// TemplateID is the build of the template image (a rebuilt template
	// has a new id, and its warm guests saw the old image's blocks).
	TemplateID     string `json:"template_id"`
	InstallationID string `json:"installation_id"`
	VCPUs          int    `json:"vcpus"`
	MemoryMiB      int    `json:"memory_mib"`
}

// WarmMeta is warm.json.
type WarmMeta struct {
	FormatVersion int `json:"format_version"`
	WarmKey
	BootedAt time.Time `json:"booted_at"`
	// MemoryInFile: the guest's RAM is its memory file, not in its state.
	MemoryInFile bool `json:"memory_in_file,omitempty"`
	// Mounts are what the warm guest mounted: a start leaves them out of
	// its configure.
	Mounts []guestproto.Mount `json:"mounts,omitempty"`
}

// WarmSpec is a warm guest to make.
type WarmSpec struct {
	WarmKey
	Image        string // the template image
	Installation *platform.Installation
	// Mounts, when set, says what the warm guest mounts once it answers:
	// only what every Workspace of the template mounts the same way.
	Mounts func(guestproto.GuestInfo) []guestproto.Mount
}

// WarmStore is where a template's warm guests are: their slots in Dir,
// their memory files in MemoryDir ("" when they keep their RAM in their
// state file).
type WarmStore struct {
	Dir       string
	MemoryDir string
}

// WarmStore is the store of the warm guests whose slots are in dir (one
// directory per template).
func (rt *Runtime) WarmStore(dir string) WarmStore {
	s := WarmStore{Dir: dir}
	if rt.cfg.WarmMemoryDir != "" {
		s.MemoryDir = filepath.Join(rt.cfg.WarmMemoryDir, filepath.Base(dir))
	}
	return s
}

// KeepsWarmMemory says whether warm guests keep their RAM in memory files
// while they wait (Config.WarmMemoryDir): host memory they hold.
func (rt *Runtime) KeepsWarmMemory() bool { return rt.cfg.WarmMemoryDir != "" }

// memoryFile is the memory file of the slot (taken or not) named slot.
func (s WarmStore) memoryFile(slot string) string {
	return filepath.Join(s.MemoryDir, strings.TrimPrefix(filepath.Base(slot), takenPrefix)+WarmMemorySuffix)
}

// BootWarm boots a warm guest of s, saves it into a new slot under dir and
// ends it; it returns the slot. Nothing of a failed one is left but its
// machine logs.
func (rt *Runtime) BootWarm(ctx context.Context, dir string, s WarmSpec) (string, error) {
	if s.Installation == nil || s.Installation.ID != s.InstallationID {
		return "", fmt.Errorf("runtime: warm guest of template %s: installation %s not given", s.Template, s.InstallationID)
	}
	store := rt.WarmStore(dir)
	var b [8]byte
	rand.Read(b[:])
	id := warmPrefix + hex.EncodeToString(b[:])
	slot := filepath.Join(dir, id)
	layer := slot + ".qcow2"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	spec := Spec{InstanceID: id, Installation: s.Installation, VCPUs: s.VCPUs, MemoryMiB: s.MemoryMiB, Background: true,
		Network: true, Policy: NetworkPolicy{Egress: api.EgressNone}, RootImage: s.Image, LayerPath: layer}
	var save qemu.SaveOptions
	var err error
	if store.MemoryDir != "" {
		spec.MemoryFile, save.MemoryInFile = store.memoryFile(slot), true
		err = makeMemoryFile(store.MemoryDir, spec.MemoryFile)
	}
	var mounts []guestproto.Mount
	if s.Mounts != nil {
		spec.Configure = func(g guestproto.GuestInfo) guestproto.ConfigureRequest {
			mounts = s.Mounts(g)
			return guestproto.ConfigureRequest{Mounts: mounts}
		}
	}
	started := false
	if err == nil {
		_, err = rt.Start(ctx, spec)
		started = true
	}
	if err == nil {
		_, err = rt.pause(ctx, id, slot, save)
	}
	if err == nil {
		// The layer as the saved guest left it, on disk before the slot
		// is complete.
		err = keepLayer(layer, filepath.Join(slot, WarmLayerFile))
	}
	if err == nil && spec.MemoryFile != "" {
		// Whole, and the very file (a VMM that saw another file system
		// at that path would have left it empty).
		if err = keepRootOnly(spec.MemoryFile); err == nil {
			err = checkMemoryFile(spec.MemoryFile, s.MemoryMiB)
		}
	}
	dctx := context.WithoutCancel(ctx)
	if err != nil && started {
		// A warm guest has nothing to flush: no graceful stop (a node
		// that stops mid-boot waits for this).
		if ferr := rt.ForceStop(dctx, id); ferr != nil && !errors.Is(ferr, ErrUnknownInstance) {
			rt.log.Warn("warm guest not force-stopped", "instance_id", id, "err", ferr)
		}
	}
	if started {
		if derr := rt.Delete(dctx, id); derr != nil && !errors.Is(derr, ErrUnknownInstance) {
			err = errors.Join(err, derr)
		}
		// No Workspace's: nobody asks for its record.
		err = errors.Join(err, rt.ForgetEnded([]string{id}))
	}
	os.Remove(layer)
	if err == nil {
		m := WarmMeta{FormatVersion: warmFormat, WarmKey: s.WarmKey, BootedAt: time.Now().UTC(), Mounts: mounts, MemoryInFile: save.MemoryInFile}
		var j []byte
		if j, err = json.MarshalIndent(m, "", "  "); err == nil {
			err = storagepool.WriteFile(filepath.Join(slot, WarmMetaFile), append(j, '\n'), 0o600, storagepool.Temp{Node: rt.cfg.NodeID, Purpose: "warm"})
		}
	}
	if err != nil {
		store.Remove(slot)
		return "", fmt.Errorf("runtime: warm guest of template %s: %w", s.Template, err)
	}
	os.RemoveAll(filepath.Join(rt.logsDir, id)) // a warm boot's logs would crowd out the Workspaces'
	return slot, nil
}

// makeMemoryFile makes a warm guest's memory file, empty and root's
// alone, in dir (made root's alone when missing): its VMM allocates it
// whole as it starts (qemu.Config.MemoryPrealloc), charged to the VMMs'
// cgroups rather than the node's.
func makeMemoryFile(dir, path string) error {
	// Each directory is checked before anything is made in it.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := checkRootOnly(d, true); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// checkRootOnly refuses what is not root's alone: a directory or a
// regular file owned by root, no symbolic link, that nobody else may
// read or write (a directory may let the VMM account search it: its ACL
// entry shows as the group's x). A memory file's directory on a shared
// tmpfs (/dev/shm) may have been made by someone else first.
func checkRootOnly(path string, dir bool) error {
	st, err := os.Lstat(path)
	if err != nil {
		return err
	}
	kind, others := "regular file", os.FileMode(0o077)
	if dir {
		kind, others = "directory", 0o066
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case dir != st.IsDir() || !dir && !st.Mode().IsRegular():
		return fmt.Errorf("%s is not a %s (mode %v); remove it", path, kind, st.Mode())
	case !ok || sys.Uid != 0 || st.Mode().Perm()&others != 0:
		return fmt.Errorf("%s has owner %d and mode %#o; want a %s of root's alone: remove it", path, sys.Uid, st.Mode().Perm(), kind)
	}
	return nil
}

// keepRootOnly makes path root's alone (the VMM account had it while the
// guest ran).
func keepRootOnly(path string) error {
	if err := os.Chown(path, 0, 0); err != nil {
		return fmt.Errorf("keep %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return fmt.Errorf("keep %s: %w", path, err)
	}
	return nil
}

// keepLayer moves a saved guest's layer to path, root's alone (the VMM
// account had it while the guest ran) and on disk.
func keepLayer(layer, path string) error {
	if err := keepRootOnly(layer); err != nil {
		return err
	}
	if err := storagepool.SyncFile(layer); err != nil {
		return fmt.Errorf("keep layer %s: %w", layer, err)
	}
	return storagepool.Commit(layer, path)
}

// ReadWarm reads a slot's warm.json; an incomplete slot is an error.
func ReadWarm(slot string) (WarmMeta, error) {
	var m WarmMeta
	f, err := os.Open(filepath.Join(slot, WarmMetaFile))
	if err != nil {
		return m, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSnapshotMeta+1))
	switch {
	case err != nil:
		return m, err
	case len(b) > maxSnapshotMeta:
		return m, fmt.Errorf("warm slot %s: %s over %d bytes", slot, WarmMetaFile, maxSnapshotMeta)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("warm slot %s: %s: %w", slot, WarmMetaFile, err)
	}
	if m.FormatVersion != warmFormat {
		return m, fmt.Errorf("warm slot %s: %s of format %d, this build reads %d", slot, WarmMetaFile, m.FormatVersion, warmFormat)
	}
	return m, nil
}

// read reads a slot's warm.json and, for a guest whose RAM is its memory
// file, checks that file: root's alone and of the guest's size. A slot
// whose memory file is gone (the host restarted: a tmpfs) or that this
// store cannot map is incomplete.
func (s WarmStore) read(slot string) (WarmMeta, error) {
	m, err := ReadWarm(slot)
	if err != nil || !m.MemoryInFile {
		return m, err
	}
	if s.MemoryDir == "" {
		return m, fmt.Errorf("warm slot %s: its memory is in a memory file, and this node keeps none", slot)
	}
	if err := checkMemoryFile(s.memoryFile(slot), m.MemoryMiB); err != nil {
		return m, fmt.Errorf("warm slot %s: %w", slot, err)
	}
	return m, nil
}

// Slots lists the complete slots with what they hold.
func (s WarmStore) Slots() (map[string]WarmMeta, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]WarmMeta{}
	for _, e := range entries {
		if !e.IsDir() || !IsWarm(e.Name()) {
			continue
		}
		slot := filepath.Join(s.Dir, e.Name())
		if m, err := s.read(slot); err == nil {
			out[slot] = m
		}
	}
	return out, nil
}

// Take claims a complete slot made as key, "" when there is none. The
// caller restores it (Restore) and then removes it (Remove), whether the
// start worked or not.
func (s WarmStore) Take(key WarmKey) (string, WarmMeta, error) {
	slots, err := s.Slots()
	if err != nil {
		return "", WarmMeta{}, err
	}
	for slot, m := range slots {
		if m.WarmKey != key {
			continue
		}
		taken := filepath.Join(s.Dir, takenPrefix+filepath.Base(slot))
		switch err := os.Rename(slot, taken); {
		case err == nil:
			return taken, m, nil
		case errors.Is(err, os.ErrNotExist):
			continue // another start took it first
		default:
			return "", WarmMeta{}, err
		}
	}
	return "", WarmMeta{}, nil
}

// Remove removes a slot, taken or not, with its memory file.
func (s WarmStore) Remove(slot string) error {
	err := os.RemoveAll(slot)
	if s.MemoryDir != "" {
		if merr := os.Remove(s.memoryFile(slot)); merr != nil && !errors.Is(merr, os.ErrNotExist) {
			err = errors.Join(err, merr)
		}
	}
	return err
}

// RemoveAll removes every slot and memory file of the store.
func (s WarmStore) RemoveAll() error {
	err := os.RemoveAll(s.Dir)
	if s.MemoryDir != "" {
		err = errors.Join(err, os.RemoveAll(s.MemoryDir))
	}
	return err
}

// Restore makes spec, a first start with its Workspace's configure, the
// restore of the warm guest taken into slot: over a copy of the guest's
// layer and on its memory file, with a new identity (hostname, and a
// machine id in roots, where the guest has them mounted), and a
// configure without what the guest mounted already or the identity does
// (none at all when that is everything).
func (s WarmStore) Restore(spec *Spec, slot string, m WarmMeta, hostname string, roots []string) {
	spec.Restore = &RestoreSpec{Dir: slot, Layer: filepath.Join(slot, WarmLayerFile)}
	if m.MemoryInFile {
		spec.MemoryFile = s.memoryFile(slot)
		spec.Restore.MemoryFile = spec.MemoryFile
	}
	spec.Identity = &Identity{Hostname: hostname}
	for _, r := range roots {
		if slices.ContainsFunc(m.Mounts, func(x guestproto.Mount) bool { return x.Target == r }) {
			spec.Identity.Roots = append(spec.Identity.Roots, r)
		}
	}
	if cfg := spec.Configure; cfg != nil {
		spec.Configure = func(g guestproto.GuestInfo) guestproto.ConfigureRequest {
			req := cfg(g)
			req.Mounts = slices.DeleteFunc(slices.Clone(req.Mounts), func(x guestproto.Mount) bool {
				return slices.ContainsFunc(m.Mounts, func(y guestproto.Mount) bool { return sameMount(x, y) })
			})
			if req.Hostname == hostname {
				req.Hostname = "" // the identity sets it
			}
			return req
		}
	}
}

func sameMount(a, b guestproto.Mount) bool {
	return a.Source == b.Source && a.Target == b.Target && a.FSType == b.FSType && slices.Equal(a.Options, b.Options)
}

// Clean removes, while no warm boot runs, the complete slots keep does
// not want, incomplete ones, the layers of boots that did not finish and
// memory files without a slot; taken slots too at startup, before any
// start can have taken one.
func (s WarmStore) Clean(keep func(WarmMeta) bool, startup bool) (removed int, err error) {
	entries, err := os.ReadDir(s.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	var errs []error
	kept := map[string]bool{}
	for _, e := range entries {
		p := filepath.Join(s.Dir, e.Name())
		if strings.HasPrefix(e.Name(), takenPrefix) && !startup {
			kept[strings.TrimPrefix(e.Name(), takenPrefix)] = true
			continue
		}
		if e.IsDir() && IsWarm(e.Name()) {
			if m, err := s.read(p); err == nil && keep(m) {
				kept[e.Name()] = true
				continue
			}
		}
		if err := s.Remove(p); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	if s.MemoryDir != "" {
		files, err := os.ReadDir(s.MemoryDir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		for _, f := range files {
			if id, ok := strings.CutSuffix(f.Name(), WarmMemorySuffix); ok && kept[id] {
				continue
			}
			if err := os.RemoveAll(filepath.Join(s.MemoryDir, f.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return removed, errors.Join(errs...)
}
