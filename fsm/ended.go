package fsm

import (
	"bytes"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Records of ended Instances (the process-model seed): a node keeps the
// record of each Instance it ended until ctrl has stored the cleanup
// conclusion the node observed, and then deletes it when ctrl says so.
//
// Up to level 3 every report concluded each record it carried at once
// (concludeEnded) and let the node delete records of Instances ctrl never
// placed. Such entries are in logs and snapshots, so they still apply
// exactly so. From LevelEndedRounds on, the leader marks its report
// entries (ReportArgs.Rounds) and they follow the seed:
//
//   - A node's records are checked in a round, at most one per node every
//     EndedRoundInterval by entry time, and at most EndedRoundMax records
//     each. The leader carries records only in the report it finds a round
//     due for, so the other report entries stay small.
//   - A record is concluded only when its Instance's Allocation is
//     released (the Workspace no longer has it as its current Instance)
//     and the Workspace has no command in progress. The conclusion is
//     stored in the same transaction that tells the node to delete it.
//   - A record without an Allocation (no owner) is not recognized: it stays
//     on the node. The result names it, and the node leaves it out of its
//     later reports (until it restarts), so such records neither grow every
//     round's entry nor hold back the records behind them.
//   - The owner of a concluded Instance is kept until the node's complete
//     list no longer has its record: a delete the node never got (the
//     session ended first) is asked for again instead of leaving a record
//     ctrl no longer recognizes.
//   - ctrl notes the Instances a node reports holding (bucketEndedWatch).
//     Once such an Instance is released, its record must be on the node:
//     the node lists its records only after sending the answers before
//     the report, and writes a record before its answer. A complete list
//     without it means the record was deleted before its conclusion was
//     stored: the conclusion is stored as unknown (cleanup-status shows
//     UNKNOWN). An Instance that started and ended between two reports is
//     never noted; its record, if deleted early, is not detected.

// EndedRoundInterval is the least time between two rounds of a node.
const EndedRoundInterval = time.Minute

// EndedRoundMax is the most records a round looks at.
const EndedRoundMax = 100

// endedWatch is an Instance ctrl expects the ended record of on a node.
type endedWatch struct {
	WorkspaceID string `json:"workspace_id"`
	// Concluded: the conclusion is stored and the node told to delete
	// the record; the watch (and owner) go once the record is gone.
	Concluded bool `json:"concluded,omitempty"`
}

func endedWatchKey(node, instance string) []byte { return []byte(node + "\x00" + instance) }

// LastEndedRound is the entry time of the node's latest round of ended
// records; zero before its first.
func LastEndedRound(tx *bolt.Tx, node string) (time.Time, error) {
	var t time.Time
	raw := tx.Bucket(bucketEndedRounds).Get([]byte(node))
	if raw == nil {
		return t, nil
	}
	if err := t.UnmarshalText(raw); err != nil {
		return t, fmt.Errorf("state record %s/%s is corrupt: %w", bucketEndedRounds, node, err)
	}
	return t, nil
}

// EndedRoundDue reports whether a node whose latest round was at last
// may have its next one at t.
func EndedRoundDue(last, t time.Time) bool {
	return last.IsZero() || !t.Before(last.Add(EndedRoundInterval))
}

// concludeEnded stores, for each ended Instance the node reports, the
// node's cleanup conclusion on its Workspace, once ctrl no longer waits
// for anything of that Instance; it returns the records the node may
// delete now (records of Instances ctrl never placed included). Report
// entries without Rounds apply it; endedRound is its successor.
func concludeEnded(ac *applyCtx, node string, ended []api.EndedInstance) ([]string, error) {
	var forget []string
	owners := ac.tx.Bucket(bucketInstanceOwners)
	for _, ei := range ended {
		wsID := owners.Get([]byte(ei.InstanceID))
		if wsID == nil {
			forget = append(forget, ei.InstanceID)
			continue
		}
		w, err := getWorkspace(ac.tx, string(wsID))
		if err != nil {
			return nil, err
		}
		if w != nil {
			if w.InstanceID == ei.InstanceID || (w.Pending != nil && w.Pending.InstanceID == ei.InstanceID) {
				continue // ctrl has not taken the stop's answer yet
			}
			old := cloneWorkspace(w)
			w.Cleanup = &api.CleanupConclusion{InstanceID: ei.InstanceID, NodeID: node, ObservedAt: ei.EndedAt.UTC(), How: ei.How}
			if err := putWorkspace(ac, old, w); err != nil {
				return nil, err
			}
		}
		if err := owners.Delete([]byte(ei.InstanceID)); err != nil {
			return nil, err
		}
		forget = append(forget, ei.InstanceID)
	}
	return forget, nil
}

// endedRound applies the ended-record rules of a report entry with
// Rounds: it notes the node's Instances and, in a round, concludes its
// records; it returns the records the node may delete and those ctrl does
// not recognize.
func endedRound(ac *applyCtx, node string, a *ReportArgs) (forget, unrecognized []string, err error) {
	if err := watchInstances(ac.tx, node, a.Report.InstanceStates); err != nil {
		return nil, nil, err
	}
	if !a.Round {
		return nil, nil, nil
	}
	last, err := LastEndedRound(ac.tx, node)
	if err != nil {
		return nil, nil, err
	}
	if !EndedRoundDue(last, *at(ac.e)) {
		// A leader whose clock is behind its predecessor's: the next
		// report is the round.
		return nil, nil, nil
	}
	stamp, _ := at(ac.e).MarshalText()
	if err := ac.tx.Bucket(bucketEndedRounds).Put([]byte(node), stamp); err != nil {
		return nil, nil, err
	}
	ended, complete := a.Report.Ended, a.Report.EndedComplete
	if len(ended) > EndedRoundMax {
		ended, complete = ended[:EndedRoundMax], false
	}
	listed := make(map[string]bool, len(ended))
	for _, ei := range ended {
		listed[ei.InstanceID] = true
		done, known, err := concludeRecord(ac, node, ei)
		switch {
		case err != nil:
			return nil, nil, err
		case !known:
			unrecognized = append(unrecognized, ei.InstanceID)
		case done:
			forget = append(forget, ei.InstanceID)
		}
	}
	if complete {
		if err := settleMissing(ac, node, listed); err != nil {
			return nil, nil, err
		}
	}
	return forget, unrecognized, nil
}

// watchInstances notes the Instances the node reports holding that are
// the current Instance ctrl placed there.
func watchInstances(tx *bolt.Tx, node string, states []api.InstanceState) error {
	owners, watch := tx.Bucket(bucketInstanceOwners), tx.Bucket(bucketEndedWatch)
	for _, s := range states {
		wsID := owners.Get([]byte(s.InstanceID))
		key := endedWatchKey(node, s.InstanceID)
		if wsID == nil || watch.Get(key) != nil {
			continue
		}
		w, err := getWorkspace(tx, string(wsID))
		if err != nil {
			return err
		}
		if w == nil || w.InstanceID != s.InstanceID || w.NodeID != node {
			continue
		}
		if err := putJSON(tx, bucketEndedWatch, key, endedWatch{WorkspaceID: w.WorkspaceID}); err != nil {
			return err
		}
	}
	return nil
}

// concludeRecord stores the conclusion of one listed record when ctrl no
// longer waits for its Instance. known is false for a record without an
// owner; done means the node may delete the record.
func concludeRecord(ac *applyCtx, node string, ei api.EndedInstance) (done, known bool, err error) {
	wsID := ac.tx.Bucket(bucketInstanceOwners).Get([]byte(ei.InstanceID))
	if wsID == nil {
		return false, false, nil
	}
	w, err := getWorkspace(ac.tx, string(wsID))
	if err != nil {
		return false, true, err
	}
	if w != nil {
		if w.InstanceID == ei.InstanceID || w.Pending != nil {
			return false, true, nil // its Allocation, or a command, is not done yet
		}
		// Only the latest execution's conclusion is shown: an older
		// Instance's record goes without replacing it.
		if LatestInstanceID(w) == ei.InstanceID && (w.Cleanup == nil || w.Cleanup.InstanceID != ei.InstanceID) {
			old := cloneWorkspace(w)
			w.Cleanup = &api.CleanupConclusion{InstanceID: ei.InstanceID, NodeID: node, ObservedAt: ei.EndedAt.UTC(), How: ei.How}
			if err := putWorkspace(ac, old, w); err != nil {
				return false, true, err
			}
		}
	}
	return true, true, putJSON(ac.tx, bucketEndedWatch, endedWatchKey(node, ei.InstanceID), endedWatch{WorkspaceID: string(wsID), Concluded: true})
}

// settleMissing handles, after a complete list, the node's watched
// Instances whose record it did not list: a concluded one's record is
// gone as asked; a released one's was deleted before its conclusion.
func settleMissing(ac *applyCtx, node string, listed map[string]bool) error {
	type watched struct {
		instance string
		endedWatch
	}
	var ws []watched
	prefix := []byte(node + "\x00")
	c := ac.tx.Bucket(bucketEndedWatch).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		inst := string(k[len(prefix):])
		if listed[inst] {
			continue
		}
		w := watched{instance: inst}
		if err := jsonRecord(bucketEndedWatch, k, v, &w.endedWatch); err != nil {
			return err
		}
		ws = append(ws, w)
	}
	owners := ac.tx.Bucket(bucketInstanceOwners)
	for _, wt := range ws {
		if owners.Get([]byte(wt.instance)) != nil && !wt.Concluded {
			w, err := getWorkspace(ac.tx, wt.WorkspaceID)
			if err != nil {
				return err
			}
			if w != nil && (w.InstanceID == wt.instance || (w.Pending != nil && w.Pending.InstanceID == wt.instance)) {
				continue // not ended, or its end not answered yet
			}
			if w != nil && LatestInstanceID(w) == wt.instance {
				old := cloneWorkspace(w)
				w.Cleanup = &api.CleanupConclusion{InstanceID: wt.instance, NodeID: node, Unknown: true}
				if err := putWorkspace(ac, old, w); err != nil {
					return err
				}
			}
		}
		if err := owners.Delete([]byte(wt.instance)); err != nil {
			return err
		}
		if err := ac.tx.Bucket(bucketEndedWatch).Delete(endedWatchKey(node, wt.instance)); err != nil {
			return err
		}
	}
	return nil
}
