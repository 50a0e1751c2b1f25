package cluster_test

import (
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/internal/testenv"
)

// Every goroutine a member starts is waited for by what started it: once
// the members stopped, none of theirs runs on (a lead loop of a member
// that stopped leading, a session handler, a connection's handshake).
func TestStoppedMembersLeaveNoGoroutines(t *testing.T) {
	before := testenv.LiveGoroutines()
	c := clustertest.New(t, clustertest.Options{Ctrl: 3, NodeOnly: 1})
	leader := c.WaitLeader()
	// A write forwarded from a follower, and control sessions of every
	// node (the drained node's ends in the middle of its work).
	for _, m := range c.Members {
		if m != leader && m.Server.Raft() != nil {
			var n api.Node
			if _, err := c.Client(m).Do(t.Context(), "POST", "/v1/nodes/node-4/drain", api.NodeWriteRequest{}, &n); err != nil {
				t.Fatalf("drain node-4 through %s: %v", m.ID, err)
			}
			break
		}
	}
	for _, m := range c.Members {
		m.Stop()
	}
	testenv.WaitGoroutinesEnd(t, before, "github.com/kibotos/kibotos/", 5*time.Second)
}
