package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/testenv"
)

// TestCluster runs one cluster of real processes, one per network
// namespace: three ctrl voters (ctrl,node) and one node-only member. The
// subtests share it and run in order, each leaving the cluster healthy.
func TestCluster(t *testing.T) {
	l := newLab(t, 4)
	c := formCluster(t, l)

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

// cluster is the lab with members on its hosts.
type cluster struct {
	*lab
	ctrls []*host // ctrl,node members; ctrls[0] created the cluster
	node  *host   // the node-only member
}

// nodeView is the part of `kibo node get --json` the test looks at.
type nodeView struct {
	NodeID              string `json:"node_id"`
	Status              string `json:"status"`
	RegistrationVersion uint64 `json:"registration_version"`
	DrainRequested      bool   `json:"drain_requested"`
	Isolated            bool   `json:"isolated"`
	Session             *struct {
		Incarnation uint64 `json:"incarnation"`
		SessionID   string `json:"session_id"`
		Alive       bool   `json:"alive"`
	} `json:"session"`
	Overcommit *struct {
		CPU api.Milli `json:"cpu"`
	} `json:"overcommit"`
}

func (n nodeView) String() string {
	s := fmt.Sprintf("%s status=%s drain_requested=%v isolated=%v version=%d", n.NodeID, n.Status, n.DrainRequested, n.Isolated, n.RegistrationVersion)
	if n.Session != nil {
		s += fmt.Sprintf(" session{incarnation=%d alive=%v}", n.Session.Incarnation, n.Session.Alive)
	}
	return s
}

// getNode reads one node through the member of h.
func (h *host) getNode(id string, extra ...string) (nodeView, error) {
	var n nodeView
	err := h.kiboJSON(&n, append([]string{"node", "get", id}, extra...)...)
	return n, err
}

// waitNode polls node id through h until cond holds.
func waitNode(t *testing.T, h *host, id string, d time.Duration, what string, cond func(nodeView) bool) nodeView {
	t.Helper()
	var got nodeView
	testenv.WaitFor(t, d, fmt.Sprintf("node %s %s (read through %s)", id, what, h.nodeID), func() (bool, string) {
		n, err := h.getNode(id, "--consistent")
		if err != nil {
			return false, err.Error()
		}
		got = n
		return cond(n), n.String()
	})
	return got
}

type status struct {
	NodeID    string `json:"node_id"`
	RaftState string `json:"raft_state"`
	Leader    string `json:"leader"`
}

// formCluster creates the cluster on the first host and enrolls the others
// with grants, one at a time: a ctrl member becomes a voter when it first
// serves, so each waits until the leader replicates to it. The first three
// hosts are ctrl members, a fourth one is node-only.
func formCluster(t *testing.T, l *lab) *cluster {
	return formClusterServing(t, l, func(h *host) { h.startServe() })
}

// formClusterServing is formCluster with serve starting each member once
// its data directory exists (to give one what it needs to run VMs).
func formClusterServing(t *testing.T, l *lab, serve func(h *host)) *cluster {
	c := &cluster{lab: l}
	for i, h := range l.hosts {
		if i < 3 {
			h.nodeID, h.roles = fmt.Sprintf("ctrl%d", i+1), "ctrl,node"
			c.ctrls = append(c.ctrls, h)
		} else {
			h.nodeID, h.roles = fmt.Sprintf("node%d", i+1), "node"
			c.node = h
		}
	}
	first := c.ctrls[0]
	if r := first.kibotos("init", "--data-dir", first.dataDir, "--advertise", first.addr(), "--node-id", first.nodeID, "--roles", first.roles); r.code != 0 {
		t.Fatal(r)
	}
	serve(first)
	c.waitFollowsLeader(t, first)
	for _, h := range l.hosts[1:] {
		grant := first.kibo("enrollment", "grant", h.nodeID, "--roles", h.roles)
		if grant.code != 0 {
			t.Fatal(grant)
		}
		token := strings.TrimSpace(grant.stdout)
		if r := h.kibotos("join", "--data-dir", h.dataDir, "--advertise", h.addr(), "--grant", token, first.addr()); r.code != 0 {
			t.Fatal(r)
		}
		serve(h)
		if strings.Contains(h.roles, "ctrl") {
			c.waitFollowsLeader(t, h)
			continue
		}
		// A node-only host holds no operator credential: its CLI
		// uses one issued to a person, as an operator would bring.
		creds := h.dataDir + "-operator"
		if r := first.kibo("operator", "issue", "e2e-"+h.nodeID, "--out", creds); r.code != 0 {
			t.Fatal(r)
		}
		h.creds = creds
	}
	n := len(l.hosts)
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("%d READY nodes in node list", n), func() (bool, string) {
		var list struct {
			Nodes []nodeView `json:"nodes"`
		}
		if err := l.hosts[n-1].kiboJSON(&list, "node", "list"); err != nil {
			return false, err.Error()
		}
		ready := 0
		var seen []string
		for _, n := range list.Nodes {
			seen = append(seen, n.NodeID+"="+n.Status)
			if n.Status == api.NodeReady {
				ready++
			}
		}
		return ready == n && len(list.Nodes) == n, strings.Join(seen, " ")
	})
	return c
}

// waitFollowsLeader waits until the ctrl member on h knows a leader: a
// member hears from the leader only once it is in the Raft configuration.
func (c *cluster) waitFollowsLeader(t *testing.T, h *host) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, h.nodeID+" to see a ctrl leader", func() (bool, string) {
		var st status
		if err := h.kiboJSON(&st, "status"); err != nil {
			return false, err.Error()
		}
		return st.Leader != "" && (st.RaftState == "Leader" || st.RaftState == "Follower"), fmt.Sprintf("%+v", st)
	})
}

// leader asks the running ctrl members who leads and returns that host.
func (c *cluster) leader(t *testing.T) *host {
	t.Helper()
	var found *host
	testenv.WaitFor(t, 10*time.Second, "a ctrl leader", func() (bool, string) {
		var seen []string
		for _, h := range c.ctrls {
			var st status
			if err := h.kiboJSON(&st, "status"); err != nil {
				seen = append(seen, err.Error())
				continue
			}
			for _, cand := range c.ctrls {
				if cand.addr() == st.Leader {
					found = cand
					return true, ""
				}
			}
			seen = append(seen, fmt.Sprintf("%s: %+v", h.nodeID, st))
		}
		return false, strings.Join(seen, "; ")
	})
	return found
}

// waitLeaderOtherThan waits until a running ctrl member other than
// stopped reports a leader that is not stopped.
func (c *cluster) waitLeaderOtherThan(t *testing.T, stopped *host) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, "a ctrl leader other than "+stopped.nodeID, func() (bool, string) {
		var seen []string
		for _, h := range c.ctrls {
			if h == stopped {
				continue
			}
			var st status
			if err := h.kiboJSON(&st, "status"); err != nil {
				seen = append(seen, err.Error())
				continue
			}
			if st.Leader != "" && st.Leader != stopped.addr() {
				return true, ""
			}
			seen = append(seen, fmt.Sprintf("%s: %+v", h.nodeID, st))
		}
		return false, strings.Join(seen, "; ")
	})
}
