package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"strings"
	"sync"
	"time"

	"github.com/kibotos/kibotos/trust"
)

// Client calls the API of one member.
type Client struct {
	Addr       string
	Consistent bool
	// Retries of a call that found no leader; 0 means the default (8).
	Retries int
	// Namespace, when set, is the namespace every call works in
	// (?namespace=); AllNamespaces asks lists for every namespace.
	Namespace     string
	AllNamespaces bool

	tls  trust.Client
	want trust.Want
	// token is the API key of a client of the API listener
	// (NewTokenClient), base its URL; both "" for a member client. An
	// in-process client (NewHandlerClient) has a base and may have no
	// token: its handler knows the caller.
	token, base string
	// first reaches Addr, expecting want; ctrl reaches the ctrl members a
	// node-only member sends operator calls to, expecting a ctrl member.
	once        sync.Once
	first, ctrl *http.Client
}

// HdrCtrl lists the ctrl members' addresses in a node-only member's
// misdirected answer (421) to a call only ctrl serves.
const HdrCtrl = "X-Kibotos-Ctrl"

// NewClient makes a client for the member at addr presenting tc's
// certificate. The server must be a member of the cluster holding addr's
// host; Expect narrows that further.
func NewClient(addr string, tc trust.Client) *Client {
	return &Client{Addr: addr, tls: tc, want: trust.Want{Kind: trust.KindMember}}
}

// Expect makes the client accept only the member with this node id at
// Addr (the CLI talking to its own member).
func (c *Client) Expect(nodeID string) *Client {
	c.want.NodeID = nodeID
	return c
}

func (c *Client) clients() (first, ctrl *http.Client) {
	c.once.Do(func() {
		c.first = &http.Client{Timeout: 2 * time.Minute, Transport: c.tls.HTTPTransport(c.want, 10*time.Second)}
		c.ctrl = &http.Client{Timeout: 2 * time.Minute, Transport: c.tls.HTTPTransport(trust.Want{Kind: trust.KindMember, Role: trust.RoleCtrl}, 10*time.Second)}
	})
	return c.first, c.ctrl
}

// Call sends in (nil for none) and returns the raw response body; an API
// error comes back as *Error with its code. A node-only member answers
// calls that only ctrl serves with the ctrl members' addresses; the call
// then goes to them directly, with this client's own certificate (a
// node-only member never speaks for its caller).
func (c *Client) Call(ctx context.Context, method, path string, in any) (json.RawMessage, error) {
	var body []byte
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = raw
	}
	first, ctrl := c.clients()
	raw, ctrlAddrs, err := c.call(ctx, first, c.Addr, method, path, body)
	if len(ctrlAddrs) == 0 || c.base != "" {
		// The API listener is served by ctrl members only: nothing
		// there sends a caller elsewhere.
		return raw, err
	}
	for _, addr := range ctrlAddrs {
		var again []string
		raw, again, err = c.call(ctx, ctrl, addr, method, path, body)
		if len(again) == 0 && CodeOf(err) != CodeUnavailable {
			return raw, err
		}
	}
	return raw, err
}

func (c *Client) call(ctx context.Context, hc *http.Client, addr, method, path string, body []byte) (json.RawMessage, []string, error) {
	url := "https://" + addr + c.withQuery(method, path)
	if c.base != "" {
		url = c.base + c.withQuery(method, path)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := hc.Do(req)
	if err != nil && c.base != "" {
		return nil, nil, c.tokenCallError(err)
	}
	if err != nil {
		if refused(err) {
			// Not worth a retry, nor a question about the address.
			return nil, nil, Errorf(CodeUnauthenticated, "kibotos member at %s refused this CLI's certificate (%v): the credential is not valid in this cluster now (expired, or issued by a CA it no longer trusts after kibo ca finish); use a current one (kibo operator issue NAME --out DIR on a ctrl member)", addr, err)
		}
		return nil, nil, Errorf(CodeUnavailable, "cannot reach kibotos member at %s: %v; check --address / KIBOTOS_ADDR and that the member is serving", addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return nil, nil, Errorf(CodeUnavailable, "read answer of %s: %v", addr, err)
	}
	var ctrlAddrs []string
	if resp.StatusCode == http.StatusMisdirectedRequest && resp.Header.Get(HdrCtrl) != "" {
		ctrlAddrs = strings.Split(resp.Header.Get(HdrCtrl), ",")
	}
	if resp.StatusCode != http.StatusOK {
		var eb ErrorBody
		if json.Unmarshal(raw, &eb) == nil && eb.Error != nil {
			return nil, ctrlAddrs, eb.Error
		}
		return nil, ctrlAddrs, Errorf(CodeInternal, "member %s answered %s: %s", addr, resp.Status, bytes.TrimSpace(raw))
	}
	return raw, nil, nil
}

// withQuery adds the client's options to path: consistent reads, the
// namespace and all namespaces.
func (c *Client) withQuery(method, path string) string {
	var extra []string
	if c.Consistent && method == http.MethodGet {
		extra = append(extra, "consistent=true")
	}
	if c.Namespace != "" {
		extra = append(extra, "namespace="+neturl.QueryEscape(c.Namespace))
	}
	if c.AllNamespaces && method == http.MethodGet {
		extra = append(extra, "all_namespaces=true")
	}
	if len(extra) == 0 {
		return path
	}
	sep := "?"
	if strings.ContainsRune(path, '?') {
		sep = "&"
	}
	return path + sep + strings.Join(extra, "&")
}

// refused reports whether the server ended the TLS handshake with an
// alert about our certificate (TLS 1.3 verifies the client's certificate
// after the client's side of the handshake is done, so it shows on the
// first read as a "remote error").
func refused(err error) bool {
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "remote error" {
		return false
	}
	msg := oe.Err.Error()
	for _, alert := range []string{"bad certificate", "unknown certificate authority", "certificate expired", "certificate revoked", "certificate required", "unsupported certificate", "certificate unknown", "access denied"} {
		if strings.Contains(msg, alert) {
			return true
		}
	}
	return false
}

// maxAnswer bounds what the client reads of one answer (a list of 10,000
// nodes with reports is a few megabytes).
const maxAnswer = 256 << 20

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
