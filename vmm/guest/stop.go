package guest

import (
	"io"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// stop ends the managed processes (SIGTERM to their process groups, SIGKILL
// after the grace period), syncs, answers the node and then powers off.
func (a *agent) stop(s io.Writer, req guestproto.StopRequest) {
	a.procsMu.Lock()
	already := a.stopped
	a.stopped = true
	a.procsMu.Unlock()
	if already {
		respond(s, nil, &guestproto.Error{Code: guestproto.CodeFailed, Message: "stop already in progress"})
		return
	}
	grace := req.Grace
	if grace <= 0 {
		grace = 10 * time.Second
	}
	a.log.Info("guest agent stopping", "grace", grace)
	var res guestproto.StopResult
	n := a.killAll(unix.SIGTERM)
	if a.opts.KillAll {
		unix.Kill(-1, unix.SIGTERM)
	}
	if !a.waitProcs(grace) {
		left := a.killAll(unix.SIGKILL)
		res.Killed = left
		a.waitProcs(5 * time.Second)
	}
	if a.opts.KillAll {
		unix.Kill(-1, unix.SIGKILL)
	}
	res.Terminated = n - res.Killed
	// Let every exec report its exit before the session goes away.
	waitTimeout(&a.execs, outputDelay+time.Second)
	syncAll()
	respond(s, res, nil)
	if a.opts.PowerOff != nil {
		a.log.Info("guest agent powering off")
		if err := a.opts.PowerOff(); err != nil {
			a.log.Error("guest agent poweroff failed", "err", err)
			a.stopErr = err
		}
	}
	close(a.stopCh)
}
