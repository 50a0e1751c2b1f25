package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/storagepool"
)

// Self-fencing through holder records. Before it opens a retained layer
// or a Volume the node writes the object's holder record (itself, its
// incarnation, ctrl's grant: the Instance); while the Instance runs it
// reads the records every FenceInterval, and when one names another node
// or grant (ctrl isolated this node while it was cut off and gave the
// object to another member, which wrote its own record) it ends the VMM
// at once, with or without contact to ctrl.

// DefaultFenceInterval is how often a node checks the holder records of
// the objects its Instances write.
const DefaultFenceInterval = time.Second

// holder is this incarnation's holder record for Instance id.
func (a *Agent) holder(id string) storagepool.Holder {
	return storagepool.Holder{NodeID: a.cfg.NodeID, Incarnation: a.incarnation, Grant: id, WrittenAt: time.Now().UTC()}
}

// claimObject writes this node's holder record of an object (a layer, a
// Volume's file) for Instance id. When the record named another node,
// the start first waits HandoverWait so that node, if it still runs a
// writer, sees the new record and stops.
func (a *Agent) claimObject(ctx context.Context, object, id string) error {
	prev, err := storagepool.ReadHolder(object)
	if err != nil {
		// Unreadable (a torn disk, another program): ctrl's grant is ours.
		a.log.Warn("holder record unreadable, replaced", "object", object, "err", err)
	}
	if err := storagepool.WriteHolder(object, a.holder(id)); err != nil {
		return fmt.Errorf("holder record of %s: %w", object, err)
	}
	if prev != nil && prev.NodeID != a.cfg.NodeID {
		a.log.Info("storage object taken over from another node", "object", object, "instance_id", id, "previous_holder", prev.String(), "wait", a.cfg.HandoverWait)
		if err := ctxsleep.Sleep(ctx, a.cfg.HandoverWait); err != nil {
			return err
		}
	}
	return nil
}

// releaseObjects removes the holder records of the objects Instance id
// no longer writes (its VMM ended), where the record is still this
// node's: the next holder then starts without waiting for a writer that
// is gone.
func (a *Agent) releaseObjects(id string, objects []string) {
	for _, object := range objects {
		if h, err := storagepool.ReadHolder(object); err == nil && h != nil && h.Names(a.cfg.NodeID, id) {
			if err := storagepool.RemoveHolder(object); err != nil {
				a.log.Warn("holder record not released", "object", object, "instance_id", id, "err", err)
			}
		}
	}
}

// objectsOf are the files in pools an Instance writes: its layer and its
// Volumes.
func objectsOf(st runtime.InstanceStatus) []string {
	var out []string
	if st.LayerPath != "" {
		out = append(out, st.LayerPath)
	}
	for _, v := range st.Volumes {
		out = append(out, v.Path)
	}
	return out
}

// watchHolders fences every Instance an object of which has a holder
// record naming someone else, until ctx ends.
func (a *Agent) watchHolders(ctx context.Context) {
	rt := a.cfg.Runtime
	if rt == nil {
		return
	}
	tick := time.NewTicker(a.cfg.FenceInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, st := range rt.Owned() {
			if st.State != runtime.StateRunning && st.State != runtime.StateStarting {
				continue
			}
			for _, object := range objectsOf(st) {
				if a.checkHolder(ctx, st, object) {
					break // fenced: its other objects need no look
				}
			}
		}
	}
}

// checkHolder reads object's holder record and fences Instance st when
// it names someone else; it reports whether it fenced.
func (a *Agent) checkHolder(ctx context.Context, st runtime.InstanceStatus, object string) bool {
	h, err := storagepool.ReadHolder(object)
	switch {
	case err != nil:
		a.log.Warn("holder record unreadable", "object", object, "instance_id", st.ID, "err", err)
		return false
	case h == nil:
		// Started by a build before holder records: claim it now.
		if err := storagepool.WriteHolder(object, a.holder(st.ID)); err != nil {
			a.log.Warn("holder record not written", "object", object, "instance_id", st.ID, "err", err)
		}
		return false
	case h.Names(a.cfg.NodeID, st.ID):
		return false
	}
	reason := fmt.Sprintf("storage object %s was handed to %s: its writer was stopped", object, h)
	a.log.Error("storage object handed to another node", "object", object, "instance_id", st.ID, "holder", h.String())
	if err := a.cfg.Runtime.Fence(ctx, st.ID, reason); err != nil {
		a.log.Error("instance not fenced", "instance_id", st.ID, "err", err)
		return false
	}
	a.PushReport()
	return true
}
