package fsm

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A Raft snapshot holds a read transaction while it writes the state out
// (seconds, for a large state). Applies that grow the state file meanwhile
// must not wait for it: bbolt remaps the file only once every read
// transaction ended, so a file mapped no larger than it was would stall
// every apply until the snapshot is written.
func TestApplyDoesNotWaitForASnapshot(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	write, release, err := h.f.BeginSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	var before bytes.Buffer
	if err := write(&before); err != nil {
		t.Fatal(err)
	}
	done := make(chan []Result)
	go func() {
		// About 4 MiB of command records: the file grows many times
		// over what it held when the snapshot began.
		var failed []Result
		pad := strings.Repeat("p", 1000)
		for i := range 32 {
			var es []Entry
			for j := range 128 {
				op := OpNodeDrain
				if j%2 == 1 {
					op = OpNodeCancelDrain
				}
				es = append(es, makeEntry(t0, op, NodeArgs{NodeID: "node-a"}, withCommand(fmt.Sprintf("c-%d-%d-%s", i, j, pad)), withCommandLog()))
			}
			for _, r := range h.f.Apply(es) {
				if r.Error != nil {
					failed = append(failed, r)
				}
			}
		}
		done <- failed
	}()
	select {
	case failed := <-done:
		if len(failed) > 0 {
			t.Fatalf("%d writes failed, the first: %v", len(failed), failed[0].Error)
		}
	case <-time.After(30 * time.Second):
		release()
		<-done
		t.Fatal("the applies waited for the snapshot's read transaction")
	}
	// The snapshot still writes the state as of its beginning (the
	// bytes of pages it does not use may differ).
	var after bytes.Buffer
	if err := write(&after); err != nil {
		t.Fatal(err)
	}
	if b, a := mustDump(t, restoredFrom(t, &before)), mustDump(t, restoredFrom(t, &after)); a != b {
		t.Fatalf("the snapshot's state changed under it:\n%s", diffLines(b, a))
	}
}
