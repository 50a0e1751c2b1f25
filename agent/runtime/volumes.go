package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kibotos/kibotos/vmm/qemu"
)

// Volumes: raw ext4 files in a storage pool, attached to an Instance's VM
// as extra virtio-blk disks. The guest finds each by its serial (the vdX
// names follow probing order) and mounts it; a running one grows through
// QMP block_resize, after which the guest agent grows its filesystem.

// VolumeDisk is one Volume attached to an Instance.
type VolumeDisk struct {
	// Serial is the disk's virtio-blk serial (qemu.ValidSerial): the
	// guest mounts it as "serial:<Serial>".
	Serial string `json:"serial"`
	// Path is the raw image file, in a storage pool.
	Path string `json:"path"`
}

// LayerSerial is the virtio-blk serial of the retained layer's disk: the
// guest mounts its root as "serial:layer".
const LayerSerial = "layer"

// MaxVolumes is the most Volumes one Instance takes. microvm has 24
// virtio-mmio slots; the channels, network, layer and scratch disk take
// four of them.
const MaxVolumes = 8

// volumeDriveID is the QEMU drive id of a Volume's disk, the device name
// QMP block_resize takes. The prefix keeps it a valid id (one starting
// with a letter) and apart from the layer's and the scratch disk's.
func volumeDriveID(serial string) string { return "v-" + serial }

// checkVolumes validates a Spec's Volumes.
func checkVolumes(vols []VolumeDisk) error {
	if len(vols) > MaxVolumes {
		return fmt.Errorf("%d volumes: at most %d attach to one Instance", len(vols), MaxVolumes)
	}
	seen := map[string]bool{}
	var errs []error
	for _, v := range vols {
		switch {
		case qemu.ValidSerial(v.Serial) != nil:
			errs = append(errs, fmt.Errorf("volume %s: %w", v.Path, qemu.ValidSerial(v.Serial)))
			continue
		case v.Serial == LayerSerial:
			errs = append(errs, fmt.Errorf("volume %s: serial %q is the retained layer's; give the Volume another", v.Path, v.Serial))
		case seen[v.Serial]:
			errs = append(errs, fmt.Errorf("volume serial %q given twice: each Volume needs its own", v.Serial))
		}
		seen[v.Serial] = true
		if !filepath.IsAbs(v.Path) {
			errs = append(errs, fmt.Errorf("volume %s: path %q is not absolute", v.Serial, v.Path))
			continue
		}
		if fi, err := os.Stat(v.Path); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", v.Serial, err))
		} else if !fi.Mode().IsRegular() {
			errs = append(errs, fmt.Errorf("volume %s: %s is a %v, not a raw image file", v.Serial, v.Path, fi.Mode().Type()))
		}
	}
	return errors.Join(errs...)
}

// BlockResize grows the Volume with serial of a running Instance to
// sizeBytes: QMP block_resize on its drive, which grows the file and
// tells the guest kernel the new capacity. The filesystem inside grows
// only when the guest agent is asked to (guestproto Client.GrowFS).
// Volumes only grow, by whole 512-byte sectors (what the guest sees).
func (rt *Runtime) BlockResize(ctx context.Context, instanceID, serial string, sizeBytes uint64) error {
	in, err := rt.get(instanceID)
	if err != nil {
		return err
	}
	in.mu.Lock()
	state, rec, control := in.state, in.rec, in.paths.Control
	in.mu.Unlock()
	fail := func(format string, args ...any) error {
		return fmt.Errorf("runtime: instance %s: resize volume %s: %s", instanceID, serial, fmt.Sprintf(format, args...))
	}
	if state != StateRunning {
		return fail("the Instance is %s; a running one is resized here, a stopped one by growing its file", state)
	}
	var vol *VolumeDisk
	for i := range rec.Volumes {
		if rec.Volumes[i].Serial == serial {
			vol = &rec.Volumes[i]
		}
	}
	switch {
	case vol == nil:
		return fail("the Instance was not launched with it")
	case rec.Backend != (&QEMU{}).Name():
		return fail("backend %s cannot resize a disk of a running VM", rec.Backend)
	case sizeBytes%512 != 0:
		return fail("%d bytes is not a whole number of 512-byte sectors", sizeBytes)
	}
	fi, err := os.Stat(vol.Path)
	if err != nil {
		return fail("%v", err)
	}
	if uint64(fi.Size()) > sizeBytes {
		return fail("%s is %d bytes; Volumes only grow, not to %d", vol.Path, fi.Size(), sizeBytes)
	}
	q, err := qemu.DialQMP(ctx, control)
	if err != nil {
		return fail("%v", err)
	}
	defer q.Close()
	if err := q.BlockResize(ctx, volumeDriveID(serial), sizeBytes); err != nil {
		return fail("%v", err)
	}
	rt.log.Info("volume resized", "instance_id", instanceID, "serial", serial, "path", vol.Path, "bytes", sizeBytes)
	return nil
}

// WhilePaused runs fn with the Instance's vCPUs stopped: its guest synced
// first (best effort: a guest that does not answer is paused as it is),
// then QEMU's stop, which drains and flushes every disk, so fn reads the
// layer and Volume files as a consistent whole. The guest runs on when fn
// returns, whatever fn did. A Transfer of a running Workspace copies its
// files here.
func (rt *Runtime) WhilePaused(ctx context.Context, id string, fn func() error) error {
	in, err := rt.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	state, rec, control := in.state, in.rec, in.paths.Control
	in.mu.Unlock()
	fail := func(err error) error { return fmt.Errorf("runtime: instance %s: pause to copy its disks: %w", id, err) }
	switch {
	case state != StateRunning:
		return fail(fmt.Errorf("it is %s", state))
	case rec.Backend != (&QEMU{}).Name():
		return fail(fmt.Errorf("backend %s cannot pause a VM", rec.Backend))
	}
	if g, err := rt.Guest(id); err == nil {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := g.Sync(sctx); err != nil {
			rt.log.Warn("guest not synced before a pause", "instance_id", id, "err", err)
		}
		cancel()
	}
	q, err := qemu.DialQMP(ctx, control)
	if err != nil {
		return fail(err)
	}
	defer q.Close()
	cont := func() error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return q.Cont(cctx)
	}
	if err := q.Execute(ctx, "stop", nil, nil); err != nil {
		// Cut short, the stop may have reached QEMU all the same.
		if cerr := cont(); cerr != nil {
			err = fmt.Errorf("%w; the guest may stay paused: %w", err, cerr)
		}
		return fail(err)
	}
	t0 := time.Now()
	ferr := fn()
	if err := cont(); err != nil {
		return fail(fmt.Errorf("the guest stays paused: %w", errors.Join(ferr, err)))
	}
	rt.log.Info("instance paused to copy its disks", "instance_id", id, "seconds", time.Since(t0).Seconds())
	return ferr
}
