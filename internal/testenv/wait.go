package testenv

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// TimeScaleEnv names the multiplier of WaitFor's timeouts: a positive
// number, 1 when unset.
const TimeScaleEnv = "KIBOTOS_TIME_SCALE"

// Polling of WaitFor: the first check again after firstPoll, then ever
// longer up to maxPoll, so a condition that holds at once costs little and
// a long wait does not keep a CPU busy.
const (
	firstPoll = 10 * time.Millisecond
	maxPoll   = 100 * time.Millisecond
)

// timeScale is KIBOTOS_TIME_SCALE as a number; a value that is not a
// positive number fails t (a typo must not pass as "no scaling").
func timeScale(t testing.TB) float64 {
	t.Helper()
	v := os.Getenv(TimeScaleEnv)
	if v == "" {
		return 1
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) || f > 1000 {
		t.Fatalf("%s=%q: want a positive number (a multiplier of test timeouts)", TimeScaleEnv, v)
		return 1
	}
	return f
}

// WaitFor checks cond until it holds and returns how long that took. cond
// says whether it holds and, when not, what it observed instead; after
// timeout (times KIBOTOS_TIME_SCALE) the test fails saying what it waited
// for and the last thing cond observed. WaitFor must be called from the
// test's goroutine (it fails the test with Fatalf).
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	scale := timeScale(t)
	limit := time.Duration(float64(timeout) * scale)
	start := time.Now()
	poll := firstPoll
	for {
		ok, observed := cond()
		if ok {
			return time.Since(start)
		}
		elapsed := time.Since(start)
		if elapsed >= limit {
			msg := fmt.Sprintf("timed out after %v waiting for %s", limit, what)
			if scale != 1 {
				msg = fmt.Sprintf("timed out after %v (%v × %s=%v) waiting for %s", limit, timeout, TimeScaleEnv, scale, what)
			}
			if observed != "" {
				msg += "; last observed: " + observed
			}
			t.Fatalf("%s", msg)
			return elapsed
		}
		time.Sleep(min(poll, limit-elapsed))
		poll = min(2*poll, maxPoll)
	}
}
