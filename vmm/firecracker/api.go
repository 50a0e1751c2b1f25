package firecracker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client speaks Firecracker's HTTP API on its unix socket (--api-sock).
type Client struct {
	Socket string
	hc     *http.Client
}

// NewClient is a client for the API socket at socket (a host path; for a
// jailed VMM that is Jail.HostPath of the --api-sock value).
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:    1,
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{Socket: socket, hc: &http.Client{Transport: tr}}
}

// APIError is a non-2xx answer; FaultMessage is the body's fault_message
// (the API's Error definition) or, failing that, the start of the body.
type APIError struct {
	Method, Path string
	StatusCode   int
	FaultMessage string
}

func (e *APIError) Error() string {
	msg := e.FaultMessage
	if msg == "" {
		msg = "(no fault_message)"
	}
	return fmt.Sprintf("firecracker API %s %s: %d %s: %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode), msg)
}

// do sends one request; body (if any) is JSON-encoded, out (if any) is
// decoded from a 2xx answer.
func (c *Client) do(ctx context.Context, method, p string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("firecracker API %s %s: %w", method, p, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+p, rd)
	if err != nil {
		return fmt.Errorf("firecracker API %s %s: %w", method, p, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("firecracker API %s %s on %s: %w", method, p, c.Socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("firecracker API %s %s: reading the answer: %w", method, p, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &APIError{Method: method, Path: p, StatusCode: resp.StatusCode}
		var fault struct {
			FaultMessage string `json:"fault_message"`
		}
		if json.Unmarshal(data, &fault) == nil && fault.FaultMessage != "" {
			e.FaultMessage = fault.FaultMessage
		} else {
			s := strings.TrimSpace(string(data))
			if len(s) > 256 {
				s = s[:256] + "..."
			}
			e.FaultMessage = s
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("firecracker API %s %s: decoding the answer: %w", method, p, err)
		}
	}
	return nil
}

// PutBootSource is PUT /boot-source (pre-boot only).
func (c *Client) PutBootSource(ctx context.Context, b BootSource) error {
	return c.do(ctx, http.MethodPut, "/boot-source", b, nil)
}

// PutMachineConfig is PUT /machine-config (pre-boot only).
func (c *Client) PutMachineConfig(ctx context.Context, m MachineConfig) error {
	return c.do(ctx, http.MethodPut, "/machine-config", m, nil)
}

// PutDrive is PUT /drives/{drive_id} (pre-boot only).
func (c *Client) PutDrive(ctx context.Context, d Drive) error {
	if !deviceIDRE.MatchString(d.DriveID) {
		return fmt.Errorf("firecracker API PUT /drives/%s: drive_id %q wants 1 to 64 letters, digits or '_'", d.DriveID, d.DriveID)
	}
	return c.do(ctx, http.MethodPut, "/drives/"+url.PathEscape(d.DriveID), d, nil)
}

// PutNetworkInterface is PUT /network-interfaces/{iface_id} (pre-boot only).
func (c *Client) PutNetworkInterface(ctx context.Context, n NetworkInterface) error {
	if !deviceIDRE.MatchString(n.IfaceID) {
		return fmt.Errorf("firecracker API PUT /network-interfaces/%s: iface_id %q wants 1 to 64 letters, digits or '_'", n.IfaceID, n.IfaceID)
	}
	return c.do(ctx, http.MethodPut, "/network-interfaces/"+url.PathEscape(n.IfaceID), n, nil)
}

// PutVsock is PUT /vsock (pre-boot only).
func (c *Client) PutVsock(ctx context.Context, v Vsock) error {
	return c.do(ctx, http.MethodPut, "/vsock", v, nil)
}

// ActionType is InstanceActionInfo.action_type.
type ActionType string

const (
	ActionInstanceStart  ActionType = "InstanceStart"
	ActionSendCtrlAltDel ActionType = "SendCtrlAltDel" // x86_64: the guest sees Ctrl+Alt+Del
	ActionFlushMetrics   ActionType = "FlushMetrics"
)

// Action is PUT /actions.
func (c *Client) Action(ctx context.Context, a ActionType) error {
	return c.do(ctx, http.MethodPut, "/actions", struct {
		ActionType ActionType `json:"action_type"`
	}{a}, nil)
}

// InstanceStart boots a VM configured over the API (not needed when
// Firecracker was given --config-file: it starts the VM itself).
func (c *Client) InstanceStart(ctx context.Context) error {
	return c.Action(ctx, ActionInstanceStart)
}

// SendCtrlAltDel asks the guest to shut down (its init decides what
// Ctrl+Alt+Del does).
func (c *Client) SendCtrlAltDel(ctx context.Context) error {
	return c.Action(ctx, ActionSendCtrlAltDel)
}

// InstanceInfo is the answer of GET /.
type InstanceInfo struct {
	AppName    string `json:"app_name"`
	ID         string `json:"id"`
	State      string `json:"state"` // "Not started", "Running", "Paused"
	VMMVersion string `json:"vmm_version"`
}

// DescribeInstance is GET /.
func (c *Client) DescribeInstance(ctx context.Context) (InstanceInfo, error) {
	var info InstanceInfo
	err := c.do(ctx, http.MethodGet, "/", nil, &info)
	return info, err
}

// Configure sends a VMConfig over the API, the same VM that --config-file
// would describe, stopping at the first error. It does not start the VM:
// call InstanceStart after it.
func (c *Client) Configure(ctx context.Context, cfg *VMConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := c.PutMachineConfig(ctx, cfg.MachineConfig); err != nil {
		return err
	}
	if err := c.PutBootSource(ctx, cfg.BootSource); err != nil {
		return err
	}
	for _, d := range cfg.Drives {
		if err := c.PutDrive(ctx, d); err != nil {
			return err
		}
	}
	for _, n := range cfg.NetworkInterfaces {
		if err := c.PutNetworkInterface(ctx, n); err != nil {
			return err
		}
	}
	if cfg.Vsock != nil {
		if err := c.PutVsock(ctx, *cfg.Vsock); err != nil {
			return err
		}
	}
	return nil
}
