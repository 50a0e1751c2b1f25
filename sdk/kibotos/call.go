package kibotos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kibotos/kibotos/api"
)

// maxAnswer bounds what the client reads of one answer (a page of
// thousands of Workspaces is a few megabytes).
const maxAnswer = 64 << 20

// do calls method path with query (and the client's namespace), sends in
// as JSON (nil: no body) and decodes the result into out (nil: dropped).
// Every call of this package may be sent twice (reads, writes carrying a
// command id, credentials), so one refused for the key's rate or because
// no leader answered is sent again after a backoff, within c.retries and
// ctx.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	for attempt := 0; ; attempt++ {
		err := c.once(ctx, method, path, query, body, out)
		var e *Error
		if err == nil || !errors.As(err, &e) || !(e.RateLimited || e.Code == CodeUnavailable) || attempt >= c.retries {
			return err
		}
		wait := e.RetryAfter
		if wait == 0 {
			// Exponential from 250 ms to 5 s, with jitter so that many
			// clients refused together do not come back together.
			wait = min(250*time.Millisecond<<min(attempt, 5), 5*time.Second)
			wait = wait/2 + rand.N(wait/2+1)
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return err // the answer after the wait would come too late
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// once sends one request.
func (c *Client) once(ctx context.Context, method, path string, query url.Values, body []byte, out any) error {
	q := url.Values{}
	for k, v := range query {
		q[k] = v
	}
	if c.namespace != "" {
		q.Set("namespace", c.namespace)
	}
	target := c.base + path
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return errorf(CodeInvalidArgument, "kibotos: %s %s: %v", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.transportError(ctx, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		if ctx.Err() != nil {
			return c.transportError(ctx, err)
		}
		return &Error{Code: CodeUnavailable, Err: err, Message: fmt.Sprintf("kibotos API at %s: %s %s: the answer broke off: %v", c.base, method, path, err)}
	}
	if resp.StatusCode != http.StatusOK {
		return answerError(resp, raw, c.base)
	}
	if out == nil {
		return nil
	}
	rb := struct {
		Result any `json:"result"`
	}{Result: out}
	if err := json.Unmarshal(raw, &rb); err != nil {
		return &Error{Code: CodeInternal, Err: err, Message: fmt.Sprintf("kibotos API at %s: %s %s: the answer is not what this SDK reads (%v): is the URL a kibotos API listener of a matching version?", c.base, method, path, err)}
	}
	return nil
}

// answerError is the *Error of an answer other than 200: the API's error
// body, or one made from the status when something in between (a proxy)
// answered instead.
func answerError(resp *http.Response, raw []byte, base string) error {
	e := &Error{Status: resp.StatusCode}
	var eb api.ErrorBody
	if json.Unmarshal(raw, &eb) == nil && eb.Error != nil && eb.Error.Code != "" {
		e.Code, e.Message = eb.Error.Code, eb.Error.Message
	} else {
		e.Code = statusCode(resp.StatusCode)
		e.Message = fmt.Sprintf("kibotos API at %s answered %s: %.200s", base, resp.Status, bytes.TrimSpace(raw))
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		// Quotas are refused with 429 too, but only the rate limit says
		// when to come back.
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			e.RateLimited, e.RetryAfter = true, d
		}
	}
	return e
}

// statusCode is the code of an HTTP status without an API error body.
func statusCode(status int) Code {
	switch status {
	case http.StatusBadRequest:
		return CodeInvalidArgument
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermissionDenied
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusRequestEntityTooLarge:
		return CodeTooLarge
	case http.StatusTooManyRequests:
		return CodeResourceExhausted
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return CodeUnavailable
	case http.StatusGatewayTimeout:
		return CodeDeadlineExceeded
	}
	return CodeInternal
}

// retryAfter reads a Retry-After header: seconds, or an HTTP date.
func retryAfter(h string, now time.Time) (time.Duration, bool) {
	if h == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(h); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(h); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
