package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/clusterlab"
)

// maxVolumes bounds the Volumes of the run (32-64 MiB each).
const maxVolumes = 3

// volumeOp is one Volume operation: create, an append through the
// Workspace it is attached to, resize (grow) or delete.
func (w *Workload) volumeOp(ctx context.Context, client int, h *clusterlab.Host, kind string, rng *rand.Rand) {
	switch kind {
	case "volume-create":
		w.createVolume(ctx, client, h)
	case "volume-append":
		if ws, vol := w.pickAttached(rng); ws != nil {
			w.appendVolume(client, h, ws, vol)
		}
	case "volume-resize":
		if vol := w.pickVolume(rng, false); vol != nil {
			w.resizeVolume(ctx, client, h, vol)
		}
	case "volume-delete":
		if vol := w.pickVolume(rng, true); vol != nil {
			w.deleteVolume(ctx, client, h, vol)
		}
	}
}

func (w *Workload) createVolume(ctx context.Context, client int, h *clusterlab.Host) {
	w.mu.Lock()
	live := 0
	for _, v := range w.volumes {
		if !v.deleted {
			live++
		}
	}
	if live >= maxVolumes {
		w.mu.Unlock()
		return
	}
	w.volumeN++
	name := "nem-v" + strconv.Itoa(w.volumeN)
	w.mu.Unlock()
	o := w.op(client, h, "volume-create", "")
	o.Detail = name
	r := w.retried(ctx, h, []string{"volume", "create", name, "--size", "32MiB", "--pool", "shared", "--timeout", lifecycleWait, "--command-id", commandID(), "--json"})
	var v api.Volume
	if r.Code == 0 {
		if err := clusterlab.DecodeResult(r, &v); err != nil {
			r.Code, r.Stderr = -1, err.Error()
		}
	} else {
		// It may be there: of unknown outcome, or accepted and FAILED
		// (its file not made: exit 13, "delete it"). Then it is part
		// of the run.
		h.KiboJSON(&v, "volume", "get", name, "--consistent")
	}
	o.Volume = v.VolumeID
	o = w.finish(o, r)
	if v.VolumeID != "" {
		w.mu.Lock()
		w.volumes = append(w.volumes, &volumeEntry{name: name, id: v.VolumeID, sizeMiB: 32})
		w.mu.Unlock()
	}
}

// appendVolume appends the Volume's next number to volFile through the
// Workspace it is attached to, and syncs: acknowledged, it must be there
// after any fault, also once the Workspace is gone.
func (w *Workload) appendVolume(client int, h *clusterlab.Host, ws *workspaceEntry, vol *volumeEntry) {
	seq := w.nextSeq()
	o := w.op(client, h, "volume-append", ws.id)
	o.Volume, o.Seq = vol.id, seq
	w.finish(o, h.KiboTimeout(opTimeout, "workspace", "exec", ws.id, "--", "sh", "-c", fmt.Sprintf("echo %d >> %s && sync %s", seq, volFile, volFile)))
}

// resizeVolume grows the Volume by 16 MiB, attached or not.
func (w *Workload) resizeVolume(ctx context.Context, client int, h *clusterlab.Host, vol *volumeEntry) {
	w.mu.Lock()
	vol.sizeMiB += 16 // a resize of unknown outcome may have happened: grow past it
	size := vol.sizeMiB
	w.mu.Unlock()
	o := w.op(client, h, "volume-resize", "")
	o.Volume, o.Detail = vol.id, fmt.Sprintf("to %d MiB", size)
	w.finish(o, w.retried(ctx, h, []string{"volume", "resize", vol.name, "--size", fmt.Sprintf("%dMiB", size), "--timeout", lifecycleWait, "--command-id", commandID()}))
}

// deleteVolume deletes a Volume the workload knows as detached.
func (w *Workload) deleteVolume(ctx context.Context, client int, h *clusterlab.Host, vol *volumeEntry) {
	o := w.op(client, h, "volume-delete", "")
	o.Volume = vol.id
	o = w.finish(o, w.retried(ctx, h, []string{"volume", "delete", vol.name, "--timeout", lifecycleWait, "--command-id", commandID()}))
	w.mu.Lock()
	vol.deleted, vol.claimed = o.Outcome == OK, false
	w.mu.Unlock()
}

// claimVolume takes a live Volume no Workspace of the workload has for a
// create to attach; nil when there is none.
func (w *Workload) claimVolume() *volumeEntry {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, v := range w.volumes {
		if v.free() {
			v.claimed = true
			return v
		}
	}
	return nil
}

