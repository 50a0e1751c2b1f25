package ctrl

import (
	"context"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// The transfer driver: `transfer export` records the Transfer; the
// leader asks the exporting node to write the archive and records its
// answer and, while it runs, how far it is; it removes the archives of
// failed Transfers, and expired Transfers with theirs.

// Timings of the driver.
const (
	transferTick = 2 * time.Second
	// exportRetry is how long after an unanswered call the node is asked
	// again; exportGiveUp after the export began it is failed instead.
	exportRetry  = 10 * time.Second
	exportGiveUp = 2 * time.Hour
	// cleanupRetry spaces the attempts (and log lines) of one cleanup.
	cleanupRetry = time.Minute
	// progressEvery is how often the leader asks an exporting node how far
	// it is and records the answer (a Raft write while it changes).
	progressEvery = 3 * time.Second
)

// KickTransfers makes the transfer driver look for work now (a Transfer
// was recorded).
func (l *Leader) KickTransfers() {
	select {
	case l.transferKick <- struct{}{}:
	default:
	}
}

// driveTransfers is the leader's transfer work while it leads.
func (l *Leader) driveTransfers(ctx context.Context) {
	var mu sync.Mutex
	inflight, retryAt, cleaned := map[string]bool{}, map[string]time.Time{}, map[string]time.Time{}
	tick := time.NewTicker(transferTick)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-l.transferKick:
		}
		now := time.Now()
		var work *fsm.TransferWork
		if err := l.c.View(func(tx *bolt.Tx) (err error) { work, err = fsm.PendingTransferWork(tx, now); return }); err != nil {
			continue
		}
		for _, t := range work.Exports {
			mu.Lock()
			busy := inflight[t.TransferID] || now.Before(retryAt[t.TransferID])
			if !busy {
				inflight[t.TransferID] = true
			}
			mu.Unlock()
			if busy {
				continue
			}
			wg.Go(func() {
				retry := l.driveExport(ctx, t, work.ExportNodes[t.TransferID])
				mu.Lock()
				delete(inflight, t.TransferID)
				if retry {
					retryAt[t.TransferID] = time.Now().Add(exportRetry)
				}
				mu.Unlock()
			})
		}
		for _, tr := range append(work.Failed, work.Expired...) {
			if now.Sub(cleaned[tr.TransferID]) < cleanupRetry {
				continue
			}
			cleaned[tr.TransferID] = now
			if err := l.c.RemoveArchive(ctx, &tr); err != nil {
				continue
			}
			if tr.State == api.TransferFailed && !now.After(tr.ExpiresAt) {
				// Listed (with its error) until it expires or is deleted;
				// its archive is gone, so it is not cleaned again.
				cleaned[tr.TransferID] = tr.ExpiresAt
				continue
			}
			l.c.ApplyOp(ctx, fsm.OpTransferDelete, fsm.ObjectArgs{Name: tr.TransferID})
		}
	}
}

// driveExport asks the node to export and records its answer; true when
// the node did not answer and should be asked again later.
func (l *Leader) driveExport(ctx context.Context, t api.TransferExportTask, nodeID string) bool {
	var n *api.Node
	if err := l.c.View(func(tx *bolt.Tx) (err error) { n, err = fsm.GetNode(tx, nodeID); return }); err != nil {
		return true
	}
	stop := l.followProgress(ctx, n, t.TransferID)
	defer stop()
	res, err := l.c.ExportTransfer(ctx, n, t)
	args := fsm.TransferResultArgs{TransferID: t.TransferID, NodeID: nodeID, Outcome: fsm.OutcomeOK, Digest: res.Digest, SizeBytes: res.SizeBytes, TemplateID: res.TemplateID}
	if err != nil {
		if api.CodeOf(err) == api.CodeUnavailable && ctx.Err() == nil {
			var created time.Time
			l.c.View(func(tx *bolt.Tx) error {
				if tr, err := fsm.GetTransfer(tx, t.TransferID); err == nil {
					created = tr.CreatedAt
				}
				return nil
			})
			if time.Since(created) < exportGiveUp {
				l.log.Warn("transfer export not answered", "transfer_id", t.TransferID, "peer_node_id", nodeID, "err", err)
				return true
			}
		}
		if ctx.Err() != nil {
			return false // the next leader drives it
		}
		args = fsm.TransferResultArgs{TransferID: t.TransferID, NodeID: nodeID, Outcome: fsm.OutcomeFailed, Error: fmt.Sprintf("node %s: %v", nodeID, err)}
	}
	if _, err := l.c.ApplyOp(ctx, fsm.OpTransferResult, args); err != nil {
		return true
	}
	return false
}

// followProgress records how far node n's export of a Transfer is, every
// progressEvery, until the returned stop is called.
func (l *Leader) followProgress(ctx context.Context, n *api.Node, id string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(progressEvery)
		defer tick.Stop()
		var last api.TransferProgress
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			p, err := l.c.ExportProgress(ctx, n, id)
			if err != nil || p == last {
				continue
			}
			last = p
			l.c.ApplyOp(ctx, fsm.OpTransferProgress, fsm.TransferProgressArgs{TransferID: id, NodeID: n.NodeID, TransferProgress: p})
		}
	}()
	return func() { cancel(); <-done }
}
