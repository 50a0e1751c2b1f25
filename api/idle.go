package api

import "time"

// Idle pause. A Workspace with an idle timeout is paused by ctrl once its
// node reports its Instance idle at least that long: no data-plane
// connection (exec, terminal, cp, port-forward) open and the guest's CPU
// below IdleCPUPercent of one vCPU. With auto-resume, the next connection
// resumes it.

// IdleCPUPercent is the guest CPU use, in percent of one vCPU averaged
// over IdleCPUWindow, below which an Instance counts as idle: a guest
// that only keeps its clock and agent alive stays well under it.
const IdleCPUPercent = 5

// IdleCPUWindow is the span the node averages the guest's CPU use over.
const IdleCPUWindow = 30 * time.Second

// IdleReport is a node's latest word on an Instance's idleness.
type IdleReport struct {
	// Seconds idle when the node built its report.
	Seconds int64 `json:"seconds"`
	// ReportedAt is the time ctrl stored the report (its log entry's):
	// the Instance has been idle about Seconds plus the time since, if
	// nothing changed (the node reports at once when it does).
	ReportedAt time.Time `json:"reported_at"`
}

// IdleFor is how long the Instance has been idle as of now, by the
// report.
func (r *IdleReport) IdleFor(now time.Time) time.Duration {
	if r == nil {
		return 0
	}
	return time.Duration(r.Seconds)*time.Second + max(now.Sub(r.ReportedAt), 0)
}

// IdleTimeoutDuration is the Workspace's idle timeout, 0 for none.
func (w *Workspace) IdleTimeoutDuration() time.Duration {
	return time.Duration(w.IdleTimeoutSeconds) * time.Second
}
