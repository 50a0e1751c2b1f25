package runtime

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestLaunchRecordRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vm-1")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := &LaunchRecord{
		InstanceID: "vm-1", LaunchID: "abc", Unit: UnitName("vm-1"), Backend: "qemu",
		Argv: []string{"/bin/sh", "-c", "x"}, VMMArgv: []string{"/usr/bin/qemu-system-x86_64"},
		InstallationID: "sha256-1", CreatedAt: time.Unix(1, 0).UTC(),
		Volumes: []VolumeDisk{{Serial: "vol-1", Path: "/pool/volumes/data/vol-1.img"}},
		Process: &ProcessRecord{InvocationID: "0123", MainPID: 7, HostPID: 700, StartTime: 99, Exe: "/q", ExeDev: 1, ExeIno: 2, ControlGroup: "/cg"},
	}
	if err := WriteLaunchRecord(dir, rec); err != nil {
		t.Fatal(err)
	}
	got, err := ReadLaunchRecord(filepath.Join(dir, LaunchRecordFile))
	if err != nil {
		t.Fatal(err)
	}
	if got.FormatVersion != RecordVersion || !reflect.DeepEqual(got, rec) {
		t.Errorf("read back %+v, want %+v", got, rec)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %d entries after an atomic write, want 1 (no temp file left)", len(ents))
	}
}

// The network section of a record: one written before IPv6 (no IPv6
// keys) reads as a guest without IPv6, a record without IPv6 is written
// without them (as that build wrote it), and one with IPv6 round-trips.
func TestNetworkRecordIPv6(t *testing.T) {
	old := `{"namespace":"kibotos-vm-1","guest_ipv4":"10.213.0.1","host_veth":"kb-0123456789ab","policy":{"egress":"public"},` +
		`"ipv4_pool":"10.213.0.0/16","uplink":"eth0","resolver":"10.0.0.2:53","management_cidrs":["10.0.0.0/24"]}`
	var nr NetworkRecord
	if err := json.Unmarshal([]byte(old), &nr); err != nil {
		t.Fatal(err)
	}
	if nr.Guest6.IsValid() || nr.Pool6.IsValid() || nr.Guest != netip.MustParseAddr("10.213.0.1") {
		t.Fatalf("record of a build before IPv6 read as %+v", nr)
	}
	b, err := json.Marshal(nr)
	if err != nil || string(b) != old {
		t.Fatalf("written again as %s (%v), want the same bytes", b, err)
	}
	nr.Guest6, nr.Pool6 = netip.MustParseAddr("fd6b:6b00:1::1"), netip.MustParsePrefix("fd6b:6b00:1::/64")
	b, _ = json.Marshal(nr)
	var back NetworkRecord
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, nr) {
		t.Fatalf("IPv6 record %s read back as %+v, %v", b, back, err)
	}
	if !strings.Contains(string(b), `"guest_ipv6":"fd6b:6b00:1::1"`) || !strings.Contains(string(b), `"ipv6_pool":"fd6b:6b00:1::/64"`) {
		t.Errorf("IPv6 record written as %s", b)
	}
}

func TestLaunchRecordRefusals(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vm-2")
	os.Mkdir(dir, 0o700)
	path := filepath.Join(dir, LaunchRecordFile)
	for _, tc := range []struct {
		name, body, want string
		newer            bool
	}{
		{"newer", `{"format_version": 2, "instance_id": "vm-2", "launch_id": "x", "unit": "u"}`, "has version 2, this build reads [1]", true},
		{"foreign unit", `{"format_version": 1, "instance_id": "vm-2", "launch_id": "x", "unit": "kibotos-vmm-other.service"}`, "names unit", false},
		{"corrupt", `{"format_version": 1,`, "corrupt", false},
		{"no version", `{"instance_id": "vm-2", "launch_id": "x", "unit": "u"}`, "no format version", false},
		{"incomplete", `{"format_version": 1, "instance_id": "vm-2"}`, "incomplete", false},
		{"wrong dir", `{"format_version": 1, "instance_id": "vm-9", "launch_id": "x", "unit": "kibotos-vmm-vm-9.service"}`, "directory", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := ReadLaunchRecord(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("ReadLaunchRecord: %v; want an error naming %s and saying %q", err, path, tc.want)
			}
			if errors.Is(err, ErrNewerRecord) != tc.newer {
				t.Errorf("errors.Is(ErrNewerRecord) = %v, want %v", !tc.newer, tc.newer)
			}
		})
	}
	reg := filepath.Join(t.TempDir(), "vm-2.json")
	os.WriteFile(reg, []byte(`{"format_version": 3}`), 0o600)
	if _, err := ReadEndedRecord(reg); !errors.Is(err, ErrNewerRecord) {
		t.Errorf("ReadEndedRecord of a newer format: %v", err)
	}
}

func TestReadTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	os.WriteFile(p, []byte(strings.Repeat("a", 100)+"TAIL"), 0o600)
	b, err := readTail(p, 4)
	if err != nil || string(b) != "TAIL" {
		t.Errorf("readTail = %q, %v", b, err)
	}
	if b, _ := readTail(p, 1<<20); len(b) != 104 {
		t.Errorf("readTail of a short file: %d bytes", len(b))
	}
}

func TestWrapLog(t *testing.T) {
	got := wrapLog("/bin/sh", []string{"/usr/bin/qemu", "-a", "b c"})
	want := []string{"/bin/sh", "-c", `exec "$@" >>"$KIBOTOS_VMM_LOG" 2>&1`, "kibotos-vmm", "/usr/bin/qemu", "-a", "b c"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("wrapLog = %q", got)
	}
}

// An Instance made from a warm guest (Adopt) keeps that guest's unit and
// directory, and its record says so (host). Only a warm guest's id is a
// host, and the unit and directory must be the host's.
func TestLaunchRecordHost(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "warm-1")
	os.Mkdir(dir, 0o700)
	path := filepath.Join(dir, LaunchRecordFile)
	rec := &LaunchRecord{InstanceID: "ws-a", Host: "warm-1", LaunchID: "x", Unit: UnitName("warm-1")}
	if err := WriteLaunchRecord(dir, rec); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadLaunchRecord(path); err != nil || got.InstanceID != "ws-a" || got.dirName() != "warm-1" {
		t.Fatalf("record of an adopted Instance: %+v, %v", got, err)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"not a warm guest", `{"format_version": 1, "instance_id": "ws-a", "host": "vm-2", "launch_id": "x", "unit": "kibotos-vmm-vm-2.service"}`, `made from "vm-2", which is not a warm guest's id`},
		{"path in host", `{"format_version": 1, "instance_id": "ws-a", "host": "warm-../../x", "launch_id": "x", "unit": "kibotos-vmm-warm-../../x.service"}`, "not a warm guest's id"},
		{"own unit", `{"format_version": 1, "instance_id": "ws-a", "host": "warm-1", "launch_id": "x", "unit": "kibotos-vmm-ws-a.service"}`, "names unit"},
		{"another warm guest", `{"format_version": 1, "instance_id": "ws-a", "host": "warm-2", "launch_id": "x", "unit": "kibotos-vmm-warm-2.service"}`, "directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadLaunchRecord(path); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadLaunchRecord: %v; want %q", err, tc.want)
			}
		})
	}
}
