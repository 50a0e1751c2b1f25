package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// Records of Instances ctrl never placed stay in the node's registry
// (the upgrade seed): ctrl names them unrecognized in its round, and the
// node's later reports leave them out, so they are not sent round after
// round nor hold back newer records behind the 100-record cap.
func TestUnrecognizedEndedRecordsStay(t *testing.T) {
	runtimetest.RequireVMHost(t)
	scratch, err := os.MkdirTemp("/tmp", "kbe-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratch) })
	_, units := runtimetest.Systemd(t, filepath.Join(scratch, "sd"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := filepath.Join(scratch, "s")
	rt, err := runtime.Open(ctx, runtime.Config{StorageRoot: root, NodeID: "node-2", Units: units, Accel: qemu.AccelAuto})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	var files []string
	for _, id := range []string{"inst-not-ours-1", "inst-not-ours-2"} {
		b, _ := json.Marshal(runtime.EndedRecord{FormatVersion: runtime.RecordVersion, InstanceID: id, EndedAt: time.Now().UTC(), How: "stopped"})
		f := filepath.Join(runtime.RegistryDir(root), id+".json")
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}

	var mu sync.Mutex
	var sent []int // records in each complete list node-2 sent
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, Runtimes: map[string]*runtime.Runtime{"node-2": rt},
		AdjustReport: func(id string, r *api.Report) {
			if id == "node-2" && r.EndedComplete {
				mu.Lock()
				sent = append(sent, len(r.Ended))
				mu.Unlock()
			}
		}})
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		c.Members[1].Agent.PushReport()
		mu.Lock()
		defer mu.Unlock()
		return len(sent) > 1 && sent[len(sent)-1] == 0, "the records are still sent"
	})
	mu.Lock()
	if sent[0] != 2 {
		t.Errorf("the first report sent %d records, want both", sent[0])
	}
	mu.Unlock()
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("an unrecognized record was not kept: %v", err)
		}
	}
}
