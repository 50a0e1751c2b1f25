package cli

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// lockedBuffer is the guest's stdin stream: written by the copy, read by
// the test, closed once.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	closed int
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed++
	return nil
}

func (l *lockedBuffer) state() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String(), l.closed
}

// Piped input is forwarded to its end, and the guest's stdin is closed then.
func TestCopyInputForwardsToTheEnd(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	dst := &lockedBuffer{}
	stop, err := copyInput(dst, r)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("line one\nline two\n")
	w.Close()
	testenv.WaitFor(t, 10*time.Second, "the copy to reach the input's end", func() (bool, string) {
		got, n := dst.state()
		return n > 0, fmt.Sprintf("forwarded %q, closed %d times", got, n)
	})
	stop()
	if got, _ := dst.state(); got != "line one\nline two\n" {
		t.Fatalf("forwarded %q, want both lines", got)
	}
}

// An input that never ends (a terminal nobody types on) does not keep the
// command from returning: stop ends the copy.
func TestCopyInputStopsOnOpenInput(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	dst := &lockedBuffer{}
	stop, err := copyInput(dst, r)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("typed\n")
	testenv.WaitFor(t, 10*time.Second, "the typed line to be forwarded", func() (bool, string) {
		got, _ := dst.state()
		return got == "typed\n", fmt.Sprintf("forwarded %q", got)
	})
	stop()
	if _, closed := dst.state(); closed == 0 {
		t.Fatal("the guest's stdin was not closed when the copy stopped")
	}
}
