package api

import (
	"encoding/json"
	"fmt"
	"io"
)

// MaxSessionMessage bounds one control-session message in either
// direction. The largest a node sends is a full report, whose parts are
// bounded or small (its Instances, up to the ended records it keeps,
// 1,024 templates, 64 pools): far below this.
const MaxSessionMessage = 16 << 20

// SessionDecoder reads the JSON messages of a control session and refuses
// one larger than MaxSessionMessage, so that a peer, authenticated as it
// is, cannot make the other end buffer without bound.
type SessionDecoder struct {
	r   *budgetReader
	dec *json.Decoder
}

// NewSessionDecoder reads session messages from r.
func NewSessionDecoder(r io.Reader) *SessionDecoder {
	br := &budgetReader{r: r}
	return &SessionDecoder{r: br, dec: json.NewDecoder(br)}
}

// Decode reads the next message into m.
func (d *SessionDecoder) Decode(m *SessionMsg) error {
	// The decoder reads ahead, so a message may also use what the one
	// before left in its buffer: it holds at most twice the bound.
	d.r.left = MaxSessionMessage
	return d.dec.Decode(m)
}

// budgetReader reads from r until left bytes are used up.
type budgetReader struct {
	r    io.Reader
	left int
}

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("control session message over %d bytes: refused", MaxSessionMessage)
	}
	if len(p) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= n
	return n, err
}
