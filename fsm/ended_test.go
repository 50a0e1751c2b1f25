package fsm

import (
	"fmt"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// rounds drives node-a's report entries as a leader at LevelEndedRounds
// writes them.
type rounds struct {
	h    *harness
	base api.Report
}

// newRounds makes a harness with node-a as the only node.
func newRounds(t *testing.T) *rounds {
	h := newHarness(t)
	oneNode(h)
	return &rounds{h: h, base: api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates}}
}

// running starts a Workspace and reports its Instance in a round.
func (r *rounds) running(cmd string) api.Workspace {
	r.h.t.Helper()
	w := r.h.running(cmd, smallWS)
	r.round([]string{w.InstanceID})
	return w
}

// stoppedRecords stops n Workspaces and returns their records and ids.
func stoppedRecords(h *harness, n int) ([]api.EndedInstance, []string) {
	h.t.Helper()
	var ended []api.EndedInstance
	var ids []string
	for i := range n {
		w := h.stopped(fmt.Sprintf("c%d", i), smallWS)
		id := LatestInstanceID(&w)
		ended, ids = append(ended, endedRec(id)), append(ids, id)
	}
	return ended, ids
}

// report applies a report of node-a holding running (RUNNING); round
// marks it as the round the leader found due, with the node's records
// and whether they are all it keeps.
func (r *rounds) report(running []string, round, complete bool, ended ...api.EndedInstance) ReportResult {
	r.h.t.Helper()
	rep := r.base
	for _, id := range running {
		rep.InstanceStates = append(rep.InstanceStates, api.InstanceState{InstanceID: id, State: "RUNNING"})
	}
	if round {
		rep.Ended, rep.EndedComplete = ended, complete
	}
	return decode[ReportResult](r.h.t, r.h.ok(OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: sessOf("node-a"), Report: rep, Rounds: true, Round: round}))
}

// round is a complete round a minute after the previous one.
func (r *rounds) round(running []string, ended ...api.EndedInstance) ReportResult {
	r.h.t.Helper()
	r.h.advance(EndedRoundInterval)
	return r.report(running, true, true, ended...)
}

func endedRec(id string) api.EndedInstance {
	return api.EndedInstance{InstanceID: id, EndedAt: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC), How: "stopped"}
}

func (h *harness) owned(instance string) bool {
	h.t.Helper()
	var ok bool
	h.f.View(func(tx *bolt.Tx) error { ok = tx.Bucket(bucketInstanceOwners).Get([]byte(instance)) != nil; return nil })
	return ok
}

