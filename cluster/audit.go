package cluster

import (
	"net/http"
	"sync"
	"time"

	"github.com/kibotos/kibotos/api"
)

// The member that receives a request leaves one structured line for every
// write it serves (who, what, the answer's status) and for every request
// it refuses for its credentials or its caller's role (who or from where,
// what, why): an operator can tell from the logs who changed what, and
// that somebody is knocking.

// Refusals anybody can provoke are logged at most auditBurst a second;
// the rest are counted into the next line that is logged.
const auditBurst = 50

type auditLimiter struct {
	mu         sync.Mutex
	window     time.Time // start of the current second
	logged     int       // lines in it
	suppressed int       // refusals not logged since the last line
}

// admit says whether to log one more refusal now, and how many were not
// logged before it.
func (a *auditLimiter) admit(now time.Time) (bool, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.Sub(a.window) >= time.Second {
		a.window, a.logged = now, 0
	}
	if a.logged >= auditBurst {
		a.suppressed++
		return false, 0
	}
	a.logged++
	n := a.suppressed
	a.suppressed = 0
	return true, n
}

// auditRefused logs a request refused for its credentials or its role.
func (s *Server) auditRefused(r *http.Request, caller string, err error) {
	ok, suppressed := s.refusals.admit(time.Now())
	if !ok {
		return
	}
	attrs := []any{"method", r.Method, "path", r.URL.Path, "remote", remoteHost(r), "code", api.CodeOf(err), "reason", err.Error()}
	if caller != "" {
		attrs = append(attrs, "caller", caller)
	}
	if suppressed > 0 {
		attrs = append(attrs, "refusals_not_logged", suppressed)
	}
	s.log.Warn("api request refused", attrs...)
}

// auditWrite logs a write this member served (applied, forwarded to the
// leader, or refused by its checks) with the status it answered.
func (s *Server) auditWrite(r *http.Request, status int) {
	c := callerOf(r)
	attrs := []any{"caller", c.name, "method", r.Method, "path", r.URL.Path, "status", status}
	if c.viaHop {
		attrs = append(attrs, "forwarded_by", c.hop)
	}
	s.log.Info("api write", attrs...)
}

// statusRecorder remembers the status an answer was written with.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (sr *statusRecorder) WriteHeader(code int) {
	sr.status = code
	sr.ResponseWriter.WriteHeader(code)
}

func (sr *statusRecorder) Unwrap() http.ResponseWriter { return sr.ResponseWriter }
