package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// When an API key was last used (api-key list's LAST USED) is recorded
// in the state, not per member: each ctrl member notes the keys it
// authenticated and, every keyUseFlush, sends the leader their ids in
// one write. A key is noted only when its record says it was last used
// more than keyUseGrain ago, so a busy key costs one write a minute, not
// one per request. The time recorded is the write's entry time: at most
// keyUseFlush after the use.
const (
	keyUseFlush = 15 * time.Second
	keyUseGrain = time.Minute
)

// keyUses are the ids of keys used since the last flush.
type keyUses struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

// note records a use of key id unless its record is recent enough.
func (u *keyUses) note(id string, last *time.Time, now time.Time) {
	if last != nil && now.Sub(*last) < keyUseGrain {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ids == nil {
		u.ids = map[string]struct{}{}
	}
	if len(u.ids) < fsm.MaxKeyUses {
		u.ids[id] = struct{}{}
	}
}

// take returns the noted ids, sorted, and forgets them.
func (u *keyUses) take() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]string, 0, len(u.ids))
	for id := range u.ids {
		out = append(out, id)
	}
	u.ids = nil
	slices.Sort(out)
	return out
}

// recordKeyUses flushes the noted key uses until the member stops (ctrl
// members).
func (s *Server) recordKeyUses() {
	t := time.NewTicker(cmp.Or(s.cfg.Timings.KeyUseFlush, keyUseFlush))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ids := s.keyUses.take()
		if len(ids) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.sendKeyUses(ctx, ids); err != nil {
			// Lost uses only make LAST USED older; the next use notes
			// the key again.
			s.log.Debug("API key uses not recorded", "keys", len(ids), "err", err)
		}
		cancel()
	}
}

func (s *Server) sendKeyUses(ctx context.Context, ids []string) error {
	args := fsm.APIKeyUsedArgs{KeyIDs: ids}
	if s.IsLeader() {
		raw, err := json.Marshal(args)
		if err != nil {
			return err
		}
		_, err = s.Apply(ctx, fsm.Entry{Op: fsm.OpAPIKeyUsed, Args: raw, Actor: "member:" + s.id.NodeID, IgnoreUnknown: true})
		return err
	}
	leader := s.leaderAddr()
	if leader == "" {
		return api.Errorf(api.CodeUnavailable, "no ctrl leader is known")
	}
	body, err := json.Marshal(args)
	if err != nil {
		return err
	}
	return memberCall(ctx, s.memberClient(), leader, keyUsesPath, body, nil)
}

const keyUsesPath = "/v1/internal/api-keys/used"

// handleKeyUses records the uses another ctrl member noted.
func (s *Server) handleKeyUses(r *http.Request, req fsm.APIKeyUsedArgs) response {
	if len(req.KeyIDs) > fsm.MaxKeyUses {
		return fail(api.Errorf(api.CodeInvalidArgument, "%d key uses in one call: send at most %d", len(req.KeyIDs), fsm.MaxKeyUses))
	}
	raw, err := json.Marshal(req)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	res, err := s.Apply(ctx, fsm.Entry{Op: fsm.OpAPIKeyUsed, Args: raw, Actor: callerOf(r).name, IgnoreUnknown: true})
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		return fail(err)
	}
	return answer(map[string]int{"recorded": len(req.KeyIDs)})
}

// refusalCounts count the quota refusals of the writes this member led,
// by namespace and quota (kibotos_namespace_quota_refusals_total).
type refusalCounts struct {
	mu sync.Mutex
	n  map[[2]string]uint64
}

// note counts err if it is a quota refusal.
func (c *refusalCounts) note(err error) {
	ns, quota, ok := fsm.QuotaRefusal(err)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[[2]string]uint64{}
	}
	c.n[[2]string{ns, quota}]++
}

// QuotaRefusals are the quota refusals of the writes this member led, by
// namespace and quota.
func (s *Server) QuotaRefusals() map[[2]string]uint64 {
	s.quotaRefusals.mu.Lock()
	defer s.quotaRefusals.mu.Unlock()
	out := make(map[[2]string]uint64, len(s.quotaRefusals.n))
	for k, v := range s.quotaRefusals.n {
		out[k] = v
	}
	return out
}
