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
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/platform"
)

// Warm guests: a guest of a template booted ahead of any Workspace and
// paused, so that a create restores it instead of booting one (a node's
// [templates.NAME] warm = N). A warm guest boots with egress none and a
// new empty layer over the template image, which it never mounts (the
// Workspace's filesystem is mounted by the configure that follows a
// start), so a new empty layer over the same image is the same disk to
// it. Its snapshot is kept in a slot directory:
//
//	<dir>/<slot>/state, snapshot.json   the snapshot, as Pause writes it
//	<dir>/<slot>/warm.json              written last: the slot is complete
//
// A slot is restored once: TakeWarm moves it to a name no other take
// lists, and whoever took it removes it after the start. Every restore
// of a warm guest is given a new identity (random state, hostname, machine
// id), as a fork is.

// WarmMetaFile completes a warm slot.
const WarmMetaFile = "warm.json"

// warmFormat is the format version of warm.json.
const warmFormat = 1

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
}

// WarmSpec is a warm guest to make.
type WarmSpec struct {
	WarmKey
	Image        string // the template image
	Installation *platform.Installation
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
	spec := Spec{InstanceID: id, Installation: s.Installation, VCPUs: s.VCPUs, MemoryMiB: s.MemoryMiB,
		Network: true, Policy: NetworkPolicy{Egress: api.EgressNone}, RootImage: s.Image, LayerPath: layer}
	_, err := rt.Start(ctx, spec)
	if err == nil {
		_, err = rt.Pause(ctx, id, slot)
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
		m := WarmMeta{FormatVersion: warmFormat, WarmKey: s.WarmKey, BootedAt: time.Now().UTC()}
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
// none. The caller restores it (RestoreSpec.FreshLayer) and then removes
// it, whether the start worked or not.
func TakeWarm(dir string, key WarmKey) (string, error) {
	slots, err := WarmSlots(dir)
	if err != nil {
		return "", err
	}
	for slot, m := range slots {
		if m.WarmKey != key {
			continue
		}
		taken := filepath.Join(dir, takenPrefix+filepath.Base(slot))
		switch err := os.Rename(slot, taken); {
		case err == nil:
			return taken, nil
		case errors.Is(err, os.ErrNotExist):
			continue // another start took it first
		default:
			return "", err
		}
	}
	return "", nil
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
