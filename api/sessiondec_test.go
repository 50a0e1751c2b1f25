package api

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// A session decoder reads message after message, however many bytes the
// session carries in all, and refuses one message over the bound without
// reading further.
func TestSessionDecoderBoundsAMessage(t *testing.T) {
	var stream bytes.Buffer
	enc := json.NewEncoder(&stream)
	big := strings.Repeat("x", MaxSessionMessage/4)
	for range 10 { // 2.5 times the bound in all
		if err := enc.Encode(SessionMsg{Type: MsgReport, Message: big}); err != nil {
			t.Fatal(err)
		}
	}
	d := NewSessionDecoder(&stream)
	for i := range 10 {
		var m SessionMsg
		if err := d.Decode(&m); err != nil || m.Message != big {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	var m SessionMsg
	if err := d.Decode(&m); err != io.EOF {
		t.Fatalf("after the last message: %v, want EOF", err)
	}

	stream.Reset()
	if err := enc.Encode(SessionMsg{Type: MsgReport, Message: strings.Repeat("x", 2*MaxSessionMessage)}); err != nil {
		t.Fatal(err)
	}
	total := stream.Len()
	d = NewSessionDecoder(&stream)
	err := d.Decode(&m)
	if err == nil || !strings.Contains(err.Error(), "control session message over 16777216 bytes: refused") {
		t.Fatalf("a message of %d bytes: %v", total, err)
	}
	if read := total - stream.Len(); read > MaxSessionMessage {
		t.Fatalf("read %d bytes of a message over the bound of %d", read, MaxSessionMessage)
	}
}
