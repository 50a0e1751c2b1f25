package fsm

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sampleEntries() []Entry {
	v := uint64(42)
	zero := uint64(0)
	at := time.Date(2026, 12, 3, 1, 2, 3, 456789012, time.UTC)
	return []Entry{
		{Op: OpNodeDrain, IssuedAt: at, Args: json.RawMessage(`{"node_id":"node-1"}`)},
		{CommandID: "cmd-1", ExpectedVersion: &v, CommandDigest: true, IssuedAt: at, Actor: "admin:alice", Op: OpOvercommitSet, Args: json.RawMessage(`{"node_id":"n","cpu":{"value":"2"}}`)},
		{ExpectedVersion: &zero, IssuedAt: at, Op: OpMemberLevel, IgnoreUnknown: true, Args: json.RawMessage(`{}`)},
		{IssuedAt: at, Op: OpWorkspaceCreate, CountPlacements: true, Actor: "ünïcode \x00 actor", Args: json.RawMessage(`{"template":"t","labels":{"a":"\u00e9"}}`)},
		{IssuedAt: time.Unix(0, 0).UTC(), Op: "op.without.args"},
		{IssuedAt: time.Date(1960, 1, 1, 0, 0, 0, 1, time.UTC), Op: OpBootstrap, Args: json.RawMessage(`[1,2,3]`)},
		{CommandID: "cmd-2", CommandDigest: true, CommandLog: true, IssuedAt: at, Op: OpNodeDrain, Args: json.RawMessage(`{"node_id":"node-1"}`)},
	}
}

// Both formats decode to the same entry, field for field: an apply cannot
// tell which one the leader wrote.
func TestEntryFormatsDecodeAlike(t *testing.T) {
	for i, e := range sampleEntries() {
		js, err := EncodeEntryJSON(&e)
		if err != nil {
			t.Fatal(err)
		}
		bin := EncodeEntry(&e)
		if bin[0] != entryFormatV1 || js[0] != '{' {
			t.Fatalf("entry %d: formats start with %q and %q", i, bin[0], js[0])
		}
		fromJSON, err := DecodeEntry(js)
		if err != nil {
			t.Fatalf("entry %d JSON: %v", i, err)
		}
		fromBin, err := DecodeEntry(bin)
		if err != nil {
			t.Fatalf("entry %d binary: %v", i, err)
		}
		if !reflect.DeepEqual(fromJSON, fromBin) {
			t.Fatalf("entry %d decodes differently:\nJSON   %+v\nbinary %+v", i, fromJSON, fromBin)
		}
		if !fromBin.IssuedAt.Equal(e.IssuedAt) || !bytes.Equal(fromBin.Args, e.Args) || inputHash(&fromBin) != inputHash(&e) {
			t.Fatalf("entry %d: binary round trip changed it: %+v", i, fromBin)
		}
		if len(bin) >= len(js) {
			t.Errorf("entry %d: binary %d bytes, JSON %d", i, len(bin), len(js))
		}
	}
}

// Every cut of a binary entry short of its arguments is refused, and a
// format or flag this build does not know is named, never guessed at.
func TestDecodeEntryRefuses(t *testing.T) {
	e := sampleEntries()[1]
	bin := EncodeEntry(&e)
	argsAt := len(bin) - len(e.Args)
	for n := 0; n < argsAt; n++ {
		if _, err := DecodeEntry(bin[:n]); err == nil {
			t.Fatalf("entry cut at %d of %d bytes decoded", n, len(bin))
		}
	}
	newer := append([]byte{0x02}, bin[1:]...)
	if _, err := DecodeEntry(newer); err == nil || !strings.Contains(err.Error(), "format 0x02 is unknown") {
		t.Fatalf("format 2: %v", err)
	}
	flagged := append([]byte(nil), bin...)
	flagged[1] |= 0x80
	if _, err := DecodeEntry(flagged); err == nil || !strings.Contains(err.Error(), "flags 0x89 are unknown") {
		t.Fatalf("unknown flag: %v", err)
	}
	// A length beyond the entry is an error, not an allocation.
	huge := []byte{entryFormatV1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}
	if _, err := DecodeEntry(huge); err == nil {
		t.Fatal("a 4 GiB command id length decoded")
	}
}

// An entry decoded from the binary format applies as the JSON one did.
func TestBinaryEntriesApply(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	h.join("node-1")
	e := h.entry(OpNodeDrain, NodeArgs{NodeID: "node-1"})
	got, err := DecodeEntry(EncodeEntry(&e))
	if err != nil {
		t.Fatal(err)
	}
	if r := h.f.Apply([]Entry{got}); r[0].Error != nil {
		t.Fatalf("drain from a binary entry: %v", r[0].Error)
	}
	if n := h.node("node-1"); !n.DrainRequested {
		t.Fatalf("node-1 not drained: %+v", n)
	}
}

func FuzzDecodeEntry(f *testing.F) {
	for _, e := range sampleEntries() {
		f.Add(EncodeEntry(&e))
		js, _ := EncodeEntryJSON(&e)
		f.Add(js)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := DecodeEntry(data)
		if err != nil || len(data) == 0 || data[0] != entryFormatV1 {
			return
		}
		// What decodes encodes to an entry that decodes the same.
		again, err := DecodeEntry(EncodeEntry(&e))
		if err != nil || !reflect.DeepEqual(again, e) {
			t.Fatalf("%x decoded as %+v, then as %+v (%v)", data, e, again, err)
		}
	})
}
