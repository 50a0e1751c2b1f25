package fsm

import (
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// A Workspace's environment (LevelWorkspaceEnv, api/workspaceenv.go) is
// kept beside its record, in bucketWorkspaceEnv, and not in it: the
// record is what every read, list, write result and command record
// shows, and the values may be secrets. The record keeps the names
// (api.Workspace.EnvNames); the values go only to the node that starts
// the Workspace (TaskEnv). A fork gets its source's, which its restored
// guest holds already; the entry goes with the Workspace's deletion.

// LevelWorkspaceEnv is the level of WorkspaceCreateArgs.Env.
const LevelWorkspaceEnv = 16

// createEnv checks a create's environment and returns it as the
// Workspace keeps it, sorted by name; a fork's is its source's. It writes
// nothing: a create may still be refused after it (putEnv writes).
func createEnv(tx *bolt.Tx, id string, a *WorkspaceCreateArgs, src *api.Workspace) ([]string, error) {
	if src != nil {
		if len(a.Env) > 0 {
			return nil, api.Errorf(api.CodeInvalidArgument, "workspace %s: a fork has the environment of workspace %s, which its guest holds: leave out the environment variables", id, src.WorkspaceID)
		}
		return TaskEnv(tx, src.WorkspaceID)
	}
	env := api.SortedEnv(a.Env)
	return env, api.CheckWorkspaceEnv("workspace "+id, env)
}

// putEnv stores the environment of Workspace id.
func putEnv(tx *bolt.Tx, id string, env []string) error {
	if len(env) == 0 {
		return nil
	}
	return putJSON(tx, bucketWorkspaceEnv, wsKey(id), env)
}

// TaskEnv is the environment of Workspace id, NAME=value sorted by name;
// nil for none.
func TaskEnv(tx *bolt.Tx, id string) ([]string, error) {
	var env []string
	_, err := getJSON(tx, bucketWorkspaceEnv, wsKey(id), &env)
	return env, err
}

// deleteEnv removes a deleted Workspace's environment.
func deleteEnv(tx *bolt.Tx, id string) error {
	return tx.Bucket(bucketWorkspaceEnv).Delete(wsKey(id))
}
