package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// Apply appends one write to the Raft log on the leader and waits for its
// result. Callers on other members use forwarding (the HTTP API does).
func (s *Server) Apply(ctx context.Context, e fsm.Entry) (fsm.Result, error) {
	if !s.IsLeader() {
		return fsm.Result{}, api.Errorf(api.CodeUnavailable, "member %s is not the ctrl leader", s.id.NodeID)
	}
	// Raft waits forever on a timeout of 0: a request out of time must not
	// be sent (a commit nobody waits for) nor hang.
	if err := ctx.Err(); err != nil {
		return fsm.Result{}, outOfTime(e, err)
	}
	if err := s.levels.CheckOp(ctx, e.Op); err != nil {
		return fsm.Result{}, err
	}
	e.CountPlacements = fsm.CountsPlacements(e.Op) && s.levels.CountsPlacements()
	timeout := 30 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		if timeout = time.Until(dl); timeout <= 0 {
			return fsm.Result{}, outOfTime(e, context.DeadlineExceeded)
		}
	}
	e.IssuedAt = s.wallNow().UTC()
	// The binary format once every voter reads it, JSON until then.
	var (
		data []byte
		err  error
	)
	if s.levels.EntryFormatBinary() {
		e.CommandDigest = e.CommandID != ""
		e.CommandLog = e.CommandDigest && s.levels.CommandLog()
		data = fsm.EncodeEntry(&e)
	} else if data, err = fsm.EncodeEntryJSON(&e); err != nil {
		return fsm.Result{}, err
	}
	f := s.raft.Apply(data, timeout)
	switch err = s.awaitRaft(f); {
	case errors.Is(err, errMemberHalted):
		return fsm.Result{}, api.Errorf(api.CodeUnavailable, "ctrl member %s stopped applying the Raft log while the write was in flight (%v); retry with the same --command-id once a leader is elected", s.id.NodeID, s.haltErr)
	case errors.Is(err, errRaftDown):
		return fsm.Result{}, api.Errorf(api.CodeUnavailable, "ctrl member %s stopped while the write was in flight; retry with the same --command-id once a leader is elected", s.id.NodeID)
	}
	if err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrLeadershipTransferInProgress) {
			return fsm.Result{}, api.Errorf(api.CodeUnavailable, "ctrl leadership changed while the write was in flight; retry with the same --command-id")
		}
		return fsm.Result{}, api.Errorf(api.CodeUnavailable, "ctrl could not commit the write: %v; retry with the same --command-id", err)
	}
	if herr, ok := f.Response().(error); ok {
		// Answered by a member that halted: nothing was decided here.
		return fsm.Result{}, api.Errorf(api.CodeUnavailable, "ctrl member %s stopped applying the Raft log while the write was in flight (%v); retry with the same --command-id once a leader is elected", s.id.NodeID, herr)
	}
	res, ok := f.Response().(fsm.Result)
	if !ok {
		return fsm.Result{}, api.Errorf(api.CodeInternal, "unexpected apply response %T", f.Response())
	}
	return res, nil
}

var (
	errMemberHalted = errors.New("member stopped applying the Raft log")
	errRaftDown     = errors.New("raft shut down")
)

// awaitRaft waits for Raft to answer f, or for this member to halt or
// shut Raft down. A member that halted never answers the entries it
// stopped at, and Raft shut down leaves the entries (writes and barriers)
// it committed but did not apply unanswered. The goroutine ends when Raft
// answers; for such an entry it never does, and it ends with the process
// (at most one per future in flight at shutdown): Raft offers no way to
// wait on a future other than blocking in Error.
func (s *Server) awaitRaft(f raft.Future) error {
	errc := make(chan error, 1)
	go func() { errc <- f.Error() }()
	select {
	case err := <-errc:
		return err
	case <-s.halted:
		return errMemberHalted
	case <-s.raftDown:
		return errRaftDown
	}
}

// outOfTime refuses a write whose request ended before it was sent.
func outOfTime(e fsm.Entry, err error) error {
	what := e.Op
	if e.CommandID != "" {
		what += " (command " + e.CommandID + ")"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return api.Errorf(api.CodeDeadlineExceeded, "write %s was not sent to the Raft log: its deadline had passed; nothing was written, retry with a longer timeout", what)
	}
	return api.Errorf(api.CodeUnavailable, "write %s was not sent to the Raft log: its request was cancelled; nothing was written, retry it", what)
}

// ApplyOp builds an entry for op and args and applies it (leader only).
func (s *Server) ApplyOp(ctx context.Context, op string, args any) (fsm.Result, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return fsm.Result{}, err
	}
	return s.Apply(ctx, fsm.Entry{Op: op, Args: raw, Actor: "member:" + s.id.NodeID})
}
