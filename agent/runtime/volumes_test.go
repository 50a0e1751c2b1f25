package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// Volumes come after the layer and the scratch disk, raw, each with its
// serial and a drive id QMP can name; the layer carries LayerSerial.
func TestQEMUVolumeDisks(t *testing.T) {
	q := &QEMU{Binary: "/usr/bin/qemu-system-x86_64", Accel: qemu.AccelTCG, TSCKHz: 2000000}
	p := instancePaths("/srv/kibotos/runtime/instances/i1")
	p.Layer = "/pool/layers/ws-1.qcow2"
	spec := Spec{InstanceID: "i1", Installation: &platform.Installation{Dir: "/srv/p"}, RootImage: "/srv/t/root.img",
		Volumes: []VolumeDisk{{Serial: "vol-a", Path: "/pool/volumes/data/vol-a.img"}, {Serial: "vol-b", Path: "/pool/volumes/data/vol-b.img"}}}
	argv, err := q.Argv(spec, p)
	if err != nil {
		t.Fatal(err)
	}
	cmd := strings.Join(argv, " ")
	want := strings.Join([]string{
		"-drive file=/pool/layers/ws-1.qcow2,if=none,id=layer,format=qcow2,backing.driver=raw,backing.file.filename=/srv/t/root.img",
		"-device virtio-blk-device,drive=layer,serial=layer",
		"-drive file=" + p.Disk + ",if=none,id=writable,format=raw -device virtio-blk-device,drive=writable",
		"-drive file=/pool/volumes/data/vol-a.img,if=none,id=v-vol-a,format=raw -device virtio-blk-device,drive=v-vol-a,serial=vol-a",
		"-drive file=/pool/volumes/data/vol-b.img,if=none,id=v-vol-b,format=raw -device virtio-blk-device,drive=v-vol-b,serial=vol-b",
	}, " ")
	if !strings.Contains(cmd, want) {
		t.Errorf("argv lacks the disks in order\n%s\nin\n%s", want, cmd)
	}
}

func TestCheckVolumes(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, nil, 0o600)
		return p
	}
	a, b := file("a.img"), file("b.img")
	if err := checkVolumes([]VolumeDisk{{Serial: "vol-a", Path: a}, {Serial: "vol-b", Path: b}}); err != nil {
		t.Fatalf("two good Volumes: %v", err)
	}
	nine := make([]VolumeDisk, MaxVolumes+1)
	cases := map[string]struct {
		vols []VolumeDisk
		want string
	}{
		"too many":      {nine, "9 volumes: at most 8"},
		"same serial":   {[]VolumeDisk{{Serial: "vol-a", Path: a}, {Serial: "vol-a", Path: b}}, `volume serial "vol-a" given twice`},
		"layer serial":  {[]VolumeDisk{{Serial: LayerSerial, Path: a}}, "is the retained layer's"},
		"bad serial":    {[]VolumeDisk{{Serial: "vol a", Path: a}}, `disk serial "vol a"`},
		"long serial":   {[]VolumeDisk{{Serial: strings.Repeat("v", 21), Path: a}}, "want 1 to 20"},
		"relative path": {[]VolumeDisk{{Serial: "vol-a", Path: "a.img"}}, `volume vol-a: path "a.img" is not absolute`},
		"missing file":  {[]VolumeDisk{{Serial: "vol-a", Path: filepath.Join(dir, "nope.img")}}, "volume vol-a: stat"},
		"directory":     {[]VolumeDisk{{Serial: "vol-a", Path: dir}}, "not a raw image file"},
	}
	for name, tc := range cases {
		if err := checkVolumes(tc.vols); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want %q", name, err, tc.want)
		}
	}
}
