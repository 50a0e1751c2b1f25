package e2b

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// The Connect protocol (connectrpc.com/docs/protocol) as E2B's SDKs speak
// it to envd: JSON, unary and server-streaming. A streamed message is an
// envelope: a flags byte, a big-endian uint32 length, the JSON; the last
// one has flag endStream and carries the RPC's error, if any.

const (
	connectStreamJSON = "application/connect+json"
	flagEndStream     = 0x02
	flagCompressed    = 0x01
	// maxEnvelope bounds a request message: a process start is a
	// command line and its environment.
	maxEnvelope = 1 << 20
)

// connectError is an RPC's error: a Connect code ("not_found",
// "permission_denied", ...) and a message.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *connectError) Error() string { return e.Code + ": " + e.Message }

func rpcErrorf(code, format string, args ...any) *connectError {
	return &connectError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// connectStatus is the HTTP status of a unary RPC's error code.
func connectStatus(code string) int {
	switch code {
	case "invalid_argument", "out_of_range":
		return http.StatusBadRequest
	case "unauthenticated":
		return http.StatusUnauthorized
	case "permission_denied":
		return http.StatusForbidden
	case "not_found":
		return http.StatusNotFound
	case "already_exists", "aborted":
		return http.StatusConflict
	case "resource_exhausted":
		return http.StatusTooManyRequests
	case "unimplemented":
		return http.StatusNotImplemented
	case "unavailable":
		return http.StatusServiceUnavailable
	case "deadline_exceeded":
		return http.StatusGatewayTimeout
	case "failed_precondition":
		return http.StatusPreconditionFailed
	}
	return http.StatusInternalServerError
}

// readEnvelope reads the one request message of a server-streaming RPC
// into v.
func readEnvelope(r io.Reader, v any) error {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return rpcErrorf("invalid_argument", "read the request message: %v", err)
	}
	if head[0]&flagCompressed != 0 {
		return rpcErrorf("unimplemented", "compressed request messages are not served: send them uncompressed")
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > maxEnvelope {
		return rpcErrorf("resource_exhausted", "request message of %d bytes: at most %d", n, maxEnvelope)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return rpcErrorf("invalid_argument", "read the request message: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return rpcErrorf("invalid_argument", "request message: %v", err)
	}
	return nil
}

// streamRequest reads the request message of a server-streaming RPC
// into v and bounds the request by its Connect-Timeout-Ms: the returned
// request carries that context, which cancel ends.
func streamRequest(w http.ResponseWriter, r *http.Request, v any) (*http.Request, context.CancelFunc, error) {
	if ct := r.Header.Get("Content-Type"); ct != connectStreamJSON {
		return r, func() {}, rpcErrorf("invalid_argument", "content type %q: this RPC streams %s", ct, connectStreamJSON)
	}
	ctx, cancel := requestDeadline(r)
	r = r.WithContext(ctx)
	return r, cancel, readEnvelope(http.MaxBytesReader(w, r.Body, maxEnvelope+5), v)
}

// stream writes the messages of a server-streaming RPC, one at a time
// from any goroutine, each flushed as it is written.
type stream struct {
	mu  sync.Mutex
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error // the first write error: the client is gone
}

func newStream(w http.ResponseWriter) *stream {
	w.Header().Set("Content-Type", connectStreamJSON)
	w.WriteHeader(http.StatusOK)
	return &stream{w: w, rc: http.NewResponseController(w)}
}

// send writes one message; it fails once the client is gone.
func (s *stream) send(v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.envelope(0, raw)
}

// end writes the end of the stream with err (nil: success).
func (s *stream) end(err error) error {
	var body struct {
		Error *connectError `json:"error,omitempty"`
	}
	if err != nil {
		var ce *connectError
		if !errors.As(err, &ce) {
			ce = rpcErrorf("internal", "%v", err)
		}
		body.Error = ce
	}
	raw, _ := json.Marshal(body)
	return s.envelope(flagEndStream, raw)
}

func (s *stream) envelope(flags byte, raw []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	var head [5]byte
	head[0] = flags
	binary.BigEndian.PutUint32(head[1:], uint32(len(raw)))
	if _, err := s.w.Write(head[:]); err != nil {
		s.err = err
		return err
	}
	if _, err := s.w.Write(raw); err != nil {
		s.err = err
		return err
	}
	if err := s.rc.Flush(); err != nil {
		s.err = err
	}
	return s.err
}

// unaryError answers a unary RPC with err.
func unaryError(w http.ResponseWriter, err error) {
	var ce *connectError
	if !errors.As(err, &ce) {
		ce = rpcErrorf("internal", "%v", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(connectStatus(ce.Code))
	json.NewEncoder(w).Encode(ce)
}
