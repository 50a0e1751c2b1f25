package cluster

import (
	"strconv"
	"testing"
	"time"
)

// A key gets its burst at once, then rate a second; a refused take says
// how long until the next token; one key's use leaves another's alone.
func TestBucketsRefuseOverBurstAndSayWhen(t *testing.T) {
	l := newBuckets(2, 3, 100)
	now := time.Unix(1000, 0)
	for i := range 3 {
		if ok, _ := l.take("key:a", now); !ok {
			t.Fatalf("take %d of a burst of 3 refused", i+1)
		}
	}
	ok, wait := l.take("key:a", now)
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("4th take at once: %v, wait %v; want refused, 500ms (rate 2/s)", ok, wait)
	}
	if retryAfter(wait) != 1 {
		t.Fatalf("Retry-After of %v: %d, want 1", wait, retryAfter(wait))
	}
	if ok, _ := l.take("key:b", now); !ok {
		t.Fatal("another key was refused for key:a's use")
	}
	if ok, _ := l.take("key:a", now.Add(500*time.Millisecond)); !ok {
		t.Fatal("a token did not come back after 1/rate")
	}
	if ok, _ := l.take("key:a", now.Add(500*time.Millisecond)); ok {
		t.Fatal("two tokens came back after 1/rate")
	}
}

// Memory stays bounded whatever keys come: idle (full) buckets are
// dropped first, and a table of busy keys starts afresh.
func TestBucketsForgetIdleKeys(t *testing.T) {
	l := newBuckets(1, 2, 8)
	now := time.Unix(1000, 0)
	for i := range 100 {
		l.take("busy-"+strconv.Itoa(i), now)
		if n := l.size(); n > 8 {
			t.Fatalf("after %d keys the limiter remembers %d, more than its 8", i+1, n)
		}
	}
	// Busy keys that went idle leave room without losing a busy one.
	l = newBuckets(1, 2, 8)
	for i := range 8 {
		l.take("old-"+strconv.Itoa(i), now)
	}
	later := now.Add(time.Minute) // the old buckets are full again
	l.take("hot", later)
	l.take("hot", later)
	l.take("new", later)
	if n := l.size(); n != 2 {
		t.Fatalf("after the idle keys' eviction %d keys remembered, want 2 (hot, new)", n)
	}
	if ok, _ := l.take("hot", later); ok {
		t.Fatal("the eviction of idle keys refilled a busy one")
	}
}
