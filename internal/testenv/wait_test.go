package testenv

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestWaitForReturnsWhenTheConditionHolds(t *testing.T) {
	t.Setenv(TimeScaleEnv, "")
	r := &recorder{TB: t}
	calls := 0
	took := WaitFor(r, 10*time.Second, "the third call", func() (bool, string) {
		calls++
		return calls == 3, "call " + strconv.Itoa(calls)
	})
	if r.failed != "" || calls != 3 {
		t.Fatalf("failed %q after %d calls; want success at the third call", r.failed, calls)
	}
	// Two polls in between: 10 ms, then 20 ms.
	if took < 30*time.Millisecond || took > 5*time.Second {
		t.Fatalf("took %v; want the two polls between three calls (30 ms and a little)", took)
	}
}

func TestWaitForHoldingAtOnceDoesNotWait(t *testing.T) {
	r := &recorder{TB: t}
	calls := 0
	took := WaitFor(r, time.Second, "nothing", func() (bool, string) { calls++; return true, "" })
	if r.failed != "" || calls != 1 {
		t.Fatalf("failed %q after %d checks (%v); want a return after the first", r.failed, calls, took)
	}
}

// A timeout fails the test with what it waited for and the last thing the
// condition observed, not the first.
func TestWaitForTimeoutSaysWhatAndLastObserved(t *testing.T) {
	t.Setenv(TimeScaleEnv, "")
	r := &recorder{TB: t}
	calls := 0
	took := WaitFor(r, 300*time.Millisecond, "the light to turn green", func() (bool, string) {
		calls++
		return false, "light red (check " + strconv.Itoa(calls) + ")"
	})
	want := "timed out after 300ms waiting for the light to turn green; last observed: light red (check " + strconv.Itoa(calls) + ")"
	if r.failed != want {
		t.Fatalf("failure %q\nwant %q", r.failed, want)
	}
	if took < 300*time.Millisecond || took > 5*time.Second {
		t.Fatalf("gave up after %v; want 300ms", took)
	}
	// Polls of 10, 20, 40, 80, 100 and the 50 ms left: 7 checks, fewer on
	// a loaded machine; many more would be a busy loop.
	if calls < 2 || calls > 12 {
		t.Fatalf("%d checks in 300ms; want the polling interval to grow from 10 to 100 ms", calls)
	}
}

func TestWaitForTimeoutWithoutObservation(t *testing.T) {
	t.Setenv(TimeScaleEnv, "")
	r := &recorder{TB: t}
	WaitFor(r, 20*time.Millisecond, "the thing", func() (bool, string) { return false, "" })
	if want := "timed out after 20ms waiting for the thing"; r.failed != want {
		t.Fatalf("failure %q, want %q", r.failed, want)
	}
}

func TestWaitForTimeScale(t *testing.T) {
	t.Setenv(TimeScaleEnv, "2.5")
	r := &recorder{TB: t}
	took := WaitFor(r, 40*time.Millisecond, "the thing", func() (bool, string) { return false, "" })
	if took < 100*time.Millisecond {
		t.Fatalf("gave up after %v; want 40ms × 2.5", took)
	}
	if want := "timed out after 100ms (40ms × KIBOTOS_TIME_SCALE=2.5) waiting for the thing"; r.failed != want {
		t.Fatalf("failure %q, want %q", r.failed, want)
	}
}

func TestWaitForBadTimeScale(t *testing.T) {
	for _, v := range []string{"0", "-1", "two", "NaN"} {
		t.Setenv(TimeScaleEnv, v)
		r := &recorder{TB: t}
		WaitFor(r, time.Millisecond, "the thing", func() (bool, string) { return true, "" })
		if !strings.Contains(r.failed, TimeScaleEnv+`="`+v+`"`) {
			t.Errorf("%s=%s: failure %q; want one naming the variable and its value", TimeScaleEnv, v, r.failed)
		}
	}
}

func TestPollReportsWhetherTheConditionHeld(t *testing.T) {
	calls := 0
	if !Poll(t, time.Second, func() bool { calls++; return calls == 3 }) {
		t.Fatalf("Poll reported false after %d calls; want true at the third", calls)
	}
	start := time.Now()
	if Poll(t, 50*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll reported true for a condition that never holds")
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Fatalf("Poll gave up after %v; want 50ms", took)
	}
}
