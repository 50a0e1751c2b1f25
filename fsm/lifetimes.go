package fsm

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Workspace lifetimes (LevelLifetimes, api/lifetime.go). A Workspace
// with a timeout ends at the time of its latest start or resume entry
// plus the timeout, or of its latest set-timeout entry plus the one given.
// The leader's lifetime service (ctrl/lifetimes.go) reads the ends that
// passed from an index (bucketWorkspaceEnds) and proposes
// OpWorkspaceTimedOut for each; that op checks again, with its own
// entry's time, that the end has passed, so a leader whose clock runs
// ahead of the entries never ends a Workspace early.
//
// What the action does depends on the Workspace's state (timeoutPlan):
// it waits while a command the action cannot overtake is in flight (the
// command's answer rewrites the record and the end is due again), only
// clears the end where the action has nothing to do (a stop of a
// Workspace that runs nothing, a pause of a PAUSED one), and otherwise
// runs the operator's stop, pause or delete.

// LevelLifetimes is the level of WorkspaceCreateArgs.TimeoutSeconds and
// OnTimeout, OpWorkspaceSetTimeout and OpWorkspaceTimedOut. The leader
// refuses a create with a timeout below it: an older voter would drop
// the fields and keep the Workspace forever.
const LevelLifetimes = 15

// WorkspaceSetTimeoutArgs is set-timeout: the Workspace ends
// TimeoutSeconds after the entry's time, and later starts and resumes
// run that long; 0 clears the end and the timeout.
type WorkspaceSetTimeoutArgs struct {
	WorkspaceID    string `json:"workspace_id"`
	TimeoutSeconds int64  `json:"timeout_seconds"`
	// OnTimeout replaces the action; "" keeps the Workspace's (delete if
	// it has none).
	OnTimeout string `json:"on_timeout,omitempty"`
	// KeepTimeout leaves the timeout and the end as they are (with
	// TimeoutSeconds 0 and no OnTimeout): only the idle timeout changes.
	KeepTimeout bool `json:"keep_timeout,omitempty"`
	// IdleTimeoutSeconds, when given, replaces the idle timeout (0
	// removes it; idle.go).
	IdleTimeoutSeconds *int64 `json:"idle_timeout_seconds,omitempty"`
}

// WorkspaceTimedOutArgs asks the FSM to do the timeout action of a
// Workspace whose end (EndsAt, as the leader read it) has passed.
type WorkspaceTimedOutArgs struct {
	WorkspaceID string    `json:"workspace_id"`
	EndsAt      time.Time `json:"ends_at"`
}

// TimedOut is the result of OpWorkspaceTimedOut.
type TimedOut struct {
	Workspace *api.Workspace `json:"workspace"`
	// Did is what the FSM did: delete, stop, stop_force or pause, or ""
	// when the action had nothing to do and only the end was cleared.
	Did string `json:"did,omitempty"`
}

// What a due end leads to (timeoutPlan).
const (
	planClear     = ""
	planWait      = "wait"
	planDelete    = api.TimeoutDelete
	planStop      = api.TimeoutStop
	planStopForce = "stop_force"
	planPause     = api.TimeoutPause
)

// timeoutPlan is what w's timeout action does to it as it is now.
func timeoutPlan(w *api.Workspace) string {
	if w.Exporting != "" {
		return planWait // stop, pause and delete wait for the export's end
	}
	inFlight := w.State == api.WorkspaceCreating || w.State == api.WorkspaceStarting || w.State == api.WorkspacePausing
	switch w.OnTimeout {
	case api.TimeoutStop:
		switch {
		case inFlight:
			return planWait // a normal stop needs AVAILABLE
		case w.InstanceID == "" || w.State == api.WorkspaceStopping || w.State == api.WorkspaceDeleting:
			return planClear // runs nothing, or is already going
		case w.State == api.WorkspaceFailed:
			return planStopForce // its guest does not answer a clean stop
		}
		return planStop
	case api.TimeoutPause:
		switch {
		case inFlight, w.State == api.WorkspaceAvailable && w.Pending != nil:
			return planWait // a pause needs AVAILABLE with nothing in flight
		case w.State == api.WorkspaceAvailable && w.Layer != nil && !w.Layer.Lost:
			return planPause
		}
		return planClear // PAUSED already, or runs nothing a pause could keep
	}
	if w.State == api.WorkspaceDeleting {
		return planClear
	}
	return planDelete
}

// namesWorkspace refuses arguments that name no Workspace.
func namesWorkspace(id string) error {
	if id == "" {
		return api.Errorf(api.CodeInvalidArgument, "the arguments name no workspace: give its id")
	}
	return nil
}

