package runtime

import (
	"context"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/vmm/qemu"
)

// Guests whose pool filled up. A guest's write to its layer or a Volume
// that fails with ENOSPC stops its vCPUs (QEMU's default werror=enospc)
// and is retried when the guest goes on, so nothing it wrote is lost and
// its file systems see no error; but QEMU does not go on by itself. The
// runtime looks at every running guest each DiskFullInterval: one stopped
// so goes on once every pool its disks are in has DiskFullRoom free again.
// Until then it waits, as on a stalled disk, and the node says so once.

// DefaultDiskFullInterval is how often running guests are asked whether a
// full pool stopped them.
const DefaultDiskFullInterval = 2 * time.Second

// DiskFullRoom is the free space a pool needs before a guest it stopped
// goes on: less would stop it again at once.
const DiskFullRoom = 64 << 20

// runStateIOError is QMP query-status's status of a guest a disk error
// stopped.
const runStateIOError = "io-error"

func (rt *Runtime) watchDiskFull() {
	rt.everyInstance(rt.cfg.DiskFullInterval, rt.resumeWhenRoom)
}

// resumeWhenRoom lets a guest a full pool stopped go on, once the pool
// has room. A guest whose QMP socket is busy (a pause saving it holds
// the one connection QEMU serves) is looked at next time.
func (rt *Runtime) resumeWhenRoom(in *instance) {
	in.mu.Lock()
	state, rec, control, resident := in.state, in.rec, in.paths.Control, in.resident
	in.mu.Unlock()
	if state != StateRunning || resident != nil || rec == nil || rec.Backend != (&QEMU{}).Name() {
		return
	}
	ctx, cancel := context.WithTimeout(rt.ctx, time.Second)
	defer cancel()
	q, err := qemu.DialQMP(ctx, control)
	if err != nil {
		return
	}
	defer q.Close()
	var st struct {
		Status string `json:"status"`
	}
	if err := q.Execute(ctx, "query-status", nil, &st); err != nil {
		return
	}
	if st.Status != runStateIOError {
		in.mu.Lock()
		in.diskFull = false
		in.mu.Unlock()
		return
	}
	if full := fullDirs(diskDirs(rec)); len(full) > 0 {
		in.mu.Lock()
		said := in.diskFull
		in.diskFull = true
		in.mu.Unlock()
		if !said {
			rt.log.Warn("guest stopped: a pool its disks are in is full; it goes on once the pool has room", "instance_id", in.id, "full", full, "room_needed_bytes", DiskFullRoom)
		}
		return
	}
	if err := q.Cont(ctx); err != nil {
		rt.log.Warn("guest stopped by a full pool not started again", "instance_id", in.id, "err", err)
		return
	}
	in.mu.Lock()
	in.diskFull = false
	in.mu.Unlock()
	rt.log.Info("guest goes on: its pools have room again", "instance_id", in.id)
}

// diskDirs are the directories of the files in pools a guest writes: its
// layer's and its Volumes'.
func diskDirs(rec *LaunchRecord) []string {
	var dirs []string
	if rec.LayerPath != "" {
		dirs = append(dirs, filepath.Dir(rec.LayerPath))
	}
	for _, v := range rec.Volumes {
		dirs = append(dirs, filepath.Dir(v.Path))
	}
	return dirs
}

// fullDirs are those of dirs whose file system has less than DiskFullRoom
// free (or cannot say).
func fullDirs(dirs []string) []string {
	var full []string
	for _, d := range dirs {
		var st syscall.Statfs_t
		if err := syscall.Statfs(d, &st); err != nil || st.Bavail*uint64(st.Bsize) < DiskFullRoom {
			full = append(full, d)
		}
	}
	return full
}
