package fsm

import (
	"testing"
	"time"
)

// The placement cache refreshes only the nodes a batch changed. A node that
// loses the node role within the batch (revoked, granted again as ctrl only
// and re-admitted) must drop out of the candidate list: its refreshed view
// is nil, and the batch must neither crash nor place on it.
func TestPlaceCacheNodeLosesNodeRoleInBatch(t *testing.T) {
	cases := []struct {
		name string
		// batch splits the sequence: true applies it as one batch (the
		// cache's changed-node path), false one entry per batch.
		batch bool
	}{
		{"one batch", true},
		{"one entry per batch", false},
	}
	var dumps []string
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			twoNodes(h)
			h.advance(time.Second)
			seq := []Entry{
				// Builds the batch's candidate list with node-a and node-b.
				h.entry(OpWorkspaceCreate, smallWS, withCommand("ws-1")),
				h.entry(OpEnrollmentRevoke, NodeArgs{NodeID: "node-b"}),
				h.entry(OpEnrollmentGrant, GrantArgs{NodeID: "node-b", Roles: []string{"ctrl"}, SecretHash: secretOf("node-b"), TTL: time.Hour}),
				h.entry(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-b", SecretHash: secretOf("node-b"), Address: "addr-node-b"}),
				// node-b is changed and no longer a candidate.
				h.entry(OpWorkspaceCreate, wsArgs(1000, gib), withCommand("ws-2")),
				h.entry(OpWorkspaceCreate, wsArgs(1000, gib), withCommand("ws-3")),
			}
			var rs []Result
			if tc.batch {
				rs = h.f.Apply(seq)
			} else {
				for _, e := range seq {
					rs = append(rs, h.f.Apply([]Entry{e})...)
				}
			}
			for i, r := range rs {
				if r.Error != nil {
					t.Fatalf("entry %d %s: %v", i, seq[i].Op, r.Error)
				}
			}
			if n := h.node("node-b"); n.HasRole("node") {
				t.Fatalf("node-b roles %v, want ctrl only", n.Roles)
			}
			for _, cmd := range []string{"ws-2", "ws-3"} {
				if w := h.ws(WorkspaceIDFor(cmd)); w.NodeID != "node-a" {
					t.Errorf("%s placed on %q, want node-a (node-b has no node role)", cmd, w.NodeID)
				}
			}
			dumps = append(dumps, h.dump())
		})
	}
	if len(dumps) == 2 && dumps[0] != dumps[1] {
		t.Errorf("one batch and one entry per batch disagree:\n%s", diffLines(dumps[1], dumps[0]))
	}
}
