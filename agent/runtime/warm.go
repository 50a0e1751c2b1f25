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
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
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
// it (RestoreSpec.Layer). Nothing of any Workspace is in either. A slot:
//
//	<dir>/<slot>/state, snapshot.json   the snapshot, as Pause writes it
//	<dir>/<slot>/layer.qcow2            the layer, as the guest left it
//	<dir>/<slot>/warm.json              written last: the slot is complete
//
// A slot is restored once: TakeWarm moves it to a name no other take
// lists, and whoever took it removes it after the start. Every restore
// of a warm guest is given a new identity (random state, hostname, machine
// id), as a fork is.

// WarmMetaFile completes a warm slot.
const WarmMetaFile = "warm.json"

// WarmLayerFile is a slot's layer.
const WarmLayerFile = "layer.qcow2"

// warmFormat is the format version of warm.json. Format 1 slots (a
// layer never mounted, not kept) are not read: an older build removes
// the slots of this one, which it would restore over a new layer the
// guest's memory does not match, and this build removes theirs.
const warmFormat = 2

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

// BootWarm boots a warm guest of s, saves it into a new slot under dir and
// ends it; it returns the slot. Nothing of a failed one is left but its
// machine logs.
func (rt *Runtime) BootWarm(ctx context.Context, dir string, s WarmSpec) (string, error) {
	if s.Installation == nil || s.Installation.ID != s.InstallationID {
		return "", fmt.Errorf("runtime: warm guest of template %s: installation %s not given", s.Template, s.InstallationID)
	}
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
	var mounts []guestproto.Mount
	if s.Mounts != nil {
		spec.Configure = func(g guestproto.GuestInfo) guestproto.ConfigureRequest {
			mounts = s.Mounts(g)
			return guestproto.ConfigureRequest{Mounts: mounts}
		}
	}
	_, err := rt.Start(ctx, spec)
	if err == nil {
		_, err = rt.Pause(ctx, id, slot)
	}
	if err == nil {
		// The layer as the saved guest left it, on disk before the slot
		// is complete.
		err = keepLayer(layer, filepath.Join(slot, WarmLayerFile))
	}
	dctx := context.WithoutCancel(ctx)
	if err != nil {
		// A warm guest has nothing to flush: no graceful stop (a node
		// that stops mid-boot waits for this).
		if ferr := rt.ForceStop(dctx, id); ferr != nil && !errors.Is(ferr, ErrUnknownInstance) {
			rt.log.Warn("warm guest not force-stopped", "instance_id", id, "err", ferr)
		}
	}
	if derr := rt.Delete(dctx, id); derr != nil && !errors.Is(derr, ErrUnknownInstance) {
		err = errors.Join(err, derr)
	}
	// No Workspace's: nobody asks for its record.
	err = errors.Join(err, rt.ForgetEnded([]string{id}))
	os.Remove(layer)
	if err == nil {
		m := WarmMeta{FormatVersion: warmFormat, WarmKey: s.WarmKey, BootedAt: time.Now().UTC(), Mounts: mounts}
		var j []byte
		if j, err = json.MarshalIndent(m, "", "  "); err == nil {
			err = storagepool.WriteFile(filepath.Join(slot, WarmMetaFile), append(j, '\n'), 0o600, storagepool.Temp{Node: rt.cfg.NodeID, Purpose: "warm"})
		}
	}
	if err != nil {
		os.RemoveAll(slot)
		return "", fmt.Errorf("runtime: warm guest of template %s: %w", s.Template, err)
	}
	os.RemoveAll(filepath.Join(rt.logsDir, id)) // a warm boot's logs would crowd out the Workspaces'
	return slot, nil
}

// keepLayer moves a saved guest's layer to path, root's alone (the VMM
// account had it while the guest ran) and on disk.
func keepLayer(layer, path string) error {
	if err := os.Chown(layer, 0, 0); err != nil {
		return fmt.Errorf("keep layer %s: %w", layer, err)
	}
	if err := os.Chmod(layer, 0o600); err != nil {
		return fmt.Errorf("keep layer %s: %w", layer, err)
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

// WarmSlots lists the complete slots under dir with what they hold.
func WarmSlots(dir string) (map[string]WarmMeta, error) {
	entries, err := os.ReadDir(dir)
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
		slot := filepath.Join(dir, e.Name())
		if m, err := ReadWarm(slot); err == nil {
			out[slot] = m
		}
	}
	return out, nil
}

// TakeWarm claims a complete slot under dir made as key, "" when there is
// none. The caller restores it (WarmRestore) and then removes it, whether
// the start worked or not.
func TakeWarm(dir string, key WarmKey) (string, WarmMeta, error) {
	slots, err := WarmSlots(dir)
	if err != nil {
		return "", WarmMeta{}, err
	}
	for slot, m := range slots {
		if m.WarmKey != key {
			continue
		}
		taken := filepath.Join(dir, takenPrefix+filepath.Base(slot))
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

// WarmRestore makes spec, a first start with its Workspace's configure,
// the restore of the warm guest taken into slot: over a copy of the
// guest's layer, with a new identity (hostname, and a machine id in
// roots, where the guest has them mounted), and a configure without what
// the guest mounted already or the identity does (none at all when that
// is everything).
func WarmRestore(spec *Spec, slot string, m WarmMeta, hostname string, roots []string) {
	spec.Restore = &RestoreSpec{Dir: slot, Layer: filepath.Join(slot, WarmLayerFile)}
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

// CleanWarm removes under dir, while no warm boot runs, the complete
// slots keep does not want, incomplete ones and the layers of boots that
// did not finish; taken slots too at startup, before any start can have
// taken one.
func CleanWarm(dir string, keep func(WarmMeta) bool, startup bool) (removed int, err error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), takenPrefix) && !startup {
			continue
		}
		if e.IsDir() && IsWarm(e.Name()) {
			if m, err := ReadWarm(p); err == nil && keep(m) {
				continue
			}
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}