// releaseVolume gives back a Volume a create did not attach.
func (w *Workload) releaseVolume(vol *volumeEntry) {
	w.mu.Lock()
	vol.claimed = false
	w.mu.Unlock()
}

// pickAttached is a live Workspace with a Volume, and its Volume.
func (w *Workload) pickAttached(rng *rand.Rand) (*workspaceEntry, *volumeEntry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var with []*workspaceEntry
	for _, e := range w.workspaces {
		if !e.deleted && e.volume != nil {
			with = append(with, e)
		}
	}
	if len(with) == 0 {
		return nil, nil
	}
	e := with[rng.IntN(len(with))]
	return e, e.volume
}

// pickVolume is a live Volume, one the workload knows as detached when
// detached is set (then claimed for the delete).
func (w *Workload) pickVolume(rng *rand.Rand, detached bool) *volumeEntry {
	w.mu.Lock()
	defer w.mu.Unlock()
	var live []*volumeEntry
	for _, v := range w.volumes {
		if !v.deleted && (!detached || v.free()) {
			live = append(live, v)
		}
	}
	if len(live) == 0 {
		return nil
	}
	v := live[rng.IntN(len(live))]
	if detached {
		v.claimed = true // for the delete
	}
	return v
}

// readBackVolumes runs once every Workspace is deleted (every Volume
// detached): each Volume is attached to a new Workspace, its appends read
// back, and the Workspace and the Volume deleted.
func readBackVolumes(t *testing.T, admin *clusterlab.Host, w *Workload, hist *History) []Anomaly {
	var list struct {
		Volumes []api.Volume `json:"volumes"`
	}
	if err := admin.KiboJSON(&list, "volume", "list", "--consistent"); err != nil {
		return []Anomaly{{Kind: "unavailable", Detail: "volume list: " + err.Error()}}
	}
	var out []Anomaly
	for _, v := range list.Volumes {
		fail := func(what string, r clusterlab.Result) {
			out = append(out, Anomaly{Kind: "cannot-read", Volume: v.VolumeID, Detail: what + ": " + r.String(), History: of(hist.Ops(), v.VolumeID)})
		}
		if v.State == api.VolumeFailed && !v.Made {
			// Its create failed (a full pool): no file, nothing to
			// read, and no append can have been acknowledged.
			out = append(out, checkAppends(v.VolumeID, "volume-append", "", hist.Ops(), "")...)
			if r, ok := w.removeVolume(admin, v.VolumeID); !ok {
				fail("delete it (FAILED, never made)", r)
			}
			continue
		}
		o := w.op(-1, admin, "create", "")
		o.Volume = v.VolumeID
		args := append([]string{"workspace", "create", "--json", "--wait-timeout", lifecycleWait, "--volume", v.Name + ":" + volMount}, strings.Fields(w.spec)...)
		r := admin.KiboTimeout(opTimeout, args...)
		var ws api.Workspace
		if r.Code == 0 {
			clusterlab.DecodeResult(r, &ws)
		}
		o.Workspace = ws.WorkspaceID
		if o = w.finish(o, r); o.Outcome != OK {
			fail("a Workspace to read it", r)
			continue
		}
		o = w.op(-1, admin, "read-back", ws.WorkspaceID)
		o.Volume = v.VolumeID
		r = admin.KiboTimeout(opTimeout, "workspace", "exec", ws.WorkspaceID, "--", "sh", "-c", "cat "+volFile+" 2>/dev/null; true")
		if o = w.finish(o, r); o.Outcome != OK {
			fail("read it", r)
		} else {
			out = append(out, checkAppends(v.VolumeID, "volume-append", "", hist.Ops(), r.Stdout)...)
		}
		o = w.op(-1, admin, "delete", ws.WorkspaceID)
		if r := admin.KiboTimeout(opTimeout, "workspace", "delete", ws.WorkspaceID, "--timeout", lifecycleWait); w.finish(o, r).Outcome != OK {
			fail("delete the Workspace that read it", r)
			continue
		}
		if r, ok := w.removeVolume(admin, v.VolumeID); !ok {
			fail("delete it once read", r)
		}
	}
	return out
}

// removeVolume deletes Volume id after the run (client -1) and reports
// whether it went.
func (w *Workload) removeVolume(admin *clusterlab.Host, id string) (clusterlab.Result, bool) {
	o := w.op(-1, admin, "volume-delete", "")
	o.Volume = id
	r := admin.KiboTimeout(opTimeout, "volume", "delete", id, "--timeout", lifecycleWait)
	return r, w.finish(o, r).Outcome == OK
}
