package clusterlab

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/testenv"
)

// Cluster is the lab with members on its hosts.
type Cluster struct {
	*Lab
	Ctrls []*Host // ctrl,node members; ctrls[0] created the cluster
	Node  *Host   // the node-only member
}

// NodeView is the part of `kibo node get --json` the test looks at.
type NodeView struct {
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

// WaitNode polls node id through h until cond holds.
func WaitNode(t *testing.T, h *Host, id string, d time.Duration, what string, cond func(NodeView) bool) NodeView {
	t.Helper()
	var got NodeView
	testenv.WaitFor(t, d, fmt.Sprintf("node %s %s (read through %s)", id, what, h.NodeID), func() (bool, string) {
		n, err := h.GetNode(id, "--consistent")
		if err != nil {
			return false, err.Error()
		}
		got = n
		return cond(n), n.String()
	})
	return got
}

type RaftStatus struct {
	NodeID    string `json:"node_id"`
	RaftState string `json:"raft_state"`
	Leader    string `json:"leader"`
}

// Form creates the cluster on the first host and enrolls the others
// with grants, one at a time: a ctrl member becomes a voter when it first
// serves, so each waits until the leader replicates to it. The first three
// hosts are ctrl members, a fourth one is node-only.
func Form(t *testing.T, l *Lab) *Cluster {
	return FormServing(t, l, func(h *Host) { h.StartServe() })
}

// FormServing is formCluster with serve starting each member once
// its data directory exists (to give one what it needs to run VMs).
func FormServing(t *testing.T, l *Lab, serve func(h *Host)) *Cluster {
	c := &Cluster{Lab: l}
	for i, h := range l.Hosts {
		if i < 3 {
			h.NodeID, h.Roles = fmt.Sprintf("ctrl%d", i+1), "ctrl,node"
			c.Ctrls = append(c.Ctrls, h)
		} else {
			h.NodeID, h.Roles = fmt.Sprintf("node%d", i+1), "node"
			c.Node = h
		}
	}
	first := c.Ctrls[0]
	if r := first.Kibotos("init", "--data-dir", first.DataDir, "--advertise", first.Addr(), "--node-id", first.NodeID, "--roles", first.Roles); r.Code != 0 {
		t.Fatal(r)
	}
	serve(first)
	c.WaitFollowsLeader(t, first)
	for _, h := range l.Hosts[1:] {
		grant := first.Kibo("enrollment", "grant", h.NodeID, "--roles", h.Roles)
		if grant.Code != 0 {
			t.Fatal(grant)
		}
		token := strings.TrimSpace(grant.Stdout)
		if r := h.Kibotos("join", "--data-dir", h.DataDir, "--advertise", h.Addr(), "--grant", token, first.Addr()); r.Code != 0 {
			t.Fatal(r)
		}
		serve(h)
		if strings.Contains(h.Roles, "ctrl") {
			c.WaitFollowsLeader(t, h)
			continue
		}
		// A node-only host holds no operator credential: its CLI
		// uses one issued to a person, as an operator would bring.
		creds := h.DataDir + "-operator"
		if r := first.Kibo("operator", "issue", "e2e-"+h.NodeID, "--out", creds); r.Code != 0 {
			t.Fatal(r)
		}
		h.Creds = creds
	}
	n := len(l.Hosts)
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("%d READY nodes in node list", n), func() (bool, string) {
		var list struct {
			Nodes []NodeView `json:"nodes"`
		}
		if err := l.Hosts[n-1].KiboJSON(&list, "node", "list"); err != nil {
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

func (n NodeView) String() string {
	s := fmt.Sprintf("%s status=%s drain_requested=%v isolated=%v version=%d", n.NodeID, n.Status, n.DrainRequested, n.Isolated, n.RegistrationVersion)
	if n.Session != nil {
		s += fmt.Sprintf(" session{incarnation=%d alive=%v}", n.Session.Incarnation, n.Session.Alive)
	}
	return s
}

// GetNode reads one node through the member of h.
func (h *Host) GetNode(id string, extra ...string) (NodeView, error) {
	var n NodeView
	err := h.KiboJSON(&n, append([]string{"node", "get", id}, extra...)...)
	return n, err
}

// WaitFollowsLeader waits until the ctrl member on h knows a leader: a
// member hears from the leader only once it is in the Raft configuration.
func (c *Cluster) WaitFollowsLeader(t *testing.T, h *Host) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, h.NodeID+" to see a ctrl leader", func() (bool, string) {
		var st RaftStatus
		if err := h.KiboJSON(&st, "status"); err != nil {
			return false, err.Error()
		}
		return st.Leader != "" && (st.RaftState == "Leader" || st.RaftState == "Follower"), fmt.Sprintf("%+v", st)
	})
}

// Leader asks the running ctrl members who leads and returns that host.
func (c *Cluster) Leader(t *testing.T) *Host {
	t.Helper()
	var found *Host
	testenv.WaitFor(t, 10*time.Second, "a ctrl leader", func() (bool, string) {
		var seen []string
		for _, h := range c.Ctrls {
			var st RaftStatus
			if err := h.KiboJSON(&st, "status"); err != nil {
				seen = append(seen, err.Error())
				continue
			}
			for _, cand := range c.Ctrls {
				if cand.Addr() == st.Leader {
					found = cand
					return true, ""
				}
			}
			seen = append(seen, fmt.Sprintf("%s: %+v", h.NodeID, st))
		}
		return false, strings.Join(seen, "; ")
	})
	return found
}

// WaitLeaderOtherThan waits until a running ctrl member other than
// stopped reports a leader that is not stopped.
func (c *Cluster) WaitLeaderOtherThan(t *testing.T, stopped *Host) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, "a ctrl leader other than "+stopped.NodeID, func() (bool, string) {
		var seen []string
		for _, h := range c.Ctrls {
			if h == stopped {
				continue
			}
			var st RaftStatus
			if err := h.KiboJSON(&st, "status"); err != nil {
				seen = append(seen, err.Error())
				continue
			}
			if st.Leader != "" && st.Leader != stopped.Addr() {
				return true, ""
			}
			seen = append(seen, fmt.Sprintf("%s: %+v", h.NodeID, st))
		}
		return false, strings.Join(seen, "; ")
	})
}
