package guest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// The Workspace's environment (guestproto.CapWorkspaceEnv). The node
// checked the variables against the cluster's rules; the agent only
// refuses what execve could not pass on or what would be taken for
// another variable. Its values may be secrets: errors name the entry by
// its position, never by its text.

// checkWorkspaceEnv says what is wrong with configure's Env.
func checkWorkspaceEnv(env []string) error {
	for i, e := range env {
		name, _, ok := strings.Cut(e, "=")
		if !ok || name == "" || strings.ContainsRune(e, 0) {
			return &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("configure: environment entry %d is not NAME=value without NUL bytes: send the Workspace's variables as the node checked them", i)}
		}
	}
	return nil
}

// setWorkspaceEnv keeps env for every later exec with a Root.
func (a *agent) setWorkspaceEnv(env []string) {
	env = slices.Clone(env)
	a.envMu.Lock()
	a.env = env
	a.envMu.Unlock()
}

// workspaceEnv is the environment kept; callers must not change it.
func (a *agent) workspaceEnv() []string {
	a.envMu.Lock()
	defer a.envMu.Unlock()
	return a.env
}
