package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// create --env: repeated, a value with commas and '=' kept whole, NAME
// alone read from the CLI's environment; show and --json list the names
// and never a value; a bad variable is invalid_argument naming the
// Workspace and the variable; --env with --from is a usage error; below
// LevelWorkspaceEnv the leader refuses it (an older voter would drop it).
func TestWorkspaceCreateEnv(t *testing.T) {
	var mu sync.Mutex
	tasks := map[string][]string{} // a start task's Env, by Workspace
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1,
		AdjustReport: func(_ string, r *api.Report) { r.Templates = append(r.Templates, "kibotos-coding") },
		HoldTask: func(_ string, task api.WorkspaceTask) bool {
			if task.Command.Kind == api.WSCmdStart {
				mu.Lock()
				tasks[task.WorkspaceID] = task.Env
				mu.Unlock()
			}
			return true
		}})
	t.Setenv("KIBO_TEST_TOKEN", "s3cret-from-env")
	id := strings.TrimSpace(e.mustRun("workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "-q",
		"--env", "LIST=a,b=c", "--env", "KIBO_TEST_TOKEN", "--env", "A=s3cret-inline"))
	// The node that starts it gets the values, sorted by name.
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		env, ok := tasks[id]
		return ok && strings.Join(env, " ") == "A=s3cret-inline KIBO_TEST_TOKEN=s3cret-from-env LIST=a,b=c", fmt.Sprintf("start task env %q", env)
	})
	out := e.mustRun("workspace", "get", id, "--consistent")
	if !strings.Contains(out, "A,KIBO_TEST_TOKEN,LIST") || strings.Contains(out, "s3cret") {
		t.Errorf("workspace get shows no names, or a value:\n%s", out)
	}
	raw := e.mustRun("workspace", "get", id, "--json", "--consistent")
	var got struct {
		Result api.Workspace `json:"result"`
	}
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got.Result.EnvNames, ",") != "A,KIBO_TEST_TOKEN,LIST" || strings.Contains(raw, "s3cret") {
		t.Errorf("workspace get --json: names %q, or a value in %s", got.Result.EnvNames, raw)
	}
	if list := e.mustRun("workspace", "list", "--json", "--consistent"); strings.Contains(list, "s3cret") {
		t.Errorf("workspace list --json shows a value: %s", list)
	}

	e.expectExit(api.ExitInvalidArgument, `: environment variable name "1A" is not valid`,
		"workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "--env", "1A=x")
	e.expectExit(api.ExitInvalidArgument, "environment variable A is given twice",
		"workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "--env", "A=1", "--env", "A=2")
	e.expectExit(api.ExitUsage, "--env KIBO_TEST_UNSET: KIBO_TEST_UNSET is not set here",
		"workspace", "create", "--template", "kibotos-coding", "--env", "KIBO_TEST_UNSET")
	e.expectExit(api.ExitUsage, "--env with --from", "workspace", "create", "--from", id, "--env", "A=1")

	e = newCLIEnv(t, clustertest.Options{Ctrl: 2, FeatureLevels: map[string]int{"node-2": 15}})
	e.expectExit(api.ExitFailedPrecondition, "workspace create with environment variables needs every ctrl voter at feature level 16",
		"workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "--env", "A=1")
}
