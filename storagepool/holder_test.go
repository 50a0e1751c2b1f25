package storagepool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A holder record is written atomically next to its object, read back
// bounded and checked, names one node's grant, and goes with the object.
func TestHolderRecord(t *testing.T) {
	dir := t.TempDir()
	layer := filepath.Join(dir, "ws-1.qcow2")
	if h, err := ReadHolder(layer); h != nil || err != nil {
		t.Fatalf("no record yet: %v %v", h, err)
	}
	at := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	if err := WriteHolder(layer, Holder{NodeID: "node-a", Incarnation: 3, Grant: "inst-1", WrittenAt: at}); err != nil {
		t.Fatal(err)
	}
	h, err := ReadHolder(layer)
	if err != nil || h == nil || *h != (Holder{FormatVersion: 1, NodeID: "node-a", Incarnation: 3, Grant: "inst-1", WrittenAt: at}) {
		t.Fatalf("read back %+v %v", h, err)
	}
	if !h.Names("node-a", "inst-1") || h.Names("node-b", "inst-1") || h.Names("node-a", "inst-2") {
		t.Errorf("Names of %s", h)
	}
	// Handed over: node-b's record replaces it whole.
	if err := WriteHolder(layer, Holder{NodeID: "node-b", Incarnation: 1, Grant: "inst-2", WrittenAt: at}); err != nil {
		t.Fatal(err)
	}
	if h, _ := ReadHolder(layer); !h.Names("node-b", "inst-2") {
		t.Errorf("after the handover: %s", h)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "ws-1.qcow2.holder" {
		t.Errorf("directory after two writes: %v", entries)
	}
	for name, content := range map[string]string{
		"garbage":  "not json",
		"no grant": `{"node_id":"node-a"}`,
		"too big":  `{"node_id":"node-a","grant":"g","x":"` + strings.Repeat("x", 5000) + `"}`,
	} {
		os.WriteFile(HolderPath(layer), []byte(content), 0o600)
		if h, err := ReadHolder(layer); err == nil {
			t.Errorf("%s: read as %+v", name, h)
		}
	}
	if err := WriteHolder(layer, Holder{NodeID: "node-a"}); err == nil {
		t.Error("a record without a grant was written")
	}
	if err := RemoveHolder(layer); err != nil {
		t.Fatal(err)
	}
	if err := RemoveHolder(layer); err != nil {
		t.Errorf("removing twice: %v", err)
	}
}

// Holder records carry their format: one without (an older build's) is
// read, a newer one refused.
func TestHolderRecordFormats(t *testing.T) {
	obj := filepath.Join(t.TempDir(), "layer.qcow2")
	os.WriteFile(HolderPath(obj), []byte(`{"node_id":"node-a","incarnation":3,"grant":"inst-1"}`), 0o600)
	if h, err := ReadHolder(obj); err != nil || h.NodeID != "node-a" {
		t.Fatalf("a record without a version: %+v, %v", h, err)
	}
	os.WriteFile(HolderPath(obj), []byte(`{"format_version":2,"node_id":"node-a","incarnation":3,"grant":"inst-1"}`), 0o600)
	if _, err := ReadHolder(obj); err == nil || !strings.Contains(err.Error(), "has version 2, this build reads [1]") {
		t.Fatalf("a newer record: %v", err)
	}
	if err := WriteHolder(obj, Holder{NodeID: "node-b", Grant: "inst-2"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(HolderPath(obj)); !strings.Contains(string(b), `"format_version":1`) {
		t.Fatalf("written record %s", b)
	}
}