// checkSetTimeout refuses set-timeout arguments the API would not send.
func checkSetTimeout(a *WorkspaceSetTimeoutArgs) error {
	if a.IdleTimeoutSeconds != nil {
		if err := checkIdleTimeout(*a.IdleTimeoutSeconds); err != nil {
			return err
		}
	}
	if !a.KeepTimeout {
		return checkLifetime(a.TimeoutSeconds, a.OnTimeout)
	}
	switch {
	case a.IdleTimeoutSeconds == nil:
		return api.Errorf(api.CodeInvalidArgument, "set-timeout of workspace %s keeps the timeout and gives no idle timeout: give one or the other", a.WorkspaceID)
	case a.TimeoutSeconds != 0 || a.OnTimeout != "":
		return api.Errorf(api.CodeInvalidArgument, "set-timeout of workspace %s keeps the timeout but gives one: leave keep_timeout out to change it", a.WorkspaceID)
	}
	return nil
}

// argsWorkspace decodes the entry's arguments into a and returns the
// Workspace they name at *id (a field of a).
func argsWorkspace(ac *applyCtx, a any, id *string) (*api.Workspace, error) {
	if err := decodeArgs(ac.e, a); err != nil {
		return nil, err
	}
	if err := namesWorkspace(*id); err != nil {
		return nil, err
	}
	return mustWorkspace(ac.tx, *id)
}

// checkLifetime refuses a timeout (seconds) or an action the API would
// not take.
func checkLifetime(seconds int64, action string) error {
	if seconds > int64(api.MaxTimeout/time.Second) {
		return api.CheckTimeout(api.MaxTimeout + time.Second)
	}
	if err := api.CheckTimeout(time.Duration(seconds) * time.Second); err != nil {
		return err
	}
	if err := api.CheckTimeoutAction(action); err != nil {
		return err
	}
	if seconds == 0 && action != "" {
		return api.Errorf(api.CodeInvalidArgument, "on_timeout %s without a timeout: give a timeout too", action)
	}
	return nil
}

// setLifetime gives w the timeout and action of a create and arms its end.
func setLifetime(ac *applyCtx, w *api.Workspace, seconds int64, action string) {
	if seconds == 0 {
		return
	}
	w.TimeoutSeconds, w.OnTimeout = seconds, cmp.Or(action, api.TimeoutDelete)
	armEnd(ac, w)
}

// armEnd sets w's end to the entry's time plus its timeout: the entry
// starts or resumes it. It assigns a new EndsAt, never changes the old
// one in place: the caller's copy of the record before (moveEnds) keeps it.
func armEnd(ac *applyCtx, w *api.Workspace) {
	if w.TimeoutSeconds <= 0 {
		return
	}
	end := at(ac.e).Add(time.Duration(w.TimeoutSeconds) * time.Second)
	w.EndsAt = &end
}

func applyWorkspaceSetTimeout(ac *applyCtx) (any, error) {
	var a WorkspaceSetTimeoutArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := namesWorkspace(a.WorkspaceID); err != nil {
		return nil, err
	}
	if err := checkSetTimeout(&a); err != nil {
		return nil, err
	}
	w, err := mustWorkspace(ac.tx, a.WorkspaceID)
	if err != nil {
		return nil, err
	}
	if err := ac.scope.permits(w.Namespace, "workspace "+a.WorkspaceID); err != nil {
		return nil, err
	}
	if !a.KeepTimeout {
		if err := setTimeoutAllowed(ac.tx, w.Namespace, a.TimeoutSeconds); err != nil {
			return nil, err
		}
	}
	if err := checkVersion(ac.e, w.Version, "workspace "+w.WorkspaceID); err != nil {
		return nil, err
	}
	if w.State == api.WorkspaceDeleting {
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is being deleted: it needs no timeout", w.WorkspaceID)
	}
	old := cloneWorkspace(w)
	if a.IdleTimeoutSeconds != nil {
		w.IdleTimeoutSeconds = *a.IdleTimeoutSeconds
	}
	switch {
	case a.KeepTimeout:
	case a.TimeoutSeconds == 0:
		w.TimeoutSeconds, w.OnTimeout, w.EndsAt = 0, "", nil
	default:
		w.TimeoutSeconds, w.OnTimeout = a.TimeoutSeconds, cmp.Or(a.OnTimeout, w.OnTimeout, api.TimeoutDelete)
		armEnd(ac, w)
	}
	if err := putWorkspace(ac, old, w); err != nil {
		return nil, err
	}
	return w, nil
}

