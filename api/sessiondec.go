package api

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	json "github.com/segmentio/encoding/json"
)

// MaxSessionMessage bounds one control-session message in either
// direction. The largest a node sends is a full report, whose parts are
// bounded or small (its Instances, up to the ended records it keeps,
// 1,024 templates, 64 pools): far below this.
const MaxSessionMessage = 16 << 20

// sessionReadBuffer is what a session decoder reads ahead into: it holds
// a typical message whole (a report of a few dozen Instances), and a
// leader keeps one per node.
const sessionReadBuffer = 32 << 10

// SessionDecoder reads the JSON messages of a control session and refuses
// one larger than MaxSessionMessage, so that a peer, authenticated as it
// is, cannot make the other end buffer without bound.
//
// Both ends write their messages with a json.Encoder: one compact value
// per line. The decoder takes a message's line first and then decodes it
// with the decoder the FSM decodes records with; the standard library's
// stream decoder scanned every message twice to find its end, a tenth of
// a busy leader's session work.
type SessionDecoder struct {
	budget *budgetReader
	r      *bufio.Reader
}

// NewSessionDecoder reads session messages from r.
func NewSessionDecoder(r io.Reader) *SessionDecoder {
	b := &budgetReader{r: r}
	return &SessionDecoder{budget: b, r: bufio.NewReaderSize(b, sessionReadBuffer)}
}

// Decode reads the next message into m.
func (d *SessionDecoder) Decode(m *SessionMsg) error {
	// The reader reads ahead, so a message may also use what the one
	// before left in its buffer: it holds at most twice the bound.
	d.budget.left = MaxSessionMessage
	for {
		line, err := d.readLine()
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue // whitespace between values, as a stream decoder skips it
		}
		return json.Unmarshal(line, m)
	}
}

// readLine returns the next line, in the reader's buffer when it fits.
func (d *SessionDecoder) readLine() ([]byte, error) {
	var long []byte // a line over the buffer, put together
	for {
		frag, err := d.r.ReadSlice('\n')
		if len(long)+len(frag) > MaxSessionMessage {
			return nil, errSessionMessageSize
		}
		switch {
		case err == nil && long == nil:
			return frag, nil
		case err == nil:
			return append(long, frag...), nil
		case errors.Is(err, bufio.ErrBufferFull):
			long = append(long, frag...)
		case err == io.EOF && long == nil && len(frag) == 0:
			return nil, io.EOF
		case err == io.EOF:
			return nil, io.ErrUnexpectedEOF // a message cut short
		default:
			return nil, err
		}
	}
}

var errSessionMessageSize = fmt.Errorf("control session message over %d bytes: refused", MaxSessionMessage)

// budgetReader reads from r until left bytes are used up.
type budgetReader struct {
	r    io.Reader
	left int
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errSessionMessageSize
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= n
	return n, err
}
