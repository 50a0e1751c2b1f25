package cli

import (
	"slices"
	"testing"

	"github.com/creack/pty"
)

// A terminal that does not know its size (0x0, as under script(1)) gives
// no size, so a Workspace terminal keeps 24x80 instead of a size programs
// in the guest refuse; a known size is passed on.
func TestTermSize(t *testing.T) {
	master, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	defer tty.Close()
	if err := pty.Setsize(master, &pty.Winsize{}); err != nil {
		t.Fatal(err)
	}
	if r, c, err := termSize(tty); err == nil {
		t.Errorf("size of a 0x0 terminal: %dx%d; want an error", r, c)
	}
	if err := pty.Setsize(master, &pty.Winsize{Rows: 30, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	if r, c, err := termSize(tty); err != nil || r != 30 || c != 100 {
		t.Errorf("size of a 30x100 terminal: %dx%d, %v", r, c, err)
	}
}

// -e takes KEY=VALUE, or KEY alone for kibo's own value, which must be
// set; a KEY is required.
func TestExecEnv(t *testing.T) {
	t.Setenv("KIBO_TEST_SET", "from here")
	got, err := execEnv("-e", []string{"A=1", "B=", "KIBO_TEST_SET", "C=x=y"})
	if want := []string{"A=1", "B=", "KIBO_TEST_SET=from here", "C=x=y"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("execEnv: %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{"KIBO_TEST_UNSET_X", "=v", "", "A=\x00"} {
		if _, err := execEnv("-e", []string{bad}); err == nil {
			t.Errorf("execEnv(%q): no error", bad)
		}
	}
}
