package runtime

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Backoff of guest reconnects after a takeover or a lost session. An
// attempt starts short: a hello can be lost in the guest (its agent drops
// what a session's in-flight read had consumed when the old node
// vanished), and only a new connection with a fresh hello recovers from
// that. It grows with each failed attempt, up to guestAttemptMax: a guest
// slowed down (a loaded host under TCG) that needs longer than an attempt
// to answer would otherwise never be reached, each answer arriving after
// its attempt gave up.
const (
	guestAttemptTimeout = 2 * time.Second
	guestAttemptMax     = 30 * time.Second
	guestBackoffMin     = 100 * time.Millisecond
	guestBackoffMax     = 5 * time.Second
)

// dialGuest opens one guest agent session through the backend.
func (rt *Runtime) dialGuest(ctx context.Context, in *instance) (*guestproto.Client, error) {
	conn, err := rt.backend.GuestConn(ctx, in.paths)
	if err != nil {
		return nil, err
	}
	if w := rt.cfg.guestConn; w != nil {
		conn = w(conn)
	}
	return guestproto.Dial(ctx, conn)
}

func guestRecord(info guestproto.GuestInfo) *GuestRecord {
	return &GuestRecord{BootID: info.BootID, Protocol: info.Protocol, AgentVersion: info.AgentVersion, Capabilities: info.Capabilities}
}

// startGuestLoop keeps a guest session for a running Instance: it
// reconnects with backoff whenever there is none. first is a session
// already established (by Start), or nil.
func (rt *Runtime) startGuestLoop(in *instance, first *guestproto.Client) {
	ctx, cancel := context.WithCancel(rt.ctx)
	done := make(chan struct{})
	in.mu.Lock()
	in.stopGuest, in.guestDone = cancel, done
	in.mu.Unlock()
	rt.wg.Add(1)
	go func() {
		defer rt.wg.Done()
		defer close(done)
		rt.guestLoop(ctx, in, first)
	}()
}

func (rt *Runtime) guestLoop(ctx context.Context, in *instance, c *guestproto.Client) {
	backoff, attempt := guestBackoffMin, guestAttemptTimeout
	pending := false
	for {
		if c == nil {
			in.mu.Lock()
			state := in.state
			in.mu.Unlock()
			if state != StateRunning && state != StateStopping {
				return // ended: nothing to reconnect to
			}
			// A stop waits for the guest to prepare it: reconnecting goes
			// on until the stop ends this loop (endUnit), or fails and the
			// Instance is RUNNING again. (A stop right after a takeover
			// whose first hello was lost waited for a loop that had
			// ended.)
			stopping := state == StateStopping
			actx, cancel := context.WithTimeout(ctx, attempt)
			var err error
			c, err = rt.dialGuest(actx, in)
			cancel()
			if ctx.Err() != nil {
				if c != nil {
					c.Close()
				}
				return
			}
			var verr *guestproto.VersionError
			if errors.As(err, &verr) {
				// The guest answers but refuses: the VMM keeps running.
				in.mu.Lock()
				if in.state == StateRunning {
					in.state, in.err, in.how = StateFailed, "guest agent refused: "+err.Error(), "guest refused"
					in.notify()
				}
				in.mu.Unlock()
				rt.log.Error("instance guest refused", "instance_id", in.id, "err", err)
				return
			}
			if err == nil {
				// Answering is not enough: until the guest has this run's
				// configuration it shows as not responding.
				if err = rt.syncGuest(ctx, in, c, attempt); err != nil {
					c.Close()
					c = nil
				}
			}
			if err != nil {
				in.mu.Lock()
				in.responding = false
				in.mu.Unlock()
				pending = true
				if stopping {
					// A guest powering off no longer answers: expected.
					rt.log.Debug("instance guest not reached while stopping", "instance_id", in.id, "err", err, "retry_in", backoff)
				} else {
					rt.log.Warn("instance guest sync pending", "instance_id", in.id, "err", err, "retry_in", backoff)
				}
				if ctxsleep.Sleep(ctx, backoff) != nil {
					return
				}
				backoff, attempt = min(backoff*2, guestBackoffMax), min(attempt*2, guestAttemptMax)
				continue
			}
			if pending {
				rt.log.Info("instance guest sync pending", "instance_id", in.id, "recovered", true)
				pending = false
			}
			backoff, attempt = guestBackoffMin, guestAttemptTimeout
		}
		in.mu.Lock()
		in.guest, in.responding = c, true
		in.notify()
		in.mu.Unlock()
		select {
		case <-c.Done():
			in.mu.Lock()
			if in.guest == c {
				in.guest, in.responding = nil, false
				in.notify()
			}
			in.mu.Unlock()
			c = nil
		case <-ctx.Done():
			in.mu.Lock()
			if in.guest == c {
				in.guest, in.responding = nil, false
				in.notify()
			}
			keep := in.keepSession
			if keep {
				in.held = c
			}
			in.mu.Unlock()
			if !keep {
				c.Close()
			}
			return
		}
	}
}

