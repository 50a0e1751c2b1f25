package guest

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// The recorder's ring keeps exactly the last recordSize bytes read, in
// order, whatever the read sizes.
func TestRecorderTail(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, total := range []int{0, 1, 100, recordSize - 1, recordSize, recordSize + 1, 3*recordSize + 777} {
		data := make([]byte, total)
		for i := range data {
			data[i] = byte(rng.IntN(256))
		}
		r := &recorder{}
		for off := 0; off < total; {
			n := min(total-off, 1+rng.IntN(2*recordSize))
			if rng.IntN(4) == 0 {
				n = min(total-off, 1+rng.IntN(64))
			}
			r.record(data[off : off+n])
			off += n
		}
		want := data[max(0, total-recordSize):]
		if got := r.tail(); !bytes.Equal(got, want) {
			t.Errorf("%d bytes: tail is %d bytes, want the last %d", total, len(got), len(want))
		}
	}
}

// The channel's buffer keeps its bytes in order across compaction and
// unread, without growing past its store.
func TestChannelAddCompacts(t *testing.T) {
	c := &channel{}
	var want []byte
	next := byte(0)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 2000; i++ {
		n := 1 + rng.IntN(4096)
		b := make([]byte, n)
		for j := range b {
			b[j] = next
			next++
		}
		c.add(b)
		want = append(want, b...)
		if rng.IntN(50) == 0 {
			c.buf = append(append([]byte{}, want[:0]...), c.buf...) // as unread does
		}
		// Consume some, as a view does.
		k := min(len(c.buf), rng.IntN(6000))
		if !bytes.Equal(c.buf[:k], want[:k]) {
			t.Fatalf("round %d: consumed bytes differ", i)
		}
		c.buf, want = c.buf[k:], want[k:]
		if len(c.buf) > maxBuffered {
			k := len(c.buf) - maxBuffered/2
			c.buf, want = c.buf[k:], want[k:]
		}
	}
	if !bytes.Equal(c.buf, want) {
		t.Fatal("buffered bytes differ")
	}
}
