package units

import (
	"math"
	"reflect"
	"testing"

	godbus "github.com/godbus/dbus/v5"
)

// TestVMMSpecProperties checks what a confined VMM spec becomes on the bus:
// every confinement field maps to its systemd property with the D-Bus type
// systemd expects (a wrong type fails StartTransientUnit as a whole).
func TestVMMSpecProperties(t *testing.T) {
	spec := Spec{
		Name: "kibotos-vmm-x.service", Argv: []string{"/bin/qemu"}, Slice: VMMSlice,
		LimitMEMLOCKInfinity: true,
		User:                 "kibotos-vmm", Group: "kibotos-vmm", SupplementaryGroups: []string{"kvm"},
		NoNewPrivileges: true, UMask: 0o077,
		MemoryMax: 640 << 20, TasksMax: 66,
		Background: true,
	}
	got := map[string]godbus.Variant{}
	for _, p := range spec.properties(prop("OOMPolicy", "kill")) {
		if _, dup := got[p.Name]; dup {
			t.Errorf("property %s given twice", p.Name)
		}
		got[p.Name] = p.Value
	}
	want := map[string]any{
		"Type": "exec", "Restart": "no", "KillMode": "control-group", "OOMPolicy": "kill",
		"PrivateMounts": false, "CollectMode": "inactive-or-failed", "Slice": VMMSlice,
		"User": "kibotos-vmm", "Group": "kibotos-vmm", "SupplementaryGroups": []string{"kvm"},
		"NoNewPrivileges": true, "UMask": uint32(0o077),
		"LimitMEMLOCK": uint64(math.MaxUint64), "MemoryMax": uint64(640 << 20), "TasksMax": uint64(66),
		"Nice": int32(19), "CPUWeight": uint64(1), "IOWeight": uint64(1),
	}
	for name, v := range want {
		gv, ok := got[name]
		if !ok {
			t.Errorf("property %s missing", name)
			continue
		}
		if !reflect.DeepEqual(gv.Value(), v) {
			t.Errorf("property %s = %#v (%s), want %#v", name, gv.Value(), gv.Signature(), v)
		}
	}

	// An unconfined spec (the data plane) sets none of them.
	plain := Spec{Name: "kibotos-dataplane-x-1.service", Argv: []string{"/bin/kibotos"}, Slice: DataPlaneSlice}
	for _, p := range plain.properties() {
		switch p.Name {
		case "User", "Group", "SupplementaryGroups", "NoNewPrivileges", "UMask", "LimitMEMLOCK", "MemoryMax", "TasksMax",
			"CapabilityBoundingSet", "AmbientCapabilities", "ProtectSystem", "ReadWritePaths", "InaccessiblePaths",
			"Nice", "CPUWeight", "IOWeight":
			t.Errorf("unconfined spec sets %s=%v", p.Name, p.Value)
		}
	}
}

// TestSandboxSpecProperties: the egress unit's sandbox (no capabilities, a
// read-only file system but its socket directory, the state directory
// hidden) with the D-Bus types systemd expects: t for capability masks, s
// for ProtectSystem, as for paths.
func TestSandboxSpecProperties(t *testing.T) {
	spec := Spec{
		Name: "kibotos-egress-x-1.service", Argv: []string{"/bin/kibotos"}, Slice: EgressSlice,
		NoCapabilities: true, ReadOnlyFilesystem: true,
		ReadWritePaths: []string{"/run/kibotos/node-egress"}, InaccessiblePaths: []string{"/var/lib/kibotos/storage/state"},
	}
	got := map[string]godbus.Variant{}
	for _, p := range spec.properties() {
		got[p.Name] = p.Value
	}
	want := map[string]any{
		"CapabilityBoundingSet": uint64(0), "AmbientCapabilities": uint64(0), "ProtectSystem": "strict",
		"ReadWritePaths": []string{"/run/kibotos/node-egress"}, "InaccessiblePaths": []string{"/var/lib/kibotos/storage/state"},
	}
	for name, v := range want {
		gv, ok := got[name]
		if !ok {
			t.Errorf("property %s missing", name)
			continue
		}
		if !reflect.DeepEqual(gv.Value(), v) {
			t.Errorf("property %s = %#v (%s), want %#v", name, gv.Value(), gv.Signature(), v)
		}
	}
}
