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

// Do calls and decodes the result into out (may be nil).
func (c *Client) Do(ctx context.Context, method, path string, in, out any) (json.RawMessage, error) {
	raw, err := c.Call(ctx, method, path, in)
	if err != nil {
		return nil, err
	}
	if out != nil {
		var rb struct {
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(raw, &rb); err != nil {
			return nil, fmt.Errorf("answer of %s is not a kibotos result: %w", c.Addr, err)
		}
		if err := json.Unmarshal(rb.Result, out); err != nil {
			return nil, fmt.Errorf("answer of %s does not match this kibotos: %w", c.Addr, err)
		}
	}
	return raw, nil
}
