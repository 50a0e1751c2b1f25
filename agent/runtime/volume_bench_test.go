package runtime_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// volumeBenchBytes is what each sequential run covers (and the span of
// the random ones).
const volumeBenchBytes = 128 << 20

// BenchmarkVolumeIO measures I/O inside a real guest on a Volume (ext4 in
// a raw file of a pool, made like the node makes it, attached by serial
// and mounted like the node mounts it) against the same kind of file used
// by QEMU directly, a raw disk the guest writes without a filesystem:
// sequential write and read in MB/s and 4 KiB random writes and reads in
// IO/s, all O_DIRECT in the guest, median of the runs, with the ratios
// Volume / raw disk. Under TCG the guest's CPU bounds both.
//
//	go test ./agent/runtime -run X -bench VolumeIO -benchtime 3x
func BenchmarkVolumeIO(b *testing.B) {
	h := newHarness(b)
	inst := platformFixture(b)
	rt := h.mustOpen(b)
	ctx := testCtx(b, 30*time.Minute)
	pool := filepath.Join(h.scratch, "pool", "volumes", "data")
	vol := runtime.VolumeDisk{Serial: "bench-fs", Path: filepath.Join(pool, "vol-bench.img")}
	raw := runtime.VolumeDisk{Serial: "bench-raw", Path: filepath.Join(pool, "raw-bench.img")}
	if err := storagepool.CreateVolume(ctx, "node-a", vol.Path, 2*volumeBenchBytes); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(raw.Path, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(raw.Path, 2*volumeBenchBytes); err != nil {
		b.Fatal(err)
	}
	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: "vio", Installation: inst, VCPUs: 1, MemoryMiB: 256, Volumes: []runtime.VolumeDisk{vol, raw}}); err != nil {
		b.Fatal(err)
	}
	c, err := rt.Guest("vio")
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Configure(ctx, guestproto.ConfigureRequest{Mounts: []guestproto.Mount{
		{Source: guestproto.MountSerialPrefix + vol.Serial, Target: "/vol", FSType: "ext4", Options: []string{guestproto.MountOptGrow}}}}); err != nil {
		b.Fatal(err)
	}
	dev := guestShell(b, ctx, rt, `for d in /sys/block/vd*; do [ "$(cat $d/serial)" = `+raw.Serial+` ] && echo /dev/${d##*/}; done`)
	if dev == "" {
		b.Fatal("the raw disk is not in the guest")
	}
	tool := filepath.Join(h.scratch, "volumeio")
	build := exec.Command("go", "build", "-o", tool, "github.com/kibotos/kibotos/bench/volumeio")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build bench/volumeio: %v: %s", err, out)
	}
	f, err := os.Open(tool)
	if err != nil {
		b.Fatal(err)
	}
	_, err = c.WriteFile(ctx, "/volumeio", 0o755, f)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	modes := []string{"seqwrite", "seqread", "randwrite", "randread"}
	// measure runs one mode on path and returns MB/s (sequential) or IO/s.
	measure := func(path, mode string) float64 {
		out := guestShell(b, ctx, rt, "/volumeio -path "+path+" -mode "+mode+" -size "+strconv.Itoa(volumeBenchBytes))
		f := strings.Fields(out)
		if len(f) != 5 {
			b.Fatalf("volumeio %s %s: %q", path, mode, out)
		}
		col := 3
		if strings.HasPrefix(mode, "rand") {
			col = 4
		}
		v, err := strconv.ParseFloat(f[col], 64)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	onVolume, onRaw := map[string][]float64{}, map[string][]float64{}
	for _, m := range modes { // warm up: allocate the file, fault the tool in
		measure("/vol/f", m)
		measure(dev, m)
	}
	b.ResetTimer()
	for range b.N {
		for _, m := range modes {
			onVolume[m] = append(onVolume[m], measure("/vol/f", m))
			onRaw[m] = append(onRaw[m], measure(dev, m))
		}
	}
	b.StopTimer()
	median := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
	units := map[string]string{"seqwrite": "MB/s", "seqread": "MB/s", "randwrite": "IOPS", "randread": "IOPS"}
	for _, m := range modes {
		v, r := median(onVolume[m]), median(onRaw[m])
		b.ReportMetric(v, "volume-"+m+"-"+units[m])
		b.ReportMetric(r, "raw-"+m+"-"+units[m])
		b.ReportMetric(v/r, "ratio-"+m)
		b.Logf("%s: Volume %.1f %s, raw disk %.1f %s (%.2f×)", m, v, units[m], r, units[m], v/r)
	}
}

// guestShell runs a shell command in the guest agent's root and returns
// its output; a failure stops the benchmark.
func guestShell(b *testing.B, ctx context.Context, rt *runtime.Runtime, script string) string {
	b.Helper()
	r, err := run(ctx, rt, "vio", guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", script}}, nil)
	if err != nil || r.exit.ExitCode != 0 {
		b.Fatalf("%s in the guest: %+v, %v", script, r, err)
	}
	return strings.TrimSpace(r.stdout)
}