func applyWorkspaceTimedOut(ac *applyCtx) (any, error) {
	var a WorkspaceTimedOutArgs
	w, err := argsWorkspace(ac, &a, &a.WorkspaceID)
	if err != nil {
		return nil, err
	}
	switch {
	case w.EndsAt == nil || !w.EndsAt.Equal(a.EndsAt):
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s no longer ends at %s (a start, resume or set-timeout moved its end): its end is read again", w.WorkspaceID, a.EndsAt.UTC().Format(time.RFC3339))
	case at(ac.e).Before(*w.EndsAt):
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s ends at %s, after this entry's time %s: a timeout never fires early", w.WorkspaceID, w.EndsAt.Format(time.RFC3339Nano), at(ac.e).Format(time.RFC3339Nano))
	}
	plan := timeoutPlan(w)
	if plan == planWait {
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is %s: its timeout action %s waits until that is done", w.WorkspaceID, stateWithPending(w), w.OnTimeout)
	}
	old := cloneWorkspace(w)
	w.EndsAt = nil
	switch plan {
	case planDelete:
		w, err = deleteWorkspaceNow(ac, old, w)
	case planStop, planStopForce:
		w, err = stopWorkspace(ac, old, w, plan == planStopForce)
	case planPause:
		w, err = pauseWorkspace(ac, old, w)
	default:
		err = putWorkspace(ac, old, w)
	}
	if err != nil {
		return nil, err
	}
	if plan != planClear {
		if err := countTimeout(ac.tx, old.Namespace, plan); err != nil {
			return nil, err
		}
	}
	return TimedOut{Workspace: w, Did: plan}, nil
}

// The ends index: end (Unix ns, 8 bytes big-endian) ‖ workspace id → nil,
// every Workspace with an end, soonest first, so that the leader's
// service reads only the ends that passed. It is this build's, like the
// pending commands' index (pending.go): marked with the FSM clock as of
// which it matched the records (keyWorkspaceEndsAt), and built anew at a
// Restore that finds another mark.

func endKey(end time.Time, id string) []byte {
	k := make([]byte, 8, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(end.UnixNano()))
	return append(k, id...)
}

func endKeyOf(w *api.Workspace) []byte {
	if w == nil || w.EndsAt == nil {
		return nil
	}
	return endKey(*w.EndsAt, w.WorkspaceID)
}

// moveEnds keeps the index in step with a Workspace write (old nil: a new
// Workspace; w nil: a deleted one).
func moveEnds(ac *applyCtx, old, w *api.Workspace) error {
	from, to := endKeyOf(old), endKeyOf(w)
	if bytes.Equal(from, to) {
		return nil
	}
	idx := ac.tx.Bucket(bucketWorkspaceEnds)
	if from != nil {
		if err := idx.Delete(from); err != nil {
			return err
		}
	}
	if to != nil {
		return idx.Put(to, nil)
	}
	return nil
}

// DueEnd is a Workspace whose end has passed.
type DueEnd struct {
	WorkspaceID string
	EndsAt      time.Time
	OnTimeout   string
	// Waits: the action waits for what is in flight (timeoutPlan); the
	// record changes when that ends, and the end is due again.
	Waits bool
}

// DueEnds returns up to limit Workspaces whose end is at or before now,
// soonest first, reading only those.
func DueEnds(tx *bolt.Tx, now time.Time, limit int) ([]DueEnd, error) {
	var out []DueEnd
	c := tx.Bucket(bucketWorkspaceEnds).Cursor()
	for k, _ := c.First(); k != nil && len(out) < limit; k, _ = c.Next() {
		if len(k) <= 8 {
			continue
		}
		end := time.Unix(0, int64(binary.BigEndian.Uint64(k[:8]))).UTC()
		if end.After(now) {
			break
		}
		w, err := getWorkspace(tx, string(k[8:]))
		if err != nil {
			return nil, err
		}
		if w == nil || w.EndsAt == nil {
			continue
		}
		out = append(out, DueEnd{WorkspaceID: w.WorkspaceID, EndsAt: *w.EndsAt, OnTimeout: w.OnTimeout, Waits: timeoutPlan(w) == planWait})
	}
	return out, nil
}

// checkWorkspaceEnds keeps the index a restored state brings if it is
// marked at the state's clock, and builds it anew otherwise.
func checkWorkspaceEnds(tx *bolt.Tx) error {
	return checkDerived(tx, keyWorkspaceEndsAt, func() bool { return true }, rebuildWorkspaceEnds)
}

// rebuildWorkspaceEnds makes the index anew from the Workspace records.
// A record that does not decode gets no entry (and fails every read of it
// as before) rather than failing the restore of the state.
func rebuildWorkspaceEnds(tx *bolt.Tx) error {
	idx, err := freshBucket(tx, bucketWorkspaceEnds)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketWorkspaces).ForEach(func(k, v []byte) error {
		var w struct {
			EndsAt *time.Time `json:"ends_at"`
		}
		if jsonRecord(bucketWorkspaces, k, v, &w) != nil || w.EndsAt == nil {
			return nil
		}
		return idx.Put(endKey(*w.EndsAt, string(k)), nil) // keyed by id (wsKey)
	})
}
