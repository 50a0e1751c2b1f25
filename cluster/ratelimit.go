package cluster

import (
	"math"
	"net"
	"net/http"
	"sync"
	"time"
)

// Refused joins, and requests to the API listener without a valid API
// key, from one address are limited to refusedRate a second, in bursts of
// refusedBurst: anybody can send them, each costs a lookup and an audit
// line, so guessing is slow and the log stays bounded. Admitted ones
// cost nothing of it, so a fleet joining through one member, or the
// applications behind one proxy address, are not slowed down.
const (
	refusedRate      = 5
	refusedBurst     = 20
	refusedAddresses = 4096 // addresses remembered; beyond, the table starts afresh
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

// refusalLimiter charges refused joins or API keys to their remote
// address.
type refusalLimiter struct{ *buckets }

func newRefusalLimiter() *refusalLimiter {
	return &refusalLimiter{newBuckets(refusedRate, refusedBurst, refusedAddresses)}
}

func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// allow reports whether host may try again now.
func (l *refusalLimiter) allow(host string) bool { return l.has(host, time.Now()) }

// refused charges a refusal to host.
func (l *refusalLimiter) refused(host string) { l.charge(host, time.Now()) }
