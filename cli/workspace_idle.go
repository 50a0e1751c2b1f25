package cli

import (
	"fmt"
	"time"

	"github.com/kibotos/kibotos/api"
)

// idleTimeoutFlag checks create's --idle-timeout ("" for none).
func idleTimeoutFlag(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	d, err := api.ParseTimeout(s)
	if err != nil {
		return "", usagef("--idle-timeout: %s", err.Error())
	}
	if d == 0 {
		return "", usagef("--idle-timeout 0: leave it out for a Workspace that is never paused for idleness")
	}
	return s, nil
}

// idleText is the idle timeout and what it does, for get.
func idleText(ws *api.Workspace) string {
	return fmt.Sprintf("%s without a connection and with a quiet guest, then pause", api.FormatTimeout(ws.IdleTimeoutDuration()))
}

// idleFor is how long the node's last report says the Workspace has been
// idle, as of now: "3m", "40s".
func idleFor(ws *api.Workspace, now time.Time) string {
	return api.FormatTimeout(shownDuration(ws.Idle.IdleFor(now)))
}
