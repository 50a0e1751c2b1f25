package agent

import (
	"context"
	"io"
	"sync"
)

// background owns the agent's goroutines: the watchers Run starts, the
// commands ctrl sends, data-plane pushes and exports. Each gets the
// agent's lifetime context, which ends when Run ends; Run returns only
// once every one of them has returned (the runtime its caller closes
// next must not be used by any). The zero value is ready: an agent that
// never runs (a test of one handler) ends its work with end.
type background struct {
	once   sync.Once
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (b *background) init() {
	b.once.Do(func() { b.ctx, b.cancel = context.WithCancel(context.Background()) })
}

// spawn runs f in a goroutine of the group with the lifetime context.
func (b *background) spawn(f func(ctx context.Context)) {
	b.init()
	b.wg.Go(func() { f(b.ctx) })
}

// stop cancels the lifetime context.
func (b *background) stop() {
	b.init()
	b.cancel()
}

// end stops and waits for every goroutine.
func (b *background) end() {
	b.stop()
	b.wg.Wait()
}

// pipeFrom runs write into a pipe whose reading end it returns; closing
// that end makes write's next write fail. wait returns once write did.
func pipeFrom(write func(w io.Writer) error) (pr *io.PipeReader, wait func()) {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(write(pw))
	}()
	return pr, func() { <-done }
}
