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
// the node writes the layer's holder record (itself, its incarnation,
// ctrl's grant: the Instance); while the Instance runs it reads the
// record every FenceInterval, and when the record names another node or
// grant (ctrl isolated this node while it was cut off and gave the layer
// to another member, which wrote its own record) it ends the VMM at once,
// with or without contact to ctrl.

// DefaultFenceInterval is how often a node checks the holder records of
// the objects its Instances write.
const DefaultFenceInterval = time.Second

// holder is this incarnation's holder record for Instance id.
func (a *Agent) holder(id string) storagepool.Holder {
	return storagepool.Holder{NodeID: a.cfg.NodeID, Incarnation: a.incarnation, Grant: id, WrittenAt: time.Now().UTC()}
}

// claimLayer writes this node's holder record of layer for Instance id.
// When the record named another node, the start first waits HandoverWait
// so that node, if it still runs a writer, sees the new record and stops.
func (a *Agent) claimLayer(ctx context.Context, layer, id string) error {
	prev, err := storagepool.ReadHolder(layer)
	if err != nil {
		// Unreadable (a torn disk, another program): ctrl's grant is ours.
		a.log.Warn("holder record unreadable, replaced", "object", layer, "err", err)
	}
	if err := storagepool.WriteHolder(layer, a.holder(id)); err != nil {
		return fmt.Errorf("holder record of %s: %w", layer, err)
	}
	if prev != nil && prev.NodeID != a.cfg.NodeID {
		a.log.Info("storage object taken over from another node", "object", layer, "instance_id", id, "previous_holder", prev.String(), "wait", a.cfg.HandoverWait)
		if err := ctxsleep.Sleep(ctx, a.cfg.HandoverWait); err != nil {
			return err
		}
	}
	return nil
}

// releaseLayer removes the holder record of a layer Instance id no longer
// writes (its VMM ended), if the record is still this node's: the next
// holder then starts without waiting for a writer that is gone.
func (a *Agent) releaseLayer(layer, id string) {
	if layer == "" {
		return
	}
	if h, err := storagepool.ReadHolder(layer); err == nil && h != nil && h.Names(a.cfg.NodeID, id) {
		if err := storagepool.RemoveHolder(layer); err != nil {
			a.log.Warn("holder record not released", "object", layer, "instance_id", id, "err", err)
		}
	}
}

// watchHolders fences every Instance whose layer's holder record names
// someone else, until ctx ends.
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
		for _, st := range rt.List() {
			if st.LayerPath == "" || (st.State != runtime.StateRunning && st.State != runtime.StateStarting) {
				continue
			}
			a.checkHolder(ctx, st)
		}
	}
}

func (a *Agent) checkHolder(ctx context.Context, st runtime.InstanceStatus) {
	h, err := storagepool.ReadHolder(st.LayerPath)
	switch {
	case err != nil:
		a.log.Warn("holder record unreadable", "object", st.LayerPath, "instance_id", st.ID, "err", err)
		return
	case h == nil:
		// Started by a build before holder records: claim it now.
		if err := storagepool.WriteHolder(st.LayerPath, a.holder(st.ID)); err != nil {
			a.log.Warn("holder record not written", "object", st.LayerPath, "instance_id", st.ID, "err", err)
		}
		return
	case h.Names(a.cfg.NodeID, st.ID):
		return
	}
	reason := fmt.Sprintf("storage object %s was handed to %s: its writer was stopped", st.LayerPath, h)
	a.log.Error("storage object handed to another node", "object", st.LayerPath, "instance_id", st.ID, "holder", h.String())
	if err := a.cfg.Runtime.Fence(ctx, st.ID, reason); err != nil {
		a.log.Error("instance not fenced", "instance_id", st.ID, "err", err)
		return
	}
	a.PushReport()
}
