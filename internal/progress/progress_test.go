package progress

import (
	"io"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
)

// A transfer is listed from Begin to its end, counts what is read through
// it, and a newer transfer under the same key is not taken off the board
// by the end of the one it replaced.
func TestBoard(t *testing.T) {
	var b Board
	if _, ok := b.Get("workspace/x"); ok {
		t.Fatal("an empty board lists a transfer")
	}
	c, end := b.Begin("workspace/x", "template fetch", 10)
	if _, err := io.Copy(io.Discard, c.Reader(strings.NewReader("abcd"))); err != nil {
		t.Fatal(err)
	}
	if p, ok := b.Get("workspace/x"); !ok || p != (api.ByteProgress{What: "template fetch", DoneBytes: 4, TotalBytes: 10}) {
		t.Fatalf("after reading 4 bytes: %+v %v", p, ok)
	}
	c.Set(7, 12)
	if p, _ := b.Get("workspace/x"); p.DoneBytes != 7 || p.TotalBytes != 12 {
		t.Fatalf("after Set(7, 12): %+v", p)
	}
	_, endNewer := b.Begin("workspace/x", "platform fetch", -1)
	end()
	if p, ok := b.Get("workspace/x"); !ok || p.What != "platform fetch" {
		t.Fatalf("the end of a replaced transfer took the newer one off: %+v %v", p, ok)
	}
	endNewer()
	if _, ok := b.Get("workspace/x"); ok {
		t.Fatal("a transfer is listed after its end")
	}
	var none *Counter
	none.Set(1, 2) // counts nothing, does not panic
}
