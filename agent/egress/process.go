package egress

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// RunProcess is `kibotos egress serve`: it serves until a drain has ended
// everything. SIGTERM or SIGINT drain with grace as the deadline (the node
// normally drains over the control socket with its own deadline); a second
// signal closes everything at once.
func RunProcess(ctx context.Context, opts Options, grace time.Duration) error {
	s, err := New(opts)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(ctx)
	// The signal watcher ends with ctx, which is cancelled before the
	// wait: RunProcess returns only once it did.
	watched := make(chan struct{})
	defer func() {
		cancel()
		<-watched
	}()
	go func() {
		defer close(watched)
		for n := 0; ; n++ {
			select {
			case sig := <-sigs:
				if n == 0 {
					s.log.Info("egress signalled: draining", "signal", sig.String(), "grace", grace)
					s.Drain(time.Now().Add(grace))
					continue
				}
				s.log.Info("egress signalled again: closing everything", "signal", sig.String())
				cancel()
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return s.Run(ctx)
}
