package recordfmt

import (
	"errors"
	"testing"
)

func TestCheck(t *testing.T) {
	r := Range{Min: 8, Max: 9}
	if err := r.Check("/x", 8); err != nil {
		t.Fatal(err)
	}
	err := r.Check("/var/lib/kibotos/storage/runtime/registry/i.json", 7)
	if err == nil || err.Error() != "/var/lib/kibotos/storage/runtime/registry/i.json has version 7, this build reads [8 9]" || !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("older: %v", err)
	}
	if err := Current(1).Check("/y", 2); err == nil || err.Error() != "/y has version 2, this build reads [1]: a newer kibotos wrote it; run that release again (there is no rollback)" {
		t.Fatalf("newer: %v", err)
	}
	if err := Current(1).CheckJSON("/z", []byte(`{"node_id":"a"}`), 1); err != nil {
		t.Fatalf("legacy record without a version: %v", err)
	}
	if err := Current(1).CheckJSON("/z", []byte(`{"format_version":3}`), 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("version 3: %v", err)
	}
	if err := Current(1).CheckJSON("/z", []byte(`{`), 1); err == nil || errors.Is(err, ErrOutOfRange) {
		t.Fatalf("corrupt: %v", err)
	}
}
