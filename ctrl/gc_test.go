package ctrl

import (
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
)

// The collector keeps an unreferenced object younger than the age asked,
// lists it under a dry run, and removes it otherwise; a named object (a
// Transfer archive) is never its to remove.
func TestCollectArtifacts(t *testing.T) {
	ctx := t.Context()
	st, err := artifacts.NewDir(filepath.Join(t.TempDir(), "store"), "n1")
	if err != nil {
		t.Fatal(err)
	}
	obj, err := st.Put(ctx, strings.NewReader("an image no catalog entry names"), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutNamed(ctx, "transfers/default/tr-1.tar", strings.NewReader("an archive")); err != nil {
		t.Fatal(err)
	}
	l := New(Config{NodeID: "n1", Cluster: newFake(t, false), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	collect := func(age time.Duration, dryRun bool) string {
		t.Helper()
		res, err := l.CollectArtifacts(ctx, st, age, dryRun)
		if err != nil {
			t.Fatal(err)
		}
		var actions []string
		for _, o := range res.Objects {
			if o.Digest != string(obj.Digest) {
				t.Fatalf("gc handled %s, which is not the unreferenced object %s", o.Digest, obj.Digest)
			}
			actions = append(actions, o.Action)
		}
		return strings.Join(actions, ",")
	}
	if got := collect(time.Hour, false); got != api.GCKeptYoung {
		t.Fatalf("gc of a young object: %q, want %s", got, api.GCKeptYoung)
	}
	if got := collect(0, true); got != api.GCWouldRemove {
		t.Fatalf("gc --dry-run: %q, want %s", got, api.GCWouldRemove)
	}
	if got := collect(0, false); got != api.GCRemoved {
		t.Fatalf("gc: %q, want %s", got, api.GCRemoved)
	}
	if _, err := st.Stat(ctx, obj.Digest); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("removed object still stat'ed: %v", err)
	}
	if _, err := st.StatNamed(ctx, "transfers/default/tr-1.tar"); err != nil {
		t.Fatalf("the named archive went with the gc: %v", err)
	}
}
