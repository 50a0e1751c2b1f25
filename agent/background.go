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
	mu      sync.Mutex
	ctx     context.Context
	cancel  context.CancelFunc
	stopped bool
	wg      sync.WaitGroup
}

// lifetime is the group's context, made from the first spawn's caller
// (Run's, in a node): its values, not its cancellation, since the
// goroutines outlive the call that started them (a command outlives the
// message that brought it). stop ends it.
func (b *background) lifetime(from context.Context) context.Context {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx == nil {
		b.ctx, b.cancel = context.WithCancel(context.WithoutCancel(from))
		if b.stopped {
			b.cancel()
		}
	}
	return b.ctx
}

// spawn runs f in a goroutine of the group with the lifetime context; ctx
// is the caller's.
func (b *background) spawn(ctx context.Context, f func(ctx context.Context)) {
	lt := b.lifetime(ctx)
	b.wg.Go(func() { f(lt) })
}

// stop cancels the lifetime context, also one made after it.
func (b *background) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	if b.cancel != nil {
		b.cancel()
	}
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
