package generations_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/generations"
	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

func TestMain(m *testing.M) {
	// The private systemd of these tests is this test binary, re-executed.
	privsd.RunIfInit()
	os.Exit(m.Run())
}

// sleeper is a generation whose process only waits: ready when the
// marker file its command line names exists.
func sleeper(dir string) func(gen uint64) units.Spec {
	return func(gen uint64) units.Spec {
		marker := filepath.Join(dir, "ready-"+strconv.FormatUint(gen, 10))
		return units.Spec{Description: "generations test", Slice: units.DataPlaneSlice, Argv: []string{"/bin/sh", "-c", "touch " + marker + " && exec sleep 600"}}
	}
}

func ready(dir string, gen uint64) func(context.Context) error {
	return func(context.Context) error {
		_, err := os.Stat(filepath.Join(dir, "ready-"+strconv.FormatUint(gen, 10)))
		return err
	}
}

// A series numbers its units from its counter, finds them again after a
// restart (a fresh Series, as a restarted node has), never hands a number
// out twice, and stops what runs.
func TestSeriesStartFindStop(t *testing.T) {
	if err := privsd.Available(); err != nil {
		testenv.Skipf(t, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	_, m := runtimetest.Systemd(t, filepath.Join(dir, "sd"))
	earlier := filepath.Join(dir, "earlier", "counter")
	if err := os.MkdirAll(filepath.Dir(earlier), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := units.WriteGenerationCounter(earlier, 4); err != nil {
		t.Fatal(err)
	}
	newSeries := func() *generations.Series {
		return &generations.Series{Units: m, Prefix: "kibotos-gentest-", Scope: "s1", Counter: filepath.Join(dir, "state", "counter"),
			EarlierCounters: []string{earlier}, Who: "gentest", StopTimeout: 10 * time.Second}
	}

	s := newSeries()
	if got, err := s.Running(ctx); err != nil || len(got) != 0 {
		t.Fatalf("running before any start: %v, %v", got, err)
	}
	var started []generations.Process
	for range 2 {
		p, err := s.Start(ctx, sleeper(dir))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.AwaitReady(ctx, p, 15*time.Second, "", ready(dir, p.Generation)); err != nil {
			t.Fatal(err)
		}
		started = append(started, p)
	}
	// The earlier build's counter said 4: numbering goes on after it.
	if started[0].Generation != 5 || started[1].Generation != 6 || started[1].Unit != "kibotos-gentest-s1-6.service" {
		t.Fatalf("started %+v, want generations 5 and 6", started)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "state", "counter")); err != nil || string(b) != "6\n" {
		t.Fatalf("counter %q, %v; want 6", b, err)
	}

	// Another scope's unit is not this series'.
	other := &generations.Series{Units: m, Prefix: "kibotos-gentest-", Scope: "s10", Counter: filepath.Join(dir, "other", "counter"), Who: "gentest", StopTimeout: 10 * time.Second}
	if _, err := other.Start(ctx, sleeper(dir)); err != nil {
		t.Fatal(err)
	}

	restarted := newSeries()
	running, err := restarted.Running(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(running) != 2 || running[0] != started[1] || running[1] != started[0] {
		t.Fatalf("running %+v, want %+v newest first", running, started)
	}

	// The unit of a generation that ended is gone; stop waits first for
	// one that exits by itself.
	if err := restarted.Stop(ctx, started[0].Unit, 0); err != nil {
		t.Fatal(err)
	}
	if gone, how := restarted.Gone(ctx, started[0].Unit); !gone {
		t.Fatalf("generation 5 still runs after Stop (%s)", how)
	}
	if n, err := restarted.StopAll(ctx); err != nil || n != 1 {
		t.Fatalf("StopAll: %d, %v; want the one still running", n, err)
	}
	if n, err := other.StopAll(ctx); err != nil || n != 1 {
		t.Fatalf("StopAll of the other scope: %d, %v", n, err)
	}
	// The counter goes on from the highest number even with nothing left.
	if p, err := restarted.Start(ctx, sleeper(dir)); err != nil || p.Generation != 7 {
		t.Fatalf("next start: %+v, %v; want generation 7", p, err)
	}
	restarted.StopAll(ctx)
}

// A generation whose process exits before it answers fails its start
// with ErrExited, which tells the caller there is nothing left to stop.
func TestAwaitReadyExited(t *testing.T) {
	if err := privsd.Available(); err != nil {
		testenv.Skipf(t, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	_, m := runtimetest.Systemd(t, filepath.Join(dir, "sd"))
	s := &generations.Series{Units: m, Prefix: "kibotos-gentest-", Scope: "s1", Counter: filepath.Join(dir, "counter"), Who: "gentest", StopTimeout: 10 * time.Second}
	p, err := s.Start(ctx, func(uint64) units.Spec {
		// It lives a moment: a unit that exits at once fails StartService
		// itself, before there is anything to wait for.
		return units.Spec{Description: "generations test", Slice: units.DataPlaneSlice, Argv: []string{"/bin/sh", "-c", "sleep 1; exit 3"}}
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.AwaitReady(ctx, p, 15*time.Second, "the hint", func(context.Context) error { return errors.New("not yet") })
	if !errors.Is(err, generations.ErrExited) {
		t.Fatalf("AwaitReady: %v, want ErrExited", err)
	}
	if !strings.Contains(err.Error(), p.Unit) || !strings.Contains(err.Error(), "the hint") {
		t.Fatalf("AwaitReady: %v: want the unit and the hint named", err)
	}
}
