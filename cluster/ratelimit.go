package cluster

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Refused joins from one address are limited to joinRate a second, in
// bursts of joinBurst: each costs a grant lookup and anybody can send them,
// so guessing grants is slow. Admitted joins cost nothing of it, so a
// fleet joining through one member is not slowed down.
const (
	joinRate      = 5
	joinBurst     = 20
	joinAddresses = 4096 // addresses remembered; beyond, the table starts afresh
)

// tokenBucket is a rate limiter: rate tokens a second, at most burst.
type tokenBucket struct {
	tokens float64
	last   time.Time
}

func (b *tokenBucket) refill(now time.Time) {
	b.tokens = min(joinBurst, b.tokens+now.Sub(b.last).Seconds()*joinRate)
	b.last = now
}

// joinLimiter keeps one bucket per remote address.
type joinLimiter struct {
	mu      sync.Mutex
	buckets map[string]*tokenBucket
}

func newJoinLimiter() *joinLimiter { return &joinLimiter{buckets: map[string]*tokenBucket{}} }

func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// allow reports whether host may try a join now.
func (l *joinLimiter) allow(host string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[host]
	if b == nil {
		return true
	}
	b.refill(time.Now())
	return b.tokens >= 1
}

// refused charges a refused join to host.
func (l *joinLimiter) refused(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	b := l.buckets[host]
	if b == nil {
		if len(l.buckets) >= joinAddresses {
			l.buckets = map[string]*tokenBucket{}
		}
		b = &tokenBucket{tokens: joinBurst, last: now}
		l.buckets[host] = b
	}
	b.refill(now)
	b.tokens = max(0, b.tokens-1)
}
