package netlab

import (
	"io"
	"path/filepath"
	"testing"
	"time"
)

// A delayed wire carries traffic both ways and holds it: a TCP connect
// across it takes at least one round trip (SYN there, SYN-ACK back), and
// an echo another.
func TestWireDelayed(t *testing.T) {
	const oneWay = 5 * time.Millisecond
	l := New(t, filepath.Join(t.TempDir(), "ns"))
	l.Namespace("near")
	l.Namespace("far")
	l.WireDelayed("near", "wan0", "198.51.100.1/24", "far", "wan0", "198.51.100.2/24", oneWay)
	l.Echo("far", "198.51.100.2:7")

	start := time.Now()
	c, err := l.Dial("near", "198.51.100.2:7", 5*time.Second)
	if err != nil {
		t.Fatalf("connect across the delayed wire: %v", err)
	}
	defer c.Close()
	took := time.Since(start)
	t.Logf("connect across a wire of %v each way: %v", oneWay, took)
	if took < 2*oneWay {
		t.Errorf("connect took %v; a round trip of the wire is at least %v", took, 2*oneWay)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	start = time.Now()
	msg := []byte("across the wire")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo = %q, %v; want %q", got, err, msg)
	}
	if took := time.Since(start); took < 2*oneWay {
		t.Errorf("echo took %v; a round trip of the wire is at least %v", took, 2*oneWay)
	}
}