// A record is concluded only once its Instance's Allocation is released
// and its Workspace has no command in progress; the entry that lets the
// node delete it is the one that stored the conclusion.
func TestEndedRoundConcludesBeforeForget(t *testing.T) {
	r := newRounds(t)
	h := r.h
	w := r.running("c1")
	first := w.InstanceID

	// The stop is not answered yet: the record waits.
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if res := r.round(nil, endedRec(first)); len(res.Forget) != 0 || h.ws(w.WorkspaceID).Cleanup != nil {
		t.Fatalf("concluded while the stop is pending: forget %v, cleanup %+v", res.Forget, h.ws(w.WorkspaceID).Cleanup)
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	// Started again before the round: a command is in progress.
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if res := r.round(nil, endedRec(first)); len(res.Forget) != 0 {
		t.Fatalf("concluded while the start is pending: forget %v", res.Forget)
	}
	second := h.answer(w.WorkspaceID, OutcomeOK, "").InstanceID
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")

	// Both released, nothing pending: the latest execution's conclusion
	// is stored in the entry that names both for deletion; the older
	// record goes without replacing it.
	res := r.round(nil, endedRec(first), endedRec(second))
	if !slices.Equal(res.Forget, []string{first, second}) || len(res.Unrecognized) != 0 {
		t.Fatalf("forget %v unrecognized %v", res.Forget, res.Unrecognized)
	}
	want := api.CleanupConclusion{InstanceID: second, NodeID: "node-a", ObservedAt: endedRec(second).EndedAt, How: "stopped"}
	if got := h.ws(w.WorkspaceID).Cleanup; got == nil || *got != want {
		t.Fatalf("conclusion %+v, want %+v", got, want)
	}
	// The delete got lost (the session ended): the record comes again
	// and is deleted again, the conclusion unchanged.
	before := h.ws(w.WorkspaceID).Version
	if res := r.round(nil, endedRec(second)); !slices.Equal(res.Forget, []string{second}) || h.ws(w.WorkspaceID).Version != before {
		t.Fatalf("repeated record: forget %v, version %d → %d", res.Forget, before, h.ws(w.WorkspaceID).Version)
	}
	// Once the node's complete list no longer has them, ctrl lets go.
	r.round(nil)
	if h.owned(first) || h.owned(second) {
		t.Errorf("owners kept after the records were gone")
	}
	if got := h.ws(w.WorkspaceID).Cleanup; got == nil || *got != want {
		t.Errorf("conclusion after the records went: %+v", got)
	}
	checkIndex(t, h.f)
}

// A record whose Instance has no Allocation stays on the node: it is
// named unrecognized, never forgotten, and changes nothing.
func TestEndedRoundKeepsOwnerless(t *testing.T) {
	r := newRounds(t)
	h := r.h
	w := h.stopped("c1", smallWS)
	for range 2 {
		res := r.round(nil, endedRec("inst-not-ours"))
		if len(res.Forget) != 0 || !slices.Equal(res.Unrecognized, []string{"inst-not-ours"}) {
			t.Fatalf("forget %v unrecognized %v", res.Forget, res.Unrecognized)
		}
	}
	if h.ws(w.WorkspaceID).Cleanup != nil {
		t.Errorf("an unrecognized record was concluded on %s", w.WorkspaceID)
	}
}

// A round looks at 100 records at most; the rest wait for the next one,
// and a list cut short is not taken as complete.
func TestEndedRoundCap(t *testing.T) {
	r := newRounds(t)
	ended, ids := stoppedRecords(r.h, EndedRoundMax+1)
	res := r.round(nil, ended...)
	if !slices.Equal(res.Forget, ids[:EndedRoundMax]) {
		t.Fatalf("forget %d records, want the first %d", len(res.Forget), EndedRoundMax)
	}
	res = r.round(nil, ended[EndedRoundMax:]...)
	if !slices.Equal(res.Forget, ids[EndedRoundMax:]) {
		t.Fatalf("next round: forget %v", res.Forget)
	}
}

// Rounds of a node are a minute apart by entry time: a report marked as
// a round sooner (a leader whose clock is behind) concludes nothing.
func TestEndedRoundOncePerMinute(t *testing.T) {
	r := newRounds(t)
	h := r.h
	r.round(nil)
	last := h.now
	w := h.stopped("c1", smallWS)
	id := LatestInstanceID(&w)
	h.now = last.Add(EndedRoundInterval - time.Second)
	if res := r.report(nil, true, true, endedRec(id)); len(res.Forget) != 0 || h.ws(w.WorkspaceID).Cleanup != nil {
		t.Fatalf("a second round within the minute: forget %v", res.Forget)
	}
	h.advance(time.Second)
	if res := r.report(nil, true, true, endedRec(id)); !slices.Equal(res.Forget, []string{id}) || h.ws(w.WorkspaceID).Cleanup == nil {
		t.Fatalf("the round a minute later: forget %v", res.Forget)
	}
}

// A record deleted before its conclusion was stored: once the Instance
// the node reported holding is released and a complete list lacks its
// record, the conclusion is stored as unknown. An incomplete list, or an
// Instance still current, proves nothing.
func TestEndedRoundDeletedRecordUnknown(t *testing.T) {
	r := newRounds(t)
	h := r.h
	w := r.running("c1")
	id := w.InstanceID
	if res := r.round(nil); h.ws(w.WorkspaceID).Cleanup != nil || len(res.Forget) != 0 {
		t.Fatalf("a running Instance missing from the list was concluded: %+v", h.ws(w.WorkspaceID).Cleanup)
	}
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	r.round(nil) // still pending
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.advance(EndedRoundInterval)
	r.report(nil, true, false) // over 100 records: not complete
	if c := h.ws(w.WorkspaceID).Cleanup; c != nil {
		t.Fatalf("concluded from an incomplete list: %+v", c)
	}
	r.round(nil)
	want := api.CleanupConclusion{InstanceID: id, NodeID: "node-a", Unknown: true}
	if c := h.ws(w.WorkspaceID).Cleanup; c == nil || *c != want {
		t.Fatalf("conclusion %+v, want %+v", c, want)
	}
	if h.owned(id) {
		t.Errorf("owner of %s kept", id)
	}
	// The record turning up later is not recognized any more: it stays.
	if res := r.round(nil, endedRec(id)); len(res.Forget) != 0 || !slices.Equal(res.Unrecognized, []string{id}) {
		t.Errorf("late record: forget %v unrecognized %v", res.Forget, res.Unrecognized)
	}
	checkIndex(t, h.f)
}

// Report entries without Rounds (logs written before LevelEndedRounds,
// or by a leader with an older voter) apply as they always did: every
// record at once, whatever the minute and however many, records of
// Instances ctrl never placed forgotten too, and no round is recorded.
func TestEndedRecordsOldEntries(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	ended, ids := stoppedRecords(h, EndedRoundMax+1)
	ended = append(ended, endedRec("inst-not-ours"))
	ids = append(ids, "inst-not-ours")
	old := api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates, Ended: ended}
	for range 2 { // twice within a second: no minute between
		h.advance(time.Second)
		res := decode[ReportResult](t, h.ok(OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: sessOf("node-a"), Report: old}))
		if !slices.Equal(res.Forget, ids) || res.Unrecognized != nil {
			t.Fatalf("forget %d of %d records, unrecognized %v", len(res.Forget), len(ids), res.Unrecognized)
		}
	}
	if w := h.ws(WorkspaceIDFor("c0")); w.Cleanup == nil || w.Cleanup.InstanceID != ids[0] {
		t.Errorf("conclusion %+v", w.Cleanup)
	}
	h.f.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketEndedRounds, bucketEndedWatch, bucketInstanceOwners} {
			if k, _ := tx.Bucket(b).Cursor().First(); k != nil {
				t.Errorf("bucket %s holds %q after old-format reports", b, k)
			}
		}
		return nil
	})
}
