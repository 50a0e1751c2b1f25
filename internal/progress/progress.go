// Package progress keeps how far this process's long byte transfers are (a
// publish into the artifact store, a fetch from it, an import), by key,
// for whoever asks how far one is: the operator's CLI, through a member.
// A transfer is listed only while it runs.
package progress

import (
	"io"
	"sync"
	"sync/atomic"

	"github.com/kibotos/kibotos/api"
)

// Board is the transfers running now, by key (api.ProgressKey...).
type Board struct {
	mu sync.Mutex
	m  map[string]*Counter
}

// Counter is one transfer's count.
type Counter struct {
	what        string
	done, total atomic.Int64
}

// Begin lists a transfer under key (replacing one listed there) with
// total bytes, -1 while unknown; end takes it off the board.
func (b *Board) Begin(key, what string, total int64) (c *Counter, end func()) {
	c = &Counter{what: what}
	c.total.Store(total)
	b.mu.Lock()
	if b.m == nil {
		b.m = map[string]*Counter{}
	}
	b.m[key] = c
	b.mu.Unlock()
	return c, func() {
		b.mu.Lock()
		if b.m[key] == c {
			delete(b.m, key)
		}
		b.mu.Unlock()
	}
}

// Get is how far the transfer under key is; false when none runs.
func (b *Board) Get(key string) (api.ByteProgress, bool) {
	b.mu.Lock()
	c, ok := b.m[key]
	b.mu.Unlock()
	if !ok {
		return api.ByteProgress{}, false
	}
	return api.ByteProgress{What: c.what, DoneBytes: c.done.Load(), TotalBytes: c.total.Load()}, true
}

// Set records done of total bytes (the form of artifacts.Fetch's progress
// callback). A nil Counter counts nothing.
func (c *Counter) Set(done, total int64) {
	if c != nil {
		c.done.Store(done)
		c.total.Store(total)
	}
}

// Reader counts what is read through r.
func (c *Counter) Reader(r io.Reader) io.Reader { return &countingReader{r: r, c: c} }

type countingReader struct {
	r io.Reader
	c *Counter
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.c.done.Add(int64(n))
	return n, err
}
