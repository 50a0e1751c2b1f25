package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/api"
)

// progressPoll is how often a bar asks how far a node's transfer is.
const progressPoll = time.Second

// following draws, on a terminal, how far the node's transfer that path
// reports (an api.ByteProgress: a publish, a fetch, an import) is, once a
// second, until the returned stop is called: "label: template fetch  42%
// 120MiB/286MiB 61MiB/s". While the node reports none, waited (when not
// empty) shows "waited: 12s" instead, for work that may move no bytes.
func (g *Globals) following(label, waited, path string) (stop func()) {
	bar := g.progress(true, label, -1)
	if !bar.on {
		return func() {}
	}
	c, err := g.client()
	if err != nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(g.ctx)
	finished := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(finished)
		tick := time.NewTicker(progressPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var p api.ByteProgress
			pctx, done := context.WithTimeout(ctx, progressPoll)
			_, err := c.Do(pctx, "GET", path, nil, &p)
			done()
			bar.mu.Lock()
			switch {
			case err == nil:
				bar.name, bar.n, bar.total = label+": "+p.What, p.DoneBytes, p.TotalBytes
				bar.draw()
				bar.lastOut = time.Now()
			case waited != "":
				fmt.Fprintf(g.stderr, "\r%s: %s   ", waited, time.Since(start).Round(time.Second))
				bar.lastOut = time.Now()
			}
			bar.mu.Unlock()
		}
	}()
	return func() {
		cancel()
		<-finished
		bar.abandon()
	}
}
