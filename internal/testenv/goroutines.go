package testenv

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Goroutines are the goroutines alive at one moment, by id.
type Goroutines map[string]bool

// LiveGoroutines notes the goroutines alive now: what a test starts after
// it is checked against them by WaitGoroutinesEnd.
func LiveGoroutines() Goroutines {
	out := Goroutines{}
	for _, g := range goroutineStacks() {
		out[goroutineID(g)] = true
	}
	return out
}

// WaitGoroutinesEnd fails t unless every goroutine started since before
// that runs code of a package under module (e.g.
// "github.com/kibotos/kibotos/cluster") ends within timeout: whatever
// started it was stopped and must have waited for it. The message holds
// the stacks of those left.
func WaitGoroutinesEnd(t testing.TB, before Goroutines, module string, timeout time.Duration) {
	t.Helper()
	WaitFor(t, timeout, "the goroutines of "+module+" to end", func() (bool, string) {
		var left []string
		for _, g := range goroutineStacks() {
			if !before[goroutineID(g)] && strings.Contains(g, module) {
				left = append(left, g)
			}
		}
		return len(left) == 0, strings.Join(left, "\n\n")
	})
}

// goroutineStacks are the stacks of every goroutine but the caller's.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := strings.Split(string(bytes.TrimSpace(buf)), "\n\n")
	return stacks[1:] // the first is the caller's own
}

// goroutineID is "goroutine 42" of a stack's first line.
func goroutineID(stack string) string {
	head, _, _ := strings.Cut(stack, " [")
	return head
}
