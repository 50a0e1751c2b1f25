package e2e

import (
	"testing"

	"github.com/kibotos/kibotos/internal/clusterlab"
)

// TestCluster runs one cluster of real processes, one per network
// namespace: three ctrl voters (ctrl,node) and one node-only member. The
// subtests share it and run in order, each leaving the cluster healthy.
func TestCluster(t *testing.T) {
	l := clusterlab.New(t, 4)
	c := clusterlab.Form(t, l)

	t.Run("DrainFromNodeOnlyMember", func(t *testing.T) { testDrain(t, c) })
	if t.Failed() {
		return
	}
	t.Run("LinearizableAcrossLeaderKill", func(t *testing.T) { testLinearizable(t, c) })
	if t.Failed() {
		return
	}
	t.Run("IsolateAfterPartition", func(t *testing.T) { testIsolate(t, c) })
}
