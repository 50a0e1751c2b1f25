package guestproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxHeaderSize bounds one JSON header frame. Headers are small (requests,
// replies, control messages); bulk data travels as chunks or raw streams.
const MaxHeaderSize = 1 << 20

// MaxChunkSize bounds one data chunk.
const MaxChunkSize = 1 << 20

// ErrFrameTooLarge is returned for a frame whose length prefix exceeds the limit.
var ErrFrameTooLarge = errors.New("guestproto: frame exceeds the size limit")

// WriteFrame writes v as one length-prefixed JSON header frame.
func WriteFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("guestproto: encode frame: %w", err)
	}
	if len(b) > MaxHeaderSize {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, len(b), MaxHeaderSize)
	}
	buf := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	_, err = w.Write(buf)
	return err
}

// ReadFrameBytes reads one header frame and returns its JSON payload.
// A stream that ends inside a frame gives io.ErrUnexpectedEOF; one that ends
// cleanly before a frame gives io.EOF.
func ReadFrameBytes(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, MaxHeaderSize)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("guestproto: truncated frame: %w", err)
	}
	return b, nil
}

// ReadFrame reads one header frame into v.
func ReadFrame(r io.Reader, v any) error {
	b, err := ReadFrameBytes(r)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("guestproto: decode frame: %w", err)
	}
	return nil
}

// ChunkWriter sends data as length-prefixed chunks; Close sends the
// zero-length end chunk, so a receiver can tell a complete transfer from a
// broken one. It does not close the underlying writer.
type ChunkWriter struct {
	W      io.Writer
	closed bool
}

func (c *ChunkWriter) Write(p []byte) (int, error) {
	if c.closed {
		return 0, errors.New("guestproto: write after end of data")
	}
	written := 0
	for len(p) > 0 {
		n := min(len(p), MaxChunkSize)
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(n))
		if _, err := c.W.Write(hdr[:]); err != nil {
			return written, err
		}
		if _, err := c.W.Write(p[:n]); err != nil {
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// Close writes the end chunk.
func (c *ChunkWriter) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	_, err := c.W.Write([]byte{0, 0, 0, 0})
	return err
}

// ChunkReader reads what a ChunkWriter wrote and returns io.EOF only after
// the end chunk; a stream ending before it gives io.ErrUnexpectedEOF.
type ChunkReader struct {
	R    io.Reader
	left uint32
	done bool
}

func (c *ChunkReader) Read(p []byte) (int, error) {
	if c.done {
		return 0, io.EOF
	}
	if c.left == 0 {
		var hdr [4]byte
		if _, err := io.ReadFull(c.R, hdr[:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, fmt.Errorf("guestproto: data ended without end chunk: %w", err)
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 {
			c.done = true
			return 0, io.EOF
		}
		if n > MaxChunkSize {
			return 0, fmt.Errorf("%w: chunk of %d bytes, limit %d", ErrFrameTooLarge, n, MaxChunkSize)
		}
		c.left = n
	}
	if len(p) == 0 {
		return 0, nil
	}
	if uint32(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.R.Read(p)
	c.left -= uint32(n)
	if err == io.EOF {
		if c.left > 0 || n == 0 {
			return n, fmt.Errorf("guestproto: truncated chunk: %w", io.ErrUnexpectedEOF)
		}
		err = nil
	}
	return n, err
}
