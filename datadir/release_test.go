package datadir

import (
	"os"
	"strings"
	"testing"
)

// No rollback: once 0.4.0 ran a member, 0.3.x refuses to start on it
// (and writes nothing); 0.4.0, a later release and unreleased builds run.
func TestNoRollback(t *testing.T) {
	d := Dir(t.TempDir())
	for _, r := range []string{"", "0.3.0", "0.4.0-beta.1"} {
		if err := d.CheckRelease(r); err != nil {
			t.Fatalf("fresh directory, release %q: %v", r, err)
		}
	}
	if err := d.RecordRelease(""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.ReleaseFile()); !os.IsNotExist(err) {
		t.Fatal("an unreleased build recorded itself")
	}
	for _, r := range []string{"0.3.0", "0.4.0", "0.3.9"} { // 0.3.9 after 0.4.0 records nothing
		if err := d.RecordRelease(r); err != nil {
			t.Fatal(err)
		}
	}
	raw, _ := os.ReadFile(d.ReleaseFile())
	for _, c := range []struct {
		release string
		refused bool
	}{{"0.3.9", true}, {"0.4.0-beta.1", true}, {"0.4.0", false}, {"0.4.1", false}, {"1.0.0", false}, {"", false}} {
		err := d.CheckRelease(c.release)
		if (err != nil) != c.refused {
			t.Errorf("release %q after 0.4.0: %v", c.release, err)
		}
		if err != nil && !strings.Contains(err.Error(), "was run by kibotos 0.4.0; this is "+c.release+" and there is no rollback") {
			t.Errorf("message: %v", err)
		}
	}
	if now, _ := os.ReadFile(d.ReleaseFile()); string(now) != string(raw) || !strings.Contains(string(raw), `"newest":"0.4.0"`) {
		t.Errorf("release record %s, then %s", raw, now)
	}
}
