package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// QMP is a client of QEMU's machine protocol on the unix socket of
// Config.QMPSocket. QEMU serves one QMP client at a time (a second one
// waits, greeting-less, until the first is gone), so callers dial, make
// their call and close. Not for concurrent use by several goroutines'
// calls in flight at once; calls are serialized.
type QMP struct {
	socket string
	conn   net.Conn
	sc     *bufio.Scanner

	mu     sync.Mutex
	broken error // a call that failed mid-way: what is on the wire is unknown
}

// maxQMPLine bounds one line read from QEMU: a reply of the commands used
// here is a few hundred bytes; a peer that sends more is not a QEMU we
// want to buffer for.
const maxQMPLine = 1 << 20

// QMPError is a command QEMU answered with an error.
type QMPError struct {
	Command string
	Class   string // e.g. GenericError, DeviceNotFound
	Desc    string
}

func (e *QMPError) Error() string {
	return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc)
}

// DialQMP connects to socket, reads QEMU's greeting and leaves the
// capabilities negotiation mode (qmp_capabilities), after which commands
// are accepted. ctx bounds the whole dial.
func DialQMP(ctx context.Context, socket string) (*QMP, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", socket, err)
	}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 0, 4096), maxQMPLine)
	q := &QMP{socket: socket, conn: conn, sc: sc}
	err = q.exchange(ctx, "greeting", nil, q.readGreeting)
	if err == nil {
		err = q.Execute(ctx, "qmp_capabilities", nil, nil)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// maxLinesBeforeGreeting bounds what a new connection skips before
// QEMU's greeting: stray replies and events (see readGreeting).
const maxLinesBeforeGreeting = 64

// readGreeting reads QEMU's greeting. A command whose client went away
// mid-call (a call cut short by its context) still finishes, and QEMU
// writes its reply to the next client, at times ahead of the greeting:
// replies and events before it are skipped.
func (q *QMP) readGreeting() error {
	for range maxLinesBeforeGreeting {
		line, err := q.readLine()
		if err != nil {
			return err
		}
		var m struct {
			QMP, Return, Error *json.RawMessage
			Event              string
		}
		if json.Unmarshal(line, &m) != nil {
			return fmt.Errorf("not a QMP greeting: %.80q", line)
		}
		switch {
		case m.QMP != nil:
			return nil
		case m.Return == nil && m.Error == nil && m.Event == "":
			return fmt.Errorf("not a QMP greeting: %.80q", line)
		}
	}
	return fmt.Errorf("no QMP greeting in the first %d lines", maxLinesBeforeGreeting)
}

// requestIDs numbers the commands this process sends; QEMU copies a
// command's id into its reply. The prefix is drawn once per process so
// that a reply meant for another process's connection (an agent that
// restarted) cannot match either.
var requestIDs = struct {
	prefix string
	n      atomic.Uint64
}{prefix: fmt.Sprintf("kibotos-%016x-", rand.Uint64())}

func nextRequestID() string {
	return requestIDs.prefix + strconv.FormatUint(requestIDs.n.Add(1), 10)
}

// redialIfBroken replaces a connection an earlier call left unusable
// with a new one. The old one is closed first: QEMU serves the next
// client only once it is gone.
func (q *QMP) redialIfBroken(ctx context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.broken == nil {
		return nil
	}
	q.conn.Close()
	n, err := DialQMP(ctx, q.socket)
	if err != nil {
		return fmt.Errorf("qmp dial again after %v: %w", q.broken, err)
	}
	q.conn, q.sc, q.broken = n.conn, n.sc, nil
	return nil
}

// Close ends the connection, which lets QEMU serve the next client.
func (q *QMP) Close() error { return q.conn.Close() }

// Execute runs command with args (nil: none) and decodes its return value
// into result (nil: ignored). Asynchronous events QEMU sends meanwhile
// are skipped. A command QEMU refuses is a *QMPError.
func (q *QMP) Execute(ctx context.Context, command string, args, result any) error {
	b, id, err := encodeRequest(command, args)
	if err != nil {
		return err
	}
	return q.exchange(ctx, command, b, q.readReturn(command, id, result))
}

// encodeRequest is command's request line with args (nil: none) and the
// id its reply will carry.
func encodeRequest(command string, args any) ([]byte, string, error) {
	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        string `json:"id"`
	}{command, args, nextRequestID()}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, "", fmt.Errorf("qmp %s: encode arguments: %w", command, err)
	}
	return append(b, '\n'), req.ID, nil
}

