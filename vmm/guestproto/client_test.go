package guestproto

import (
	"bytes"
	"io"
	"slices"
	"testing"
	"testing/iotest"
)

// A file written from a reader that gives a little at a time (a request
// body, a TLS record a read) still goes in full chunks: the reader's
// reads are gathered until the buffer is full, then the rest at the end.
func TestFullReaderFillsChunks(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 4096+1) // 64 KiB and 16 bytes
	r := fullReader{iotest.HalfReader(bytes.NewReader(data))}
	var sizes []int
	buf := make([]byte, 16<<10)
	var got []byte
	for {
		n, err := r.Read(buf)
		if n > 0 {
			sizes = append(sizes, n)
			got = append(got, buf[:n]...)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, want the %d written", len(got), len(data))
	}
	want := []int{16 << 10, 16 << 10, 16 << 10, 16 << 10, 16}
	if !slices.Equal(sizes, want) {
		t.Fatalf("read sizes %v, want %v", sizes, want)
	}
}
