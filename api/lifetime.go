package api

import (
	"strings"
	"time"
)

// Workspace lifetimes. A Workspace with a timeout has an end: the time of
// its latest start or resume plus the timeout (or of its latest
// set-timeout plus the one given). When the end has passed, ctrl does the
// Workspace's timeout action once and clears the end. Times are those of
// the Raft entries that set them (the leader's clock when it accepted the
// command), so a node's clock never moves an end.

// Timeout actions (on_timeout).
const (
	// TimeoutDelete deletes the Workspace; its Volumes stay. The default,
	// as E2B ends a sandbox at its timeout.
	TimeoutDelete = "delete"
	// TimeoutStop stops a running Workspace (its layer stays).
	TimeoutStop = "stop"
	// TimeoutPause pauses a running Workspace (resume brings it back).
	TimeoutPause = "pause"
)

// MaxTimeout bounds a timeout: a year, beyond any sandbox's life.
const MaxTimeout = 366 * 24 * time.Hour

// ParseTimeout reads a timeout as the API takes it: a Go duration
// ("30m", "2h", "90s") of whole seconds, "0" for none.
func ParseTimeout(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, Errorf(CodeInvalidArgument, "timeout %q is not a duration: give e.g. 30m, 2h or 0 for none", s)
	}
	return d, CheckTimeout(d)
}

// CheckTimeout refuses a timeout that is negative, not whole seconds or
// over MaxTimeout.
func CheckTimeout(d time.Duration) error {
	switch {
	case d < 0:
		return Errorf(CodeInvalidArgument, "timeout %s is negative: give a duration such as 30m, or 0 for none", d)
	case d%time.Second != 0:
		return Errorf(CodeInvalidArgument, "timeout %s is not whole seconds: round it to seconds", d)
	case d > MaxTimeout:
		return Errorf(CodeInvalidArgument, "timeout %s is longer than %s: give a shorter one, or 0 for none", d, MaxTimeout)
	}
	return nil
}

// CheckTimeoutAction refuses an on_timeout that is not an action; ""
// is the default (delete).
func CheckTimeoutAction(a string) error {
	switch a {
	case "", TimeoutDelete, TimeoutStop, TimeoutPause:
		return nil
	}
	return Errorf(CodeInvalidArgument, "on_timeout %q is not an action: give delete, stop or pause", a)
}

// WorkspaceTimeoutRequest is `workspace set-timeout`: the Workspace ends
// Timeout from now (a Go duration; "0" clears the end and the timeout),
// and every later start and resume runs that long.
type WorkspaceTimeoutRequest struct {
	WriteMeta
	// Timeout may be "" when IdleTimeout is given: the timeout and the
	// end stay as they are.
	Timeout string `json:"timeout"`
	// OnTimeout replaces the action; "" keeps the Workspace's (delete
	// if it has none).
	OnTimeout string `json:"on_timeout,omitempty"`
	// IdleTimeout, when given, replaces the idle timeout ("0" removes it).
	IdleTimeout *string `json:"idle_timeout,omitempty"`
}

// FormatTimeout shows a timeout of whole seconds compactly: 30m, 2h, 1h30m.
func FormatTimeout(d time.Duration) string {
	s := d.String() // "30m0s", "2h0m0s"
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// TimeoutDuration is the Workspace's timeout, 0 for none.
func (w *Workspace) TimeoutDuration() time.Duration {
	return time.Duration(w.TimeoutSeconds) * time.Second
}
