package egress

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync/atomic"
)

// Connections by guest: the process counts each routed guest's TCP
// connections apart, for as long as the node's Config routes that guest,
// so the figures are bounded by the node's Instances. A guest dropped from
// the Config loses its counts; routed again later, it starts from zero.
// Sources without a route count only in the totals (Stats).
//
// The node asks with its own request (opGuestStats), which a process of
// an earlier build refuses without harm: the Stats reply and the Config
// stay as every build decodes them.

// GuestStats are one guest's connection counters (see Stats).
type GuestStats struct {
	Guest    netip.Addr `json:"guest"`
	Accepted uint64     `json:"accepted"`
	Refused  uint64     `json:"refused"`
	Failed   uint64     `json:"failed"`
	Closed   uint64     `json:"closed"`
}

// add adds o's counters to g's.
func (g *GuestStats) add(o GuestStats) {
	g.Accepted += o.Accepted
	g.Refused += o.Refused
	g.Failed += o.Failed
	g.Closed += o.Closed
}

// guestCount is a routed guest's live counters, by outcome; nil counts
// nothing.
type guestCount [4]atomic.Uint64

// Outcomes of a guest connection, as in Stats.
const (
	outAccepted = iota
	outRefused
	outFailed
	outClosed
)

func (g *guestCount) inc(outcome int) {
	if g != nil {
		g[outcome].Add(1)
	}
}

// countGuests gives every route of t its guest's counters, keeping those
// of guests s counted already (mu held); the others are forgotten.
func (s *Server) countGuests(t *table) {
	next := make(map[netip.Addr]*guestCount, len(t.routes))
	for a, rt := range t.routes {
		g := s.guests[a]
		if g == nil {
			g = &guestCount{}
		}
		next[a], rt.count = g, g
		t.routes[a] = rt
	}
	s.guests = next
}

// GuestStats are the counters of the guests the Config routes (the last
// Config while draining), by address.
func (s *Server) GuestStats() []GuestStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]GuestStats, 0, len(s.guests))
	for a, g := range s.guests {
		out = append(out, GuestStats{Guest: a, Accepted: g[outAccepted].Load(), Refused: g[outRefused].Load(), Failed: g[outFailed].Load(), Closed: g[outClosed].Load()})
	}
	slices.SortFunc(out, func(a, b GuestStats) int { return a.Guest.Compare(b.Guest) })
	return out
}

// GuestStats returns the process's counters by guest; a process of a
// build before them refuses the request.
func (c *Client) GuestStats(ctx context.Context) ([]GuestStats, error) {
	rep, _, err := c.call(ctx, request{Op: opGuestStats})
	if err == nil && rep.Guests == nil {
		err = errors.New("guest stats reply without guests")
	}
	if err != nil {
		return nil, c.wrap("guest stats", err)
	}
	return *rep.Guests, nil
}
