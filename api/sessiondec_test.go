package api

import (
	"bytes"
	"encoding/json"
	"fmt"
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

// Messages over the decoder's read-ahead buffer, blank lines between
// messages and a message cut short by the end of the stream.
func TestSessionDecoderLines(t *testing.T) {
	long := strings.Repeat("y", 3*sessionReadBuffer+17)
	stream := strings.NewReader(`{"type":"ping","t1":1}` + "\n\n" + `{"type":"report","message":"` + long + `"}` + "\n" +
		`{"type":"pong","t2":2}` + "\n" + `{"type":"po`)
	d := NewSessionDecoder(stream)
	for i, want := range []SessionMsg{{Type: MsgPing, T1: 1}, {Type: MsgReport, Message: long}, {Type: MsgPong, T2: 2}} {
		var m SessionMsg
		if err := d.Decode(&m); err != nil || m.Type != want.Type || m.T1 != want.T1 || m.T2 != want.T2 || m.Message != want.Message {
			t.Fatalf("message %d: %+v, %v; want %+v", i, m, err, want)
		}
	}
	var m SessionMsg
	if err := d.Decode(&m); err != io.ErrUnexpectedEOF {
		t.Fatalf("a message cut short: %v, want %v", err, io.ErrUnexpectedEOF)
	}
}

// BenchmarkSessionDecode decodes a node's report message (50 Instances)
// as a leader reads it after every task, with this decoder and, for
// reference in the same run, the standard library's stream decoder.
//
//	go test ./api -run X -bench SessionDecode
func BenchmarkSessionDecode(b *testing.B) {
	rep := &Report{ReportVersion: 7, Pools: []Pool{{PoolID: "default", Path: "/var/lib/kibotos/pools/default", Available: true, CapacityBytes: 1 << 40, FreeBytes: 1 << 39}},
		Templates: []string{"base"}, TemplateBytes: map[string]uint64{"base": 1 << 30}}
	for i := range 50 {
		rep.InstanceStates = append(rep.InstanceStates, InstanceState{InstanceID: fmt.Sprintf("inst-%032d", i), State: "RUNNING"})
	}
	msg, err := json.Marshal(SessionMsg{Type: MsgTaskResult, NodeID: "node-0001", SessionID: "s-0001", Report: rep})
	if err != nil {
		b.Fatal(err)
	}
	stream := bytes.Repeat(append(msg, '\n'), 100)
	for _, dec := range []struct {
		name   string
		decode func(io.Reader) func(*SessionMsg) error
	}{
		{"session", func(r io.Reader) func(*SessionMsg) error { return NewSessionDecoder(r).Decode }},
		{"stdlib", func(r io.Reader) func(*SessionMsg) error {
			d := json.NewDecoder(r)
			return func(m *SessionMsg) error { return d.Decode(m) }
		}},
	} {
		b.Run(dec.name, func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			for b.Loop() {
				decode := dec.decode(bytes.NewReader(stream))
				for range 100 {
					var m SessionMsg
					if err := decode(&m); err != nil || len(m.Report.InstanceStates) != 50 {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
