package cluster

import (
	"net"
	"net/netip"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// checkAdvertiseHost refuses a joining node's advertise host when it is
// another member's (advertiseHostProblem), reading the nodes on the
// leader.
func (s *Server) checkAdvertiseHost(nodeID, host string) error {
	var nodes *api.NodeList
	if err := s.fsm.View(func(tx *bolt.Tx) (err error) { nodes, err = fsm.ListNodes(tx, 0, ""); return err }); err != nil {
		return err
	}
	leaderHost, _, _ := net.SplitHostPort(s.id.Advertise)
	return advertiseHostProblem(nodeID, host, leaderHost, nodes.Nodes)
}

// advertiseHostProblem says why node nodeID may not advertise host: the
// host goes into the member certificate signed at join, and a client
// that dials it would then accept either member. A loopback host
// (members on one machine: kibotos dev, tests) is taken only in a cluster
// whose leader advertises one too; a cluster across hosts reaches no
// member at a loopback address, so there it can only be a claim on
// somebody else's. Retired and revoked nodes, and the node's own earlier
// admission, hold no host.
func advertiseHostProblem(nodeID, host, leaderHost string, nodes []api.Node) error {
	if isLoopbackHost(host) {
		if !isLoopbackHost(leaderHost) {
			return api.Errorf(api.CodeInvalidArgument, "join of node %s: advertise host %s is a loopback address, which members on other hosts cannot reach (the leader advertises %s): give the address other members reach this host at", nodeID, api.EscapeText(host), api.EscapeText(leaderHost))
		}
		return nil
	}
	for _, n := range nodes {
		if n.NodeID == nodeID || n.Status == api.NodeRetired || n.Status == api.NodeRevoked {
			continue
		}
		if other, _, err := net.SplitHostPort(n.Address); err == nil && sameHost(other, host) {
			return api.Errorf(api.CodeAlreadyExists, "join of node %s: host %s is the advertise host of node %s already; each member advertises its own host: give this host's own address, or retire node %s first", nodeID, api.EscapeText(host), n.NodeID, n.NodeID)
		}
	}
	return nil
}

// sameHost compares hosts as a client dialling them would: IP addresses
// by value, DNS names without case or a final dot.
func sameHost(a, b string) bool {
	ia, errA := netip.ParseAddr(a)
	ib, errB := netip.ParseAddr(b)
	if errA == nil || errB == nil {
		return errA == nil && errB == nil && ia.Unmap() == ib.Unmap()
	}
	return strings.EqualFold(strings.TrimSuffix(a, "."), strings.TrimSuffix(b, "."))
}

// isLoopbackHost: a loopback IP address, or localhost and its subdomains
// (RFC 6761), which resolvers answer with one.
func isLoopbackHost(h string) bool {
	if ip, err := netip.ParseAddr(h); err == nil {
		return ip.Unmap().IsLoopback()
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	return h == "localhost" || strings.HasSuffix(h, ".localhost")
}
