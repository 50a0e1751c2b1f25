package egress

import (
	"sync"
	"time"
)

// lineLimiter is a token bucket for per-connection and per-query log
// lines: a guest opening thousands of connections must not flood the
// node's journal. Lines over the rate are counted, and the next line that
// passes carries how many were suppressed.
type lineLimiter struct {
	perSecond, burst float64

	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed int
}

func (l *lineLimiter) allow(now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last.IsZero() {
		l.tokens = l.burst
	} else {
		l.tokens = min(l.burst, l.tokens+now.Sub(l.last).Seconds()*l.perSecond)
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		return false, 0
	}
	l.tokens--
	n := l.suppressed
	l.suppressed = 0
	return true, n
}

// connLog logs one per-connection line at info level, rate-limited.
func (s *Server) connLog(msg string, args ...any) {
	ok, suppressed := s.lines.allow(time.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed_before", suppressed)
	}
	s.log.Info(msg, args...)
}
