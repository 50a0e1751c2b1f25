package cli

import (
	"fmt"
	"time"

	"github.com/kibotos/kibotos/api"
)

// WorkspaceSetTimeoutCmd is `workspace set-timeout`.
type WorkspaceSetTimeoutCmd struct {
	ID              string  `arg:"" name:"workspace"`
	Timeout         string  `arg:"" optional:"" name:"timeout" help:"How long from now until the timeout action, e.g. 30m or 2h (shorter or longer than before); later starts and resumes run this long too. 0 removes the end and the timeout. May be left out with --idle."`
	OnTimeout       string  `name:"on-timeout" placeholder:"delete|stop|pause" help:"Change the action at the end; default: the Workspace's (delete if it has none)."`
	Idle            string  `name:"idle" placeholder:"DURATION" help:"Change the idle timeout (as create's --idle-timeout); 0 removes it."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Workspace must still be at."`
}

func (c *WorkspaceSetTimeoutCmd) Run(g *Globals) error {
	req, err := c.request()
	if err != nil {
		return err
	}
	var ws api.Workspace
	raw, err := g.call("POST", workspacePath(c.ID, "timeout"), req, &ws)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	idle := ""
	if req.IdleTimeout != nil {
		idle = ", no idle timeout"
		if ws.IdleTimeoutSeconds > 0 {
			idle = ", paused when idle " + api.FormatTimeout(ws.IdleTimeoutDuration())
		}
	}
	g.printf("workspace %s: ends %s%s (version %d)\n", ws.WorkspaceID, endsText(&ws, time.Now()), idle, ws.Version)
	return nil
}

// request is the set-timeout the arguments ask for.
func (c *WorkspaceSetTimeoutCmd) request() (api.WorkspaceTimeoutRequest, error) {
	req := api.WorkspaceTimeoutRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), Timeout: c.Timeout, OnTimeout: c.OnTimeout}
	if c.Idle != "" {
		if _, err := api.ParseTimeout(c.Idle); err != nil {
			return req, usagef("--idle: %s", err.Error())
		}
		req.IdleTimeout = &c.Idle
	}
	if c.Timeout == "" {
		switch {
		case c.Idle == "":
			return req, usagef("give a timeout, --idle, or both")
		case c.OnTimeout != "":
			return req, usagef("--on-timeout without a timeout: give the timeout too")
		}
		return req, nil
	}
	d, err := api.ParseTimeout(c.Timeout)
	if err != nil {
		return req, usagef("%s", err.Error())
	}
	if err := api.CheckTimeoutAction(c.OnTimeout); err != nil {
		return req, usagef("--on-timeout %q: give delete, stop or pause", c.OnTimeout)
	}
	if d == 0 && c.OnTimeout != "" {
		return req, usagef("--on-timeout with a timeout of 0: 0 removes the end; give a timeout to set an action")
	}
	return req, nil
}

// createTimeout is the timeout and action of create's flags.
func createTimeout(timeout, action string) (string, string, error) {
	if timeout == "" {
		if action != "" {
			return "", "", usagef("--on-timeout without --timeout: give the timeout too")
		}
		return "", "", nil
	}
	d, err := api.ParseTimeout(timeout)
	if err != nil {
		return "", "", usagef("--timeout: %s", err.Error())
	}
	if err := api.CheckTimeoutAction(action); err != nil {
		return "", "", usagef("--on-timeout %q: give delete, stop or pause", action)
	}
	if d == 0 {
		return "", "", usagef("--timeout 0: leave it out for a Workspace without an end")
	}
	return timeout, action, nil
}

// endsText is when a Workspace ends and what then happens, "never" for
// no end: "2026-12-06T11:30:00Z (in 4m), then delete".
func endsText(ws *api.Workspace, now time.Time) string {
	if ws.EndsAt == nil {
		return "never"
	}
	return fmt.Sprintf("%s (%s), then %s", stamp(*ws.EndsAt), relative(*ws.EndsAt, now), ws.OnTimeout)
}

// endsColumn is endsText for a table: "in 4m (delete)", "-" for no end.
func endsColumn(ws *api.Workspace, now time.Time) string {
	if ws.EndsAt == nil {
		return "-"
	}
	return fmt.Sprintf("%s (%s)", relative(*ws.EndsAt, now), ws.OnTimeout)
}

// relative says how far t is from now, to the second below a minute and
// to the minute above: "in 4m", "in 1h30m", "12s ago" (an end that
// passed: ctrl acts on it within seconds, or waits for a command in
// flight).
func relative(t, now time.Time) string {
	d := t.Sub(now)
	past := d < 0
	if past {
		d = -d
	}
	s := api.FormatTimeout(shownDuration(d))
	if past {
		return s + " ago"
	}
	return "in " + s
}

// shownDuration rounds d to the second below a minute and to the minute
// above, as durations are shown.
func shownDuration(d time.Duration) time.Duration {
	if d >= time.Minute {
		return d.Round(time.Minute)
	}
	return d.Round(time.Second)
}