// exchangeWith is exchange for a request (with id) written by write (a
// message with descriptors), whose reply is read like Execute's.
func (q *QMP) exchangeWith(ctx context.Context, what string, write func() error, command, id string) error {
	read := q.readReturn(command, id, nil)
	return q.exchange(ctx, what, nil, func() error {
		if err := write(); err != nil {
			return err
		}
		return read()
	})
}

// readReturn reads the reply to command, the one carrying id, into
// result. Events are skipped, and so are replies with another id or
// none: they were meant for an earlier connection (see readGreeting).
func (q *QMP) readReturn(command, id string, result any) func() error {
	return func() error {
		for {
			line, err := q.readLine()
			if err != nil {
				return err
			}
			var resp struct {
				ID     json.RawMessage `json:"id"`
				Event  string          `json:"event"`
				Return json.RawMessage `json:"return"`
				Error  *struct {
					Class string `json:"class"`
					Desc  string `json:"desc"`
				} `json:"error"`
			}
			if err := json.Unmarshal(line, &resp); err != nil {
				return fmt.Errorf("reply is not JSON: %w: %.80q", err, line)
			}
			switch {
			case resp.Event != "":
				continue
			case (resp.ID == nil || string(resp.ID) == "null") && resp.Error != nil:
				// QEMU's answer to a request it could not parse has no
				// id: ours, as no request here goes without one.
				return &QMPError{Command: command, Class: resp.Error.Class, Desc: resp.Error.Desc}
			case !sameID(resp.ID, id):
				continue
			case resp.Error != nil:
				return &QMPError{Command: command, Class: resp.Error.Class, Desc: resp.Error.Desc}
			case resp.Return == nil:
				return fmt.Errorf("reply has neither return nor error: %.80q", line)
			case result != nil:
				if err := json.Unmarshal(resp.Return, result); err != nil {
					return fmt.Errorf("decode return value: %w", err)
				}
			}
			return nil
		}
	}
}

// sameID is whether a reply's id (JSON) is id.
func sameID(raw json.RawMessage, id string) bool {
	var got string
	return json.Unmarshal(raw, &got) == nil && got == id
}

// BlockResize sets the size of the drive with id device (the -drive id),
// in bytes. QEMU resizes the image file and tells the guest the new
// capacity through a virtio config-change interrupt; the guest kernel
// learns it asynchronously.
func (q *QMP) BlockResize(ctx context.Context, device string, size uint64) error {
	if size > math.MaxInt64 {
		return fmt.Errorf("qmp block_resize %s: size %d is past what QMP takes", device, size)
	}
	return q.Execute(ctx, "block_resize", map[string]any{"device": device, "size": size}, nil)
}

// exchange writes out (if any) and runs read, under ctx's deadline and
// cancellation. A failure other than QEMU's own error answer leaves the
// connection in an unknown state: later calls fail at once.
func (q *QMP) exchange(ctx context.Context, what string, out []byte, read func() error) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.broken != nil {
		return fmt.Errorf("qmp %s on %s: connection unusable after an earlier failure (%w); dial again", what, q.socket, q.broken)
	}
	deadline, hasDeadline := ctx.Deadline()
	q.conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { q.conn.SetDeadline(time.Unix(1, 0)) })
	err := func() error {
		if out != nil {
			if _, err := q.conn.Write(out); err != nil {
				return err
			}
		}
		return read()
	}()
	stop()
	var qe *QMPError
	if err == nil || errors.As(err, &qe) {
		return err
	}
	// The socket's deadline may fire a moment before ctx reports it.
	if cause := context.Cause(ctx); cause != nil {
		err = fmt.Errorf("%w (%w)", cause, err)
	} else if hasDeadline && !time.Now().Before(deadline) {
		err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	}
	q.broken = err
	return fmt.Errorf("qmp %s on %s: %w", what, q.socket, err)
}

// readLine returns the next line QEMU sent, at most maxQMPLine bytes.
func (q *QMP) readLine() ([]byte, error) {
	if q.sc.Scan() {
		return q.sc.Bytes(), nil
	}
	if err := q.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("a line longer than %d bytes", maxQMPLine)
		}
		return nil, err
	}
	return nil, errors.New("QEMU closed the connection")
}
