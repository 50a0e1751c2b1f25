package member

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// The clock skew file steps the member's clock and back; what is not a
// duration changes nothing and is logged.
func TestFollowClockSkew(t *testing.T) {
	file := filepath.Join(t.TempDir(), "skew")
	steps := make(chan time.Duration, 8)
	var logs testenv.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		followClockSkew(ctx, file, 0, slog.New(slog.NewTextHandler(&logs, nil)), func(d time.Duration) { steps <- d })
	}()
	defer func() { cancel(); <-done }()

	want := func(d time.Duration) {
		t.Helper()
		select {
		case got := <-steps:
			if got != d {
				t.Fatalf("stepped to %v, want %v", got, d)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no step to %v within 10s", d)
		}
	}
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("90s\n")
	want(90 * time.Second)
	write("a minute")
	write("-2m")
	want(-2 * time.Minute)
	if !strings.Contains(logs.String(), "clock stepped") {
		t.Errorf("no step logged:\n%s", logs.String())
	}
	os.Remove(file)
	want(0)
	write(strings.Repeat("1", maxClockSkewFile+1) + "s")
	write("bad")
	for !strings.Contains(logs.String(), `invalid duration \"bad\"`) {
		select {
		case d := <-steps:
			t.Fatalf("a file without a duration stepped the clock to %v", d)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
