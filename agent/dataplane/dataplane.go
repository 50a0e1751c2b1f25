// Package dataplane is the data-plane process of a node and its two
// clients: the node (Ensure, Handle.Push) and the CLI (Connect).
//
// The data-plane process (`kibotos dataplane`, its own systemd unit so it
// outlives node restarts) holds every exec/terminal/file/port-forward
// connection. A client opens TLS to the node's data-plane address, sends one
// frame with a ctrl-signed credential (package credential) and, once it is
// accepted, speaks the guest agent protocol (vmm/guestproto) as if the
// data-plane process were the guest: each stream is checked against the
// calls the data plane allows and relayed unchanged to the guest agent of
// the target Instance over that Instance's data channel.
//
// Everything the process needs (targets, verification key, TLS certificate)
// is pushed by the node over a unix control socket; the process never reads
// the node's state directory.
//
// Each start is a generation. A node of another build on the same release
// line, or with other TLS settings, hands the listening socket of the
// running generation to a new one (Ensure, handover.go) and the old one
// drains: it accepts nothing more and exits once its connections ended,
// lending its guest sessions to the new one meanwhile (lend.go). At most
// two generations run. Across release lines the old one is ended first.
package dataplane

import (
	"crypto/ed25519"
	"time"
)

// ALPN is the TLS protocol of data-plane connections.
const ALPN = "kibotos-dataplane/1"

// DefaultGrace is how long a stopping data-plane process lets existing
// connections end on their own before it closes them.
const DefaultGrace = 10 * time.Second

// Target is where one Workspace's data-plane connections go: its current
// Instance on this node and that Instance's data socket (a unix socket
// served by the VMM, one client at a time).
type Target struct {
	WorkspaceID string `json:"workspace_id"`
	InstanceID  string `json:"instance_id"`
	DataSocket  string `json:"data_socket"`
	// GuestBoot is the guest agent boot the node claimed and configured.
	// A guest that restarted answers with another one until the node has
	// reconfigured it and pushed its new boot: nothing is sent to it
	// before (its filesystem is not mounted yet). Empty: any boot (a
	// node of a build before it was sent).
	GuestBoot string `json:"guest_boot,omitempty"`
}

// State is what the node delivers. Each push replaces the previous state
// whole. The node ID the process answers for is the CommonName of CertPEM
// (the node's member certificate).
type State struct {
	Targets []Target `json:"targets"`
	// PublicKey is the key ctrl signs credentials with now; a process of
	// a build before PublicKeys reads only it.
	PublicKey ed25519.PublicKey `json:"public_key"`
	// PublicKeys are every key a credential may be signed with, PublicKey
	// first: during a CA rotation the key of the new CA too, so neither
	// the rotation's begin nor its finish refuses a credential. Empty
	// (a node of an earlier build): PublicKey alone.
	PublicKeys []ed25519.PublicKey `json:"public_keys,omitempty"`
	CertPEM    []byte              `json:"cert_pem"`
	KeyPEM     []byte              `json:"key_pem"`
}

// Hello is what a running data-plane process says about itself. The node
// decides from it what to do with the process (Ensure): adopt it, hand its
// listening socket to a new generation, or end it.
type Hello struct {
	Revision string `json:"revision"`
	// Release is the build's release (buildinfo.ReleaseName()). Processes
	// of builds before generations could hand over do not send it: such a
	// process counts as another release line, unless its Revision is the
	// node's (then it is the same build, which cannot lack the field).
	Release string `json:"release,omitempty"`
	// Protocol is the control protocol the process speaks: ControlProtocol
	// has the hand-over requests; 0 (not sent) has only hello and state.
	Protocol   int    `json:"protocol,omitempty"`
	Listen     string `json:"listen"`  // as given with --listen
	Address    string `json:"address"` // bound address (differs when Listen has port 0)
	Generation uint64 `json:"generation"`
	PID        int    `json:"pid"`
	// TLS are the settings it serves with; nil from an earlier build,
	// which served DefaultTLS.
	TLS *TLSSettings `json:"tls,omitempty"`
	// Listening: it accepts connections. A generation started to take
	// over a listening socket is not listening until the node handed it
	// one; a draining one listens no more.
	Listening bool `json:"listening,omitempty"`
	// Draining: it stopped accepting and exits once its connections (and
	// the guest sessions it lends to its successor) ended.
	Draining bool `json:"draining,omitempty"`
	// Connections is the number of open client connections.
	Connections int `json:"connections"`
	// StateApplied is false until the first State push was applied.
	StateApplied bool `json:"state_applied"`
	// Counters are this process's since it started.
	Counters Counters `json:"counters"`
	// Instances are the connections of each Instance a connection was
	// bound to (activity.go), when Activity says this build counts them:
	// an earlier build's say nothing of its connections' Instances.
	Instances map[string]InstanceConns `json:"instances,omitempty"`
	Activity  bool                     `json:"activity,omitempty"`
}

// ControlProtocol is the control protocol of this build: 1 added the
// hand-over (export-state, take-listener, listener, drain, end, lend).
const ControlProtocol = 1

// tlsOf is the TLS settings a hello reports, DefaultTLS for a process
// that does not say.
func (h Hello) tlsOf() TLSSettings {
	if h.TLS == nil {
		return DefaultTLS()
	}
	return *h.TLS
}

// listening says whether the process accepts connections; a process of
// protocol 0 always did once it answered.
func (h Hello) listening() bool { return h.Listening || h.Protocol == 0 }

// Counters are what a data-plane process carried. The node sums them over
// generations (Supervisor.Totals), so they never go down for a scraper.
type Counters struct {
	Connections uint64 `json:"connections"` // accepted TCP connections
	// Refused are connections refused before a session, by code
	// (Code* constants).
	Refused map[string]uint64 `json:"refused,omitempty"`
	// BytesIn and BytesOut are the relayed stream bytes: client to guest,
	// and guest to client.
	BytesIn  uint64 `json:"bytes_in"`
	BytesOut uint64 `json:"bytes_out"`
}

// RefusalCodes are the codes Counters.Refused counts by.
var RefusalCodes = []string{CodeMalformed, CodeForged, CodeExpired, CodeWrongNode, CodeNoTarget, CodeUnavailable, CodeStopping}

// Refusal codes a client can get instead of a session.
const (
	CodeMalformed   = "malformed"   // the credential cannot be parsed
	CodeForged      = "forged"      // bad signature
	CodeExpired     = "expired"     // past its expiry
	CodeWrongNode   = "wrong_node"  // issued for another node
	CodeNoTarget    = "no_target"   // workspace/instance not (or no longer) here
	CodeUnavailable = "unavailable" // no state yet, or the guest does not answer
	CodeStopping    = "stopping"    // the process is shutting down
)

// connectRequest is the first frame of a client.
type connectRequest struct {
	Credential string `json:"credential"`
}

// connectReply answers it. On OK the guest protocol handshake follows.
type connectReply struct {
	OK      bool   `json:"ok,omitempty"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}
