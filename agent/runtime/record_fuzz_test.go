package runtime

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recordSeeds are the hostile shapes of a record file a crash, a full disk
// or an older/newer kibotos can leave behind.
var recordSeeds = []string{
	``,
	`{}`,
	`null`,
	`[]`,
	`{"format_version":`,
	`{"format_version":1}`,
	`{"format_version":"1"}`,
	`{"format_version":99999999999999999999}`,
	`{"format_version":-1}`,
	`{"format_version":2,"instance_id":"vm-a"}`,
	`{"format_version":1,"instance_id":"vm-a","launch_id":"l","unit":"kibotos-vmm-vm-a.service"}`,
	`{"format_version":1,"instance_id":"vm-a","launch_id":"l","unit":"kibotos-vmm-vm-a.service","vcpus":1e30,"argv":{"x":1},"process":[1]}`,
	`{"format_version":1,"instance_id":"vm-a","launch_id":"l","unit":"kibotos-vmm-vm-a.service","process":{"main_pid":-1,"start_time":18446744073709551616}}`,
	"{\"format_version\":1,\"instance_id\":\"vm-a\",\"launch_id\":\"l\",\"unit\":\"evil\\nunit\"}",
	"{\"format_version\":1,\"instance_id\":\"vm\\nb\",\"launch_id\":\"l\",\"unit\":\"kibotos-vmm-vm\\nb.service\"}",
	`{"format_version":1,"instance_id":"vm-a","ended_at":"not a time","how":"stopped","launch":{"instance_id":"vm-a"}}`,
	`{"format_version":1,"instance_id":"vm-a","ended_at":"2026-12-01T10:00:00Z","how":"stopped","launch":{"format_version":1,"instance_id":"vm-a","launch_id":"l","unit":"kibotos-vmm-vm-a.service"}}`,
	`{"format_version":1,"instance_id":"vm-other","ended_at":"2026-12-01T10:00:00Z","how":"stopped"}`,
	`{"format_version":1,"unknown":{"a":[[[[{}]]]]}}`,
	"{\"format_version\":1,\"instance_id\":\"vm-a\"}\x00\x00\x00",
	"\xff\xfe\xfd",
}

// fuzzRecordFile writes data at dir/name, calls read on it and checks
// what the node's caller relies on: no panic, an error that is one line
// and names the file, and the file and its directory untouched.
func fuzzRecordFile(t *testing.T, dir, name string, data []byte, read func(path string) error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	err := read(path)
	if err != nil {
		if msg := err.Error(); strings.ContainsAny(msg, "\r\n") || !strings.Contains(msg, path) {
			t.Fatalf("error %q: want one line naming %s", msg, path)
		}
	}
	got, rerr := os.ReadFile(path)
	ents, _ := os.ReadDir(dir)
	if rerr != nil || !bytes.Equal(got, data) || len(ents) != 1 {
		t.Fatalf("reading %s changed it or its directory (%d entries, read %v)", path, len(ents), rerr)
	}
}

func FuzzReadLaunchRecord(f *testing.F) {
	for _, s := range recordSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := filepath.Join(t.TempDir(), "vm-a")
		fuzzRecordFile(t, dir, LaunchRecordFile, data, func(path string) error {
			r, err := ReadLaunchRecord(path)
			if err == nil && (r.InstanceID != "vm-a" || r.Unit != UnitName("vm-a") || r.LaunchID == "" ||
				r.FormatVersion < 1 || r.FormatVersion > RecordVersion) {
				t.Fatalf("accepted a launch record takeover cannot use: %+v", r)
			}
			return err
		})
	})
}

func FuzzReadEndedRecord(f *testing.F) {
	for _, s := range recordSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := filepath.Join(t.TempDir(), "registry")
		fuzzRecordFile(t, dir, "vm-a.json", data, func(path string) error {
			r, err := ReadEndedRecord(path)
			if err == nil && (r.InstanceID != "vm-a" || r.FormatVersion < 1 || r.FormatVersion > RecordVersion) {
				t.Fatalf("accepted an ended-instance record that is not vm-a's: %+v", r)
			}
			return err
		})
	})
}
