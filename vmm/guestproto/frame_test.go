package guestproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	in := []Request{
		{Call: CallGuestInfo},
		{Call: CallExec, Args: []byte(`{"id":"x","argv":["sh","-c","echo \u0000"]}`)},
	}
	for _, r := range in {
		if err := WriteFrame(&buf, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range in {
		var got Request
		if err := ReadFrame(&buf, &got); err != nil {
			t.Fatal(err)
		}
		if got.Call != want.Call || !bytes.Equal(got.Args, want.Args) {
			t.Fatalf("got %+v, want %+v", got, want)
		}
	}
	if err := ReadFrame(&buf, &Request{}); err != io.EOF {
		t.Fatalf("clean end: got %v, want io.EOF", err)
	}
}

func TestFrameSizeLimit(t *testing.T) {
	big := Request{Call: strings.Repeat("x", MaxHeaderSize)}
	if err := WriteFrame(io.Discard, big); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("write: got %v, want ErrFrameTooLarge", err)
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], MaxHeaderSize+1)
	// The reader must refuse before allocating or waiting for the body.
	if _, err := ReadFrameBytes(bytes.NewReader(hdr[:])); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("read: got %v, want ErrFrameTooLarge", err)
	}
}

func TestFrameTruncated(t *testing.T) {
	var buf bytes.Buffer
	WriteFrame(&buf, Request{Call: CallStat, Args: []byte(`{"path":"/etc/hostname"}`)})
	full := buf.Bytes()
	for n := 1; n < len(full); n++ {
		_, err := ReadFrameBytes(bytes.NewReader(full[:n]))
		if err == nil || err == io.EOF {
			t.Fatalf("%d of %d bytes: got %v, want an unexpected-EOF error", n, len(full), err)
		}
	}
	if err := ReadFrame(bytes.NewReader([]byte{0, 0, 0, 2, '{', '!'}), &Request{}); err == nil {
		t.Fatal("bad JSON decoded without error")
	}
}

func TestChunks(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), MaxChunkSize/5) // two chunks
	var buf bytes.Buffer
	cw := &ChunkWriter{W: &buf}
	if _, err := cw.Write(data); err != nil {
		t.Fatal(err)
	}
	if _, err := cw.Write(nil); err != nil {
		t.Fatal(err)
	}
	cw.Close()
	buf.WriteString("trailer")
	got, err := io.ReadAll(&ChunkReader{R: &buf})
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("round trip: %d bytes, err %v", len(got), err)
	}
	if buf.String() != "trailer" {
		t.Fatalf("reader consumed past the end chunk: %q left", buf.String())
	}

	var short bytes.Buffer
	cw = &ChunkWriter{W: &short}
	cw.Write([]byte("hello"))
	b := short.Bytes()
	for n := 0; n < len(b); n++ {
		if _, err := io.ReadAll(&ChunkReader{R: bytes.NewReader(b[:n])}); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("truncated at %d: got %v", n, err)
		}
	}
}

func FuzzReadFrame(f *testing.F) {
	var buf bytes.Buffer
	WriteFrame(&buf, Request{Call: CallExec, Args: []byte(`{"argv":["true"]}`)})
	f.Add(buf.Bytes())
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Add([]byte{0, 0, 0, 5, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			var req Request
			if err := ReadFrame(r, &req); err != nil {
				return
			}
		}
	})
}

func FuzzChunkReader(f *testing.F) {
	var buf bytes.Buffer
	cw := &ChunkWriter{W: &buf}
	cw.Write([]byte("some data"))
	cw.Close()
	f.Add(buf.Bytes())
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 3, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		io.Copy(io.Discard, &ChunkReader{R: bytes.NewReader(b)})
	})
}
