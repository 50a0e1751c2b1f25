package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kibotos/kibotos/api"
)

// gossipMeta is what every member tells the others about itself.
type gossipMeta struct {
	Roles []string `json:"r"`
	API   string   `json:"a"`
}

type gossipDelegate struct{ meta []byte }

func (d *gossipDelegate) NodeMeta(limit int) []byte                  { return d.meta }
func (d *gossipDelegate) NotifyMsg([]byte)                           {}
func (d *gossipDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *gossipDelegate) LocalState(join bool) []byte                { return nil }
func (d *gossipDelegate) MergeRemoteState(buf []byte, join bool)     {}

// GossipAddr is the gossip address of a member: its API port + 1 (TCP and
// UDP), on the same host.
func GossipAddr(apiAddr string) (string, error) {
	host, port, err := net.SplitHostPort(apiAddr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1)), nil
}

// quietLog drops memberlist's debug chatter and keeps warnings and errors.
type quietLog struct{ w io.Writer }

func (q quietLog) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("[DEBUG]")) || bytes.Contains(p, []byte("[INFO]")) {
		return len(p), nil
	}
	return q.w.Write(p)
}

func (s *Server) startGossip() error {
	gaddr, err := GossipAddr(s.id.Advertise)
	if err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(gaddr)
	p, _ := strconv.Atoi(port)
	bindHost := host
	if s.cfg.Bind != "" {
		bindHost, _, _ = net.SplitHostPort(s.cfg.Bind)
	}
	meta, _ := json.Marshal(gossipMeta{Roles: s.id.Roles, API: s.id.Advertise})
	c := memberlist.DefaultLANConfig()
	if s.cfg.Timings.SessionPing < time.Second {
		c = memberlist.DefaultLocalConfig()
	}
	c.Name = s.id.NodeID
	c.BindAddr, c.BindPort = bindHost, p
	c.AdvertiseAddr, c.AdvertisePort = host, p
	c.Delegate = &gossipDelegate{meta: meta}
	c.Logger = log.New(quietLog{w: slogWriter{s.log.With("component", "gossip")}}, "", 0)
	if len(s.id.GossipKey) > 0 {
		c.SecretKey = s.id.GossipKey
	}
	ml, err := memberlist.Create(c)
	if err != nil {
		return fmt.Errorf("gossip on %s: %w", gaddr, err)
	}
	s.gossip = ml
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.gossipJoinLoop() }()
	return nil
}

// gossipJoinLoop joins the known peers and keeps retrying while alone, so a
// member that started before the others finds them later.
func (s *Server) gossipJoinLoop() {
	for {
		if s.gossip.NumMembers() < 2 {
			var seeds []string
			for _, p := range s.knownPeers() {
				if p == s.id.Advertise {
					continue
				}
				if g, err := GossipAddr(p); err == nil {
					seeds = append(seeds, g)
				}
			}
			if len(seeds) > 0 {
				s.gossip.Join(seeds)
			}
		}
		select {
		case <-s.stop:
			return
		case <-time.After(2 * time.Second):
		}
	}
}

// knownPeers are API addresses from the identity and the Raft configuration.
func (s *Server) knownPeers() []string {
	out := append([]string(nil), s.id.Peers...)
	if s.raft != nil {
		if f := s.raft.GetConfiguration(); f.Error() == nil {
			for _, srv := range f.Configuration().Servers {
				out = append(out, string(srv.Address))
			}
		}
	}
	return out
}

// ctrlAddrs lists API addresses of ctrl members, the leader first when known.
func (s *Server) ctrlAddrs() []string {
	seen := map[string]bool{}
	var out []string
	add := func(a string) {
		if a != "" && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	add(s.leaderAddr())
	if s.gossip != nil {
		for _, m := range s.gossip.Members() {
			var gm gossipMeta
			if json.Unmarshal(m.Meta, &gm) == nil && contains(gm.Roles, api.RoleCtrl) {
				add(gm.API)
			}
		}
	}
	for _, p := range s.knownPeers() {
		add(p)
	}
	return out
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// GossipMembers returns the names of the members gossip sees alive.
func (s *Server) GossipMembers() []string {
	var out []string
	for _, m := range s.gossip.Members() {
		out = append(out, m.Name)
	}
	return out
}
