package fsm

import (
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func withPlacementCounts() entryOpt { return func(e *Entry) { e.CountPlacements = true } }

func (h *harness) placements() PlacementCounts {
	h.t.Helper()
	var c PlacementCounts
	if err := h.f.View(func(tx *bolt.Tx) (err error) { c, err = placementCounts(tx); return }); err != nil {
		h.t.Fatalf("placement counts: %v", err)
	}
	return c
}

// applyCode applies one entry and checks its code ("" = success), like
// expect but without its "a rejection changes nothing": a counted
// refusal changes the counts.
func (h *harness) applyCode(code api.Code, op string, args any, opts ...entryOpt) Result {
	h.t.Helper()
	h.advance(time.Second)
	r := h.apply(h.entry(op, args, opts...))[0]
	if got := resultCode(r); got != code {
		h.t.Fatalf("%s: code %q (%v), want %q", op, got, r.Error, code)
	}
	return r
}

func TestPlacementCounts(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	want := PlacementCounts{Refusals: map[string]uint64{}}
	check := func(step string) {
		t.Helper()
		if got := h.placements(); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: counts %+v, want %+v", step, got, want)
		}
	}
	huge := wsArgs(64000, gib)

	// Without the flag (an entry of a leader not every voter counts for)
	// nothing counts, placed or refused.
	h.create("plain", smallWS)
	h.applyCode(api.CodeResourceExhausted, OpWorkspaceCreate, huge, withCommand("plain-huge"))
	check("entries without the flag")

	h.advance(time.Second)
	w := decode[api.Workspace](t, h.applyCode("", OpWorkspaceCreate, smallWS, withCommand("c1"), withPlacementCounts()))
	want.Placed = 1
	check("a create placed")

	// Its replay decides nothing again.
	h.applyCode("", OpWorkspaceCreate, smallWS, withCommand("c1"), withPlacementCounts())
	check("a replay")

	// A rejected create counts its refusal: every reason once, however
	// many nodes it kept out (both nodes lack CPU; ctrl-1 has no session).
	h.applyCode(api.CodeResourceExhausted, OpWorkspaceCreate, huge, withCommand("c2"), withPlacementCounts())
	want.Refused = 1
	want.Refusals["not enough CPU"] = 1
	want.Refusals["not ready"] = 1
	check("a refused create")

	// Drain the node c1 is not on.
	other := map[string]string{"node-a": "node-b", "node-b": "node-a"}[w.NodeID]
	h.ok(OpNodeDrain, NodeArgs{NodeID: other})
	pinned := smallWS
	pinned.NodeID = other
	h.applyCode(api.CodeFailedPrecondition, OpWorkspaceCreate, pinned, withCommand("c3"), withPlacementCounts())
	want.Refused = 2
	want.Refusals["drained"] = 1
	check("a create pinned to a drained node")

	// c1's node refuses the start and the other is drained: the
	// re-placement the accepted result makes is refused and the Workspace
	// FAILED.
	args := h.resultArgs(w.WorkspaceID, OutcomeRefused, "memory tight")
	h.applyCode("", OpWorkspaceResult, args, withPlacementCounts())
	if got := h.ws(w.WorkspaceID); got.State != api.WorkspaceFailed {
		t.Fatalf("after %s refused with %s drained: %+v", w.NodeID, other, got)
	}
	want.Refused = 3
	want.Refusals["drained"] = 2
	want.Refusals["refused this placement"] = 1
	want.Refusals["not ready"] = 2
	check("a re-placement refused")

	if err := h.f.View(func(tx *bolt.Tx) error {
		s, err := Summarize(tx)
		if err == nil && !reflect.DeepEqual(s.Placements, want) {
			t.Errorf("Summarize placements %+v, want %+v", s.Placements, want)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}
