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
	elapsed, ok, observed := poll(time.Duration(float64(timeout)*scale), cond)
	if !ok {
		msg := fmt.Sprintf("timed out after %v waiting for %s", elapsed, what)
		if scale != 1 {
			msg = fmt.Sprintf("timed out after %v (%v × %s=%v) waiting for %s", elapsed, timeout, TimeScaleEnv, scale, what)
		}
		if observed != "" {
			msg += "; last observed: " + observed
		}
		t.Fatalf("%s", msg)
	}
	return elapsed
}

// Poll checks cond like WaitFor but only reports whether it held within
// timeout (times KIBOTOS_TIME_SCALE): for a goroutine other than the
// test's, and for a test that reports what it found after the wait
// rather than failing at once.
func Poll(t testing.TB, timeout time.Duration, cond func() bool) bool {
	t.Helper()
	_, ok, _ := poll(time.Duration(float64(timeout)*timeScale(t)), func() (bool, string) { return cond(), "" })
	return ok
}

// poll checks cond, first again after firstPoll then ever less often up
// to maxPoll, until it holds or limit has passed.
func poll(limit time.Duration, cond func() (bool, string)) (time.Duration, bool, string) {
	start := time.Now()
	wait := firstPoll
	for {
		ok, observed := cond()
		elapsed := time.Since(start)
		if ok {
			return elapsed, true, ""
		}
		if elapsed >= limit {
			return limit, false, observed
		}
		time.Sleep(min(wait, limit-elapsed))
		wait = min(2*wait, maxPoll)
	}
}
