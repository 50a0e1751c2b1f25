package guest

import (
	"log/slog"
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// reaper starts processes and reports their exit. It is the only code that
// waits for children, so exit statuses are never stolen.
type reaper interface {
	// start starts a process; exited receives its wait status once.
	start(path string, argv []string, attr *os.ProcAttr) (p *os.Process, exited <-chan unix.WaitStatus, err error)
	close()
}

// pidReaper waits for each started process by pid. It is for agents that
// are not PID 1 and must leave other children of their process alone.
type pidReaper struct{}

func (pidReaper) start(path string, argv []string, attr *os.ProcAttr) (*os.Process, <-chan unix.WaitStatus, error) {
	p, err := os.StartProcess(path, argv, attr)
	if err != nil {
		return nil, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	go func() {
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(p.Pid, &ws, 0, nil)
			if err != unix.EINTR {
				break
			}
		}
		ch <- ws
	}()
	return p, ch, nil
}

func (pidReaper) close() {}

// orphanReaper is PID 1's reaper: one SIGCHLD-driven wait4(-1) loop reaps
// every child, including re-parented orphans, and hands the statuses of
// processes started through it to their waiters.
type orphanReaper struct {
	log     *slog.Logger
	mu      sync.Mutex // held while starting and while reaping
	waiters map[int]chan unix.WaitStatus
	sigs    chan os.Signal
	stop    chan struct{}
	done    chan struct{}
}

func newOrphanReaper(log *slog.Logger) *orphanReaper {
	r := &orphanReaper{
		log:     log,
		waiters: map[int]chan unix.WaitStatus{},
		sigs:    make(chan os.Signal, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	signal.Notify(r.sigs, unix.SIGCHLD)
	go r.loop()
	return r
}

func (r *orphanReaper) start(path string, argv []string, attr *os.ProcAttr) (*os.Process, <-chan unix.WaitStatus, error) {
	// The lock keeps the loop from reaping the child before it is registered.
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := os.StartProcess(path, argv, attr)
	if err != nil {
		return nil, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[p.Pid] = ch
	return p, ch, nil
}

func (r *orphanReaper) loop() {
	defer close(r.done)
	for {
		r.reap()
		select {
		case <-r.sigs:
		case <-r.stop:
			return
		}
	}
}

func (r *orphanReaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- ws
			continue
		}
		r.log.Debug("reaped orphan", "pid", pid, "status", int(ws))
	}
}

func (r *orphanReaper) close() {
	signal.Stop(r.sigs)
	close(r.stop)
	<-r.done
}
