package egress

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/kibotos/kibotos/internal/fdpass"
)

// Requests of the control protocol.
const (
	opHello          = "hello"
	opListeners      = "listeners"
	opTakeListeners  = "take-listeners"
	opConfig         = "config"
	opDrain          = "drain"
	opStats          = "stats"
	opGuestStats     = "guest-stats"
	listenerFDsCount = 3 // TCP listener, DNS socket, DNS TCP listener, in that order
	// oldListenerFDs is what a generation of a build before TCP DNS hands
	// over: the node makes the DNS TCP listener itself then.
	oldListenerFDs = 2
)

// request is one control request; only the field of its op may be set.
type request struct {
	Op       string     `json:"op"`
	Config   *Config    `json:"config,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`
}

// reply answers a request; Error is set alone when it failed.
type reply struct {
	Error string `json:"error,omitempty"`
	Hello *Hello `json:"hello,omitempty"`
	Stats *Stats `json:"stats,omitempty"`
	// Guests answers opGuestStats alone (a node of an earlier build never
	// asks, so never decodes it).
	Guests *[]GuestStats `json:"guests,omitempty"`
}

// maxFDs bounds the descriptors a frame may bring: more is an error, and
// what the kernel could not fit in the buffer it closes itself.
const maxFDs = 4

// link is one end of a control connection: frames out with optional
// descriptors, frames in with the descriptors that came with them.
type link struct {
	c *fdpass.Conn
}

func newLink(c *net.UnixConn) *link { return &link{c: fdpass.NewConn(c, maxFDs)} }

// takeFDs hands the descriptors received so far to the caller.
func (l *link) takeFDs() []int { return l.c.TakeFDs() }

// close ends the connection and closes descriptors nobody claimed.
func (l *link) close() { l.c.Close() }

// readFrame reads one frame into v, strictly: unknown fields and anything
// after the JSON value are errors. The buffer is cleared afterwards, since
// a config frame holds credentials.
func (l *link) readFrame(v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(l.c, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > MaxFrame {
		return fmt.Errorf("egress: control frame of %d bytes, want 1 to %d", n, MaxFrame)
	}
	buf := make([]byte, n)
	defer clear(buf)
	if _, err := io.ReadFull(l.c, buf); err != nil {
		return fmt.Errorf("egress: control frame cut short: %w", err)
	}
	return decodeStrict(buf, v)
}

func decodeStrict(buf []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("egress: control frame: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("egress: control frame: data after the JSON value")
	}
	return nil
}

// writeFrame sends v as one frame; fds, when given, ride on its first
// byte as SCM_RIGHTS (the caller keeps them open until it returns).
func (l *link) writeFrame(v any, fds ...int) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("egress: control frame: %w", err)
	}
	if len(body) > MaxFrame {
		return fmt.Errorf("egress: control frame of %d bytes is over the %d limit", len(body), MaxFrame)
	}
	frame := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(frame, uint32(len(body)))
	copy(frame[4:], body)
	clear(body)
	defer clear(frame)
	err = l.c.WriteFDs(frame, fds...)
	if err != nil {
		return fmt.Errorf("egress: send control frame: %w", err)
	}
	return nil
}
