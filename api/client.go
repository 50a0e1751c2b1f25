package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Client calls the API of one member.
type Client struct {
	Addr       string
	HTTP       *http.Client
	Consistent bool
	// Retries of a call that found no leader; 0 means the default (8).
	Retries int
}

// NewClient makes a client for the member at addr with the given TLS config.
func NewClient(addr string, tlsConf *tls.Config) *Client {
	return &Client{Addr: addr, HTTP: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{TLSClientConfig: tlsConf}}}
}

// Call sends in (nil for none) and returns the raw response body; an API
// error comes back as *Error with its code.
func (c *Client) Call(ctx context.Context, method, path string, in any) (json.RawMessage, error) {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(raw)
	}
	url := "https://" + c.Addr + path
	if c.Consistent && method == http.MethodGet {
		sep := "?"
		if bytes.ContainsRune([]byte(path), '?') {
			sep = "&"
		}
		url += sep + "consistent=true"
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, Errorf(CodeUnavailable, "cannot reach kibotos member at %s: %v; check --address / KIBOTOS_ADDR and that the member is serving", c.Addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, Errorf(CodeUnavailable, "read answer of %s: %v", c.Addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		var eb ErrorBody
		if json.Unmarshal(raw, &eb) == nil && eb.Error != nil {
			return nil, eb.Error
		}
		return nil, Errorf(CodeInternal, "member %s answered %s: %s", c.Addr, resp.Status, bytes.TrimSpace(raw))
	}
	return raw, nil
}

// Do calls and decodes the result into out (may be nil). A call that finds
// no leader (unavailable) is retried for a few seconds: reads are safe to
// repeat, and writes carry a command id, so a repeat returns the first result.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) (json.RawMessage, error) {
	var raw json.RawMessage
	var err error
	for attempt := 0; ; attempt++ {
		raw, err = c.Call(ctx, method, path, in)
		if err == nil || CodeOf(err) != CodeUnavailable || attempt >= c.retries() || !retryable(method, in) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	if err != nil {
		return nil, err
	}
	if out != nil {
		// One pass: the result is decoded straight into out (lists of
		// 10,000 nodes are megabytes).
		rb := struct {
			Result any `json:"result"`
		}{Result: out}
		if err := json.Unmarshal(raw, &rb); err != nil {
			return nil, fmt.Errorf("answer of %s does not match this kibotos: %w", c.Addr, err)
		}
	}
	return raw, nil
}

func (c *Client) retries() int {
	if c.Retries != 0 {
		return c.Retries
	}
	return 8
}

// idempotent is implemented by write requests that carry a command id.
type idempotent interface{ commandID() string }

func (m WriteMeta) commandID() string { return m.CommandID }

func retryable(method string, in any) bool {
	if method == http.MethodGet {
		return true
	}
	w, ok := in.(idempotent)
	return ok && w.commandID() != ""
}
