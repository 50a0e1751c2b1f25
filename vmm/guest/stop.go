package guest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// killWait is how long processes get to end after SIGKILL before a stop
// gives up on them: one still there is stuck in the kernel (most often
// waiting on a disk), and its data cannot be confirmed.
const killWait = 5 * time.Second

// stopAnswerWait bounds how long a prepared stop waits for the node to read
// its answer (the node closes the call's stream once it has) before the
// poweroff. Powering off at once can lose the answer still in the guest's
// transmit queue: the node then sees its connection end without one and
// cannot tell a prepared stop from a crash.
const stopAnswerWait = 3 * time.Second

// stop prepares the guest's end and powers it off: the managed processes
// get SIGTERM, SIGKILL after the grace period; the filesystems are synced,
// and those of the node's disks (retained) are frozen, so that what the
// Workspace wrote is on its disks before the VMM goes. When a step fails
// the guest answers the error and keeps running: the node must not end a
// VM whose data it cannot confirm. Filesystems frozen before the failure
// stay frozen (they take no more writes); only a later stop thaws nothing
// and freezes what is left.
func (a *agent) stop(s net.Conn, req guestproto.StopRequest) {
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
	res, err := a.prepareStop(grace)
	if err != nil {
		a.log.Error("guest stop not prepared; the guest keeps running", "err", err)
		a.procsMu.Lock()
		a.stopped = false
		a.procsMu.Unlock()
		respond(s, nil, err)
		return
	}
	respond(s, res, nil)
	a.log.Info("guest stop prepared; waiting for the node to read the answer", "wait", stopAnswerWait)
	waitClosed(s, stopAnswerWait)
	if a.opts.PowerOff != nil {
		a.log.Info("guest agent powering off")
		if err := a.opts.PowerOff(); err != nil {
			a.log.Error("guest agent poweroff failed", "err", err)
			a.stopErr = err
		}
	}
	close(a.stopCh)
}

// waitClosed waits until the peer closed s (or anything else ends the
// stream) or d passed; whatever the peer still sends is discarded.
func waitClosed(s net.Conn, d time.Duration) {
	s.SetReadDeadline(time.Now().Add(d))
	io.Copy(io.Discard, io.LimitReader(s, 1<<20))
}

// prepareStop ends the managed processes, syncs, and syncs and freezes the
// retained filesystems.
func (a *agent) prepareStop(grace time.Duration) (guestproto.StopResult, error) {
	var res guestproto.StopResult
	n := a.killAll(unix.SIGTERM)
	if a.opts.KillAll {
		unix.Kill(-1, unix.SIGTERM)
	}
	if !a.waitProcs(grace) {
		res.Killed = a.killAll(unix.SIGKILL)
		if a.opts.KillAll {
			unix.Kill(-1, unix.SIGKILL)
		}
		if !a.waitProcs(killWait) {
			left := a.killAll(0)
			return res, &guestproto.Error{Code: guestproto.CodeDeadlineExceeded,
				Message: fmt.Sprintf("%d managed processes did not end within %s of SIGTERM and %s of SIGKILL (stuck in the kernel, most often on a disk)", left, grace, killWait)}
		}
	} else if a.opts.KillAll {
		unix.Kill(-1, unix.SIGKILL)
	}
	res.Terminated = n - res.Killed
	// Let every exec report its exit before the session goes away. The
	// helper joins the handlers shutdown waits for: it ends with the last
	// exec, which is a handler too.
	waitTimeout(&a.wg, &a.execs, outputDelay+time.Second)
	syncAll()
	frozen, err := a.freezeRetained()
	res.Frozen = frozen
	return res, err
}

// retain notes a mount point of a node's disk.
func (a *agent) retain(target string) {
	a.retainedMu.Lock()
	defer a.retainedMu.Unlock()
	if !slices.Contains(a.retained, target) {
		a.retained = append(a.retained, target)
	}
}

// freezeRetained syncs and freezes every retained filesystem, the last
// mounted first (a Volume before the root it is mounted in). Every one is
// tried; the first failure is returned. One frozen already (by a stop
// that failed before) counts as frozen.
func (a *agent) freezeRetained() ([]string, error) {
	a.retainedMu.Lock()
	targets := slices.Clone(a.retained)
	a.retainedMu.Unlock()
	var frozen []string
	var first error
	for i := len(targets) - 1; i >= 0; i-- {
		err := syncAndFreeze(targets[i])
		if err == nil {
			frozen = append(frozen, targets[i])
			continue
		}
		if first == nil {
			first = err
		}
	}
	return frozen, first
}

// syncAndFreeze flushes one filesystem (syncfs reports a writeback error
// the filesystem met since it was opened) and freezes it.
func syncAndFreeze(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &guestproto.Error{Code: guestproto.CodeFailed, Message: fmt.Sprintf("retained filesystem sync failed: %s: %v", path, err)}
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return &guestproto.Error{Code: guestproto.CodeFailed, Message: fmt.Sprintf("retained filesystem sync failed: %s: %v", path, err)}
	}
	if err := unix.IoctlSetInt(fd, ioctlFIFREEZE, 0); err != nil && !errors.Is(err, unix.EBUSY) {
		return &guestproto.Error{Code: guestproto.CodeFailed, Message: fmt.Sprintf("retained filesystem freeze failed: %s: %v", path, err)}
	}
	return nil
}