// syncGuest gives a guest its configuration once per node run, before
// anything else reaches it. A guest that restarted (a new boot id: a
// reboot or a panic, with or without a node running) is told its whole
// launch-time configuration (reconfigureRestarted). One taken over (its
// first session of this node run) is told the network the launch record
// holds and this run's DNS (the namespace's address, which the node's
// resolver answers on): each request is idempotent (addresses and routes
// replaced, resolv.conf rewritten in place), so a guest that kept them is
// not disturbed.
func (rt *Runtime) syncGuest(ctx context.Context, in *instance, c *guestproto.Client, timeout time.Duration) error {
	in.mu.Lock()
	rec, done := in.rec, in.configured
	in.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case restarted(rec, c):
		if err := rt.reconfigureRestarted(sctx, in, c, rec); err != nil {
			return err
		}
	case done || rec.Network == nil:
		// A session lost within this node run: the guest kept what it
		// was given.
		return nil
	default:
		if err := c.Configure(sctx, guestNetwork(rec.Network)); err != nil {
			return fmt.Errorf("configure the guest network again: %w", err)
		}
	}
	in.mu.Lock()
	in.configured = true
	in.mu.Unlock()
	return nil
}

// detachGuest ends the guest loop of in but keeps its session open, and
// returns it: nil when the loop had none.
func (in *instance) detachGuest() *guestproto.Client {
	in.mu.Lock()
	in.keepSession = true
	in.mu.Unlock()
	in.stopGuestLoop()
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.held
}

// stopGuestLoop ends the guest loop of in and waits for it.
func (in *instance) stopGuestLoop() {
	in.mu.Lock()
	cancel, done := in.stopGuest, in.guestDone
	in.stopGuest, in.guestDone = nil, nil
	in.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// waitGuest is the readiness check of a start or a takeover: it dials
// the guest agent until it answers, the VMM exits or ctx ends, each
// attempt on a new connection with a fresh hello and longer than the last
// (as the guest loop's: a takeover's first hello can be lost in the
// guest, and a booting guest answers only once its agent runs).
func (rt *Runtime) waitGuest(ctx context.Context, in *instance, alive func() bool) (*guestproto.Client, error) {
	var last error
	attempt := guestAttemptTimeout
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		c, err := rt.dialGuest(actx, in)
		if actx.Err() != nil {
			// Unanswered (a socket not there yet fails at once).
			attempt = min(attempt*2, guestAttemptMax)
		}
		cancel()
		if err == nil {
			return c, nil
		}
		last = err
		var verr *guestproto.VersionError
		if errors.As(err, &verr) {
			return nil, err
		}
		if !alive() {
			return nil, fmt.Errorf("the VMM exited before the guest agent answered (last: %v)", last)
		}
		if err := ctxsleep.Sleep(ctx, 50*time.Millisecond); err != nil {
			return nil, fmt.Errorf("%w (last: %v)", err, last)
		}
	}
}

// Guest returns the current guest agent session of a running Instance.
func (rt *Runtime) Guest(id string) (*guestproto.Client, error) {
	in, err := rt.get(id)
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.guest == nil {
		return nil, fmt.Errorf("runtime: instance %s: guest agent is not connected (state %s%s)", id, in.state, errSuffix(in.err))
	}
	return in.guest, nil
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return ": " + e
}

// Exec starts a process in the guest. While the guest agent is being
// reconnected (after a takeover) it waits for it as long as ctx allows.
func (rt *Runtime) Exec(ctx context.Context, id string, req guestproto.ExecRequest) (*guestproto.Process, error) {
	in, err := rt.get(id)
	if err != nil {
		return nil, err
	}
	for {
		in.mu.Lock()
		c, state, changed := in.guest, in.state, in.changed
		in.mu.Unlock()
		if c != nil {
			p, err := c.Exec(ctx, req)
			if err != nil {
				return nil, fmt.Errorf("runtime: instance %s: exec %q: %w", id, req.Argv, err)
			}
			return p, nil
		}
		if state != StateRunning && state != StateStarting {
			return nil, fmt.Errorf("runtime: instance %s is %s, cannot exec %q", id, state, req.Argv)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("runtime: instance %s: exec %q: guest agent not connected: %w", id, req.Argv, ctx.Err())
		}
	}
}
