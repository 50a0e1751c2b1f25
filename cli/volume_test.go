package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/testenv"
)

func (e *cliEnv) volJSON(ref string) api.Volume {
	e.t.Helper()
	var out struct {
		Result api.Volume `json:"result"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("volume", "get", ref, "--json")), &out); err != nil {
		e.t.Fatal(err)
	}
	return out.Result
}

// Volumes through the CLI against a real cluster whose node makes, grows
// and removes the files in its private pool (it runs no VMs): create
// waits for the node, resize grows the file and never shrinks, an
// attached Volume cannot be deleted, a deleted Workspace leaves its
// Volumes, delete removes the file; every command is in the node's
// volume-commands.json.
func TestVolumeCommands(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding") // placed here; the start fails: no VMs
	}})
	pool := agent.DefaultPoolPath(datadir.Dir(e.dataDir))

	out := e.mustRun("volume", "create", "data", "--size", "64MiB")
	v := e.volJSON("data")
	if want := "volume data (" + v.VolumeID + ") created: AVAILABLE, 64.0MiB in pool node-1:default (version 2)\n"; out != want {
		t.Fatalf("create: %q, want %q", out, want)
	}
	file := api.VolumeFilePath(pool, v.VolumeID)
	if st, err := os.Stat(file); err != nil || st.Size() != 64<<20 {
		t.Fatalf("volume file %s: %v %v", file, st, err)
	}
	if list := squash(e.mustRun("volume", "list")); list != "NAME STATE SIZE POOL NODE WORKSPACE data AVAILABLE 64.0MiB node-1:default node-1 -" {
		t.Errorf("list: %q", list)
	}
	if ids := e.mustRun("volume", "list", "-q"); ids != v.VolumeID+"\n" {
		t.Errorf("list -q: %q", ids)
	}
	if got := e.mustRun("volume", "get", v.VolumeID); !strings.Contains(got, "Name:          data") || !strings.Contains(got, "Pool:          node-1:default (standalone)") {
		t.Errorf("get by id:\n%s", got)
	}

	e.expectExit(api.ExitUsage, `--size "big": not a size`, "volume", "create", "x", "--size", "big")
	e.expectExit(api.ExitInvalidArgument, "size 1048576 bytes (1.0MiB) is not valid: give whole MiB from 16MiB to 16TiB", "volume", "create", "x", "--size", "1MiB")
	e.expectExit(api.ExitInvalidArgument, `volume name "Bad" is not valid`, "volume", "create", "Bad", "--size", "1GiB")
	e.expectExit(api.ExitAlreadyExists, "volume name data is taken by "+v.VolumeID, "volume", "create", "data", "--size", "1GiB")
	e.expectExit(api.ExitNotFound, "storage pool nowhere does not exist", "volume", "create", "x", "--size", "1GiB", "--pool", "nowhere")
	e.expectExit(api.ExitNotFound, "volume nope does not exist", "volume", "get", "nope")
	e.expectExit(api.ExitInvalidArgument, "a Volume only grows", "volume", "resize", "data", "--size", "32MiB")
	e.expectExit(api.ExitVersionMismatch, "volume data is at version 2, not the expected 9", "volume", "resize", "data", "--size", "1GiB", "--expected-version", "9")

	if out := e.mustRun("volume", "resize", "data", "--size", "128MiB"); !strings.Contains(out, "resized: AVAILABLE, 128.0MiB") {
		t.Errorf("resize: %q", out)
	}
	if st, err := os.Stat(file); err != nil || st.Size() != 128<<20 {
		t.Fatalf("volume file after resize: %v %v", st, err)
	}

	// Attached to a Workspace (whose start fails: the node runs no VMs).
	ws := strings.TrimSpace(e.mustRun("workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--volume", "data:/data", "--new-volume", "32MiB:/scratch", "--no-wait", "-q"))
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		w := e.wsJSON(ws)
		return w.State == api.WorkspaceFailed, w.State
	})
	if got := e.mustRun("workspace", "get", ws); !strings.Contains(got, "Volumes:           data at /data ("+v.VolumeID+")") || !strings.Contains(got, ws+"-1 at /scratch") {
		t.Errorf("workspace get:\n%s", got)
	}
	e.expectExit(api.ExitUsage, `--volume "data": give VOLUME:/mount/path`, "workspace", "create", "--template", "kibotos-coding", "--volume", "data")
	e.expectExit(api.ExitFailedPrecondition, "volume data is attached to workspace "+ws+" already", "workspace", "create", "--template", "kibotos-coding", "--volume", "data:/data")
	e.expectExit(api.ExitFailedPrecondition, "volume data is attached to workspace "+ws+" at /data: delete the Workspace first", "volume", "delete", "data")
	if list := squash(e.mustRun("volume", "list", "--workspace", ws)); !strings.Contains(list, "data AVAILABLE 128.0MiB node-1:default node-1 "+ws) || !strings.Contains(list, ws+"-1 CREATING 32.0MiB") {
		t.Errorf("list --workspace:\n%s", list)
	}
	e.mustRun("workspace", "delete", ws)
	if got := e.volJSON("data"); got.WorkspaceID != "" || got.Held {
		t.Errorf("after the Workspace was deleted: %+v", got)
	}
	if out := e.mustRun("volume", "delete", "data"); out != "volume data ("+v.VolumeID+") deleted\n" {
		t.Errorf("delete: %q", out)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("volume file after delete: %v", err)
	}
	e.expectExit(api.ExitNotFound, "volume data does not exist", "volume", "get", "data")

	// The node's record of what it did.
	b, err := os.ReadFile(filepath.Join(runtime.RegistryDir(datadir.Dir(e.dataDir).StorageRoot()), runtime.VolumeCommandsFile))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		FormatVersion int `json:"format_version"`
		Commands      []struct {
			Kind     string `json:"kind"`
			State    string `json:"state"`
			VolumeID string `json:"volume_id"`
		} `json:"commands"`
	}
	json.Unmarshal(b, &rec)
	var kinds []string
	for _, c := range rec.Commands {
		if c.VolumeID == v.VolumeID {
			kinds = append(kinds, c.Kind+":"+c.State)
		}
	}
	if rec.FormatVersion != 1 || strings.Join(kinds, " ") != "create:ok resize:ok delete:ok" {
		t.Errorf("volume-commands.json: version %d, commands %v\n%s", rec.FormatVersion, kinds, b)
	}
}
