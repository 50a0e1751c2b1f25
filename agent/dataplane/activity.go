package dataplane

// Per-Instance activity, for the node's idle measure (agent/idle.go): how
// many client connections are bound to each Instance now, and how many
// were ever bound to it by this process, so a connection that came and
// went between two of the node's looks still counts as use.

// InstanceConns is one Instance's connections in one process.
type InstanceConns struct {
	// Open are the connections bound to it now.
	Open int `json:"open,omitempty"`
	// Bound counts the connections bound to it since this process
	// started (or since it was last a target): it only grows while the
	// Instance stays a target.
	Bound uint64 `json:"bound"`
}

// noteBound counts a connection bound to instance (mu held).
func (s *Server) noteBound(instance string) {
	if s.bound == nil {
		s.bound = map[string]uint64{}
	}
	s.bound[instance]++
}

// forgetBound drops the counts of Instances that are no longer targets
// and have no connection left (mu held), so the map follows the targets.
func (s *Server) forgetBound(sockets map[string]string) {
	for id := range s.bound {
		if _, ok := sockets[id]; ok {
			continue
		}
		if bound, _ := s.connsOf(id); bound == 0 {
			delete(s.bound, id)
		}
	}
}

// activityLocked is every Instance's connections in this process (mu
// held).
func (s *Server) activityLocked() map[string]InstanceConns {
	if len(s.bound) == 0 {
		return nil
	}
	out := make(map[string]InstanceConns, len(s.bound))
	for id, n := range s.bound {
		out[id] = InstanceConns{Bound: n}
	}
	for c := range s.conns {
		if a, ok := out[c.instanceID]; ok {
			a.Open++
			out[c.instanceID] = a
		}
	}
	return out
}
