package cluster

import (
	"sync"
	"time"
)

// joinRate and joinBurst bound the unauthenticated join requests a member
// takes: each one costs a grant lookup and, when valid, a Raft write and
// two signatures, and anybody can send them.
const (
	joinRate  = 5
	joinBurst = 20
)

// tokenBucket is a rate limiter: rate tokens a second, at most burst.
type tokenBucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newTokenBucket(rate, burst float64) *tokenBucket {
	return &tokenBucket{rate: rate, burst: burst, tokens: burst}
}

func (b *tokenBucket) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
