package cluster

import (
	"math"
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

// tokenBucket is one key's tokens and when they were last counted.
type tokenBucket struct {
	tokens float64
	last   time.Time
}

// buckets is a token-bucket rate limiter per key (an address, an API
// key): rate tokens a second, at most burst in a bucket. It remembers at
// most max keys, so that keys nobody uses any more cost no memory: a full
// bucket is the same as none, so full ones go first; when most buckets
// are in use, the table starts afresh (every key gets a full burst, no
// more than an idle key has anyway).
type buckets struct {
	rate, burst float64
	max         int

	mu sync.Mutex
	m  map[string]*tokenBucket
}

func newBuckets(rate float64, burst, max int) *buckets {
	return &buckets{rate: rate, burst: float64(burst), max: max, m: map[string]*tokenBucket{}}
}

func (l *buckets) refill(b *tokenBucket, now time.Time) {
	if now.After(b.last) {
		b.tokens = min(l.burst, b.tokens+now.Sub(b.last).Seconds()*l.rate)
		b.last = now
	}
}

// bucket is key's bucket, a full one when the key has none (l.mu held).
func (l *buckets) bucket(key string, now time.Time) *tokenBucket {
	b := l.m[key]
	if b != nil {
		l.refill(b, now)
		return b
	}
	if len(l.m) >= l.max {
		l.evict(now)
	}
	b = &tokenBucket{tokens: l.burst, last: now}
	l.m[key] = b
	return b
}

// evict drops the full buckets, or every bucket when that frees less
// than a quarter of the table (a sweep per new key would cost O(max)
// each while the table stays nearly full).
func (l *buckets) evict(now time.Time) {
	for k, b := range l.m {
		if l.refill(b, now); b.tokens >= l.burst {
			delete(l.m, k)
		}
	}
	if len(l.m) > l.max*3/4 {
		l.m = map[string]*tokenBucket{}
	}
}

// has reports whether key holds a token now, without taking it.
func (l *buckets) has(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.m[key]
	if b == nil {
		return true
	}
	l.refill(b, now)
	return b.tokens >= 1
}

// charge takes a token from key if it has one.
func (l *buckets) charge(key string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(key, now)
	b.tokens = max(0, b.tokens-1)
}

// take takes a token from key; without one, it says how long until key
// has one again.
func (l *buckets) take(key string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(key, now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// size is how many keys the limiter remembers.
func (l *buckets) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

// retryAfter is a wait as a Retry-After header's whole seconds, at least 1.
func retryAfter(d time.Duration) int { return max(1, int(math.Ceil(d.Seconds()))) }

// joinLimiter charges refused joins to their remote address.
type joinLimiter struct{ *buckets }

func newJoinLimiter() *joinLimiter {
	return &joinLimiter{newBuckets(joinRate, joinBurst, joinAddresses)}
}

func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// allow reports whether host may try a join now.
func (l *joinLimiter) allow(host string) bool { return l.has(host, time.Now()) }

// refused charges a refused join to host.
func (l *joinLimiter) refused(host string) { l.charge(host, time.Now()) }
