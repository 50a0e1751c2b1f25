package agent

import (
	"sync"

	"github.com/kibotos/kibotos/api"
)

// maxEndedReported is the most ended-Instance records one report carries:
// ctrl looks at no more in a round.
const maxEndedReported = 100

// endedRecords is what the node tells ctrl of its ended-Instance records
// (fsm/ended.go has ctrl's side).
type endedRecords struct {
	// order is held while a full report lists the records until it is
	// sent, and while a Workspace answer is sent: every answer sent
	// before a report had its record written (the runtime writes it
	// before the command returns) before the report listed the records.
	// So ctrl may take a released Instance missing from a complete list
	// as a record deleted by hand.
	order sync.Mutex

	mu sync.Mutex
	// unrecognized are records ctrl has no Allocation for: they stay,
	// and are not sent again until the node restarts.
	unrecognized map[string]bool
}

// endedReport lists the records a full report carries, oldest first, and
// whether they are all the node keeps (but the unrecognized).
func (a *Agent) endedReport() ([]api.EndedInstance, bool) {
	rt := a.cfg.Runtime
	if rt == nil {
		return nil, false
	}
	recs, err := rt.Ended(0)
	if err != nil {
		// An unreadable record (a newer format, say) may be one ctrl
		// waits for: the list is not complete.
		a.log.Warn("ended-instance records not all readable", "err", err)
	}
	e := &a.ended
	e.mu.Lock()
	present := map[string]bool{}
	var out []api.EndedInstance
	for _, r := range recs {
		if e.unrecognized[r.InstanceID] {
			present[r.InstanceID] = true
			continue
		}
		out = append(out, api.EndedInstance{InstanceID: r.InstanceID, EndedAt: r.EndedAt, How: r.How})
	}
	for id := range e.unrecognized {
		if !present[id] {
			delete(e.unrecognized, id) // deleted since: nothing to remember
		}
	}
	e.mu.Unlock()
	complete := err == nil && len(out) <= maxEndedReported
	if len(out) > maxEndedReported {
		out = out[:maxEndedReported]
	}
	return out, complete
}

// keepUnrecognized notes records ctrl does not recognize.
func (a *Agent) keepUnrecognized(ids []string) {
	if len(ids) == 0 {
		return
	}
	e := &a.ended
	e.mu.Lock()
	if e.unrecognized == nil {
		e.unrecognized = map[string]bool{}
	}
	for _, id := range ids {
		e.unrecognized[id] = true
	}
	e.mu.Unlock()
	a.log.Info("ended-instance records not recognized by ctrl: they stay in the registry", "count", len(ids), "instance_ids", ids)
}

// sendReport sends a full report; fill completes the message (a sync's
// timestamps) just before it goes.
func (a *Agent) sendReport(send func(api.SessionMsg) error, fill func(m *api.SessionMsg)) error {
	a.ended.order.Lock()
	defer a.ended.order.Unlock()
	rep := a.buildReport(true)
	m := api.SessionMsg{Type: api.MsgReport, Report: &rep, HostUsage: a.hostUsage()}
	if fill != nil {
		fill(&m)
	}
	if err := send(m); err != nil {
		return err
	}
	a.noteSent(rep)
	return nil
}
