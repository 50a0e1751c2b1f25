package posixacl

import (
	"reflect"
	"testing"
)

// Allows decides as the kernel does: the owner's entry alone for the
// owner, a named user's under the mask, any matching group that grants
// (matching groups that all deny: denied, other is not asked), else other.
func TestAllows(t *testing.T) {
	const owner, group = 0, 0
	vmmOnly := append(FromMode(0o710), Entry{User, Execute, 994}, Entry{Mask, Execute, NoID})
	for _, tc := range []struct {
		name   string
		ents   []Entry
		uid    uint32
		groups []uint32
		want   bool
	}{
		{"mode 0700, another user", FromMode(0o700), 995, []uint32{995}, false},
		{"mode 0711, another user", FromMode(0o711), 995, []uint32{995}, true},
		{"mode 0710, in the file's group", FromMode(0o710), 995, []uint32{995, group}, true},
		{"the owner by its entry only", FromMode(0o077), owner, []uint32{group}, false},
		{"an ACL naming another user", vmmOnly, 995, []uint32{995}, false},
		{"an ACL naming the user", vmmOnly, 994, []uint32{994}, true},
		{"a named user under a mask without x", append(FromMode(0o700), Entry{User, Execute, 995}, Entry{Mask, 0, NoID}), 995, []uint32{995}, false},
		{"a named group", append(FromMode(0o700), Entry{Group, Execute, 42}, Entry{Mask, Execute, NoID}), 995, []uint32{995, 42}, true},
		{"matching groups deny, other would grant", append(FromMode(0o701), Entry{Group, 0, 42}, Entry{Mask, 7, NoID}), 995, []uint32{42}, false},
		{"a named user wins over other", append(FromMode(0o701), Entry{User, 0, 995}, Entry{Mask, 7, NoID}), 995, []uint32{995}, false},
	} {
		if got := Allows(tc.ents, owner, group, tc.uid, tc.groups, Execute); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestEncodeDecode(t *testing.T) {
	ents := append(FromMode(0o750), Entry{Mask, 5, NoID}, Entry{User, Execute, 994})
	got, err := Decode(Encode(ents))
	want := []Entry{{UserObj, 7, NoID}, {User, Execute, 994}, {GroupObj, 5, NoID}, {Mask, 5, NoID}, {Other, 0, NoID}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip: %v, %v; want %v (sorted by tag)", got, err, want)
	}
	for _, b := range [][]byte{nil, {2, 0, 0}, {1, 0, 0, 0}, {2, 0, 0, 0, 1}} {
		if _, err := Decode(b); err == nil {
			t.Errorf("Decode(%v) took it", b)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(FromMode(0o755)))
	f.Fuzz(func(t *testing.T, b []byte) {
		ents, err := Decode(b)
		if err != nil {
			return
		}
		if got, _ := Decode(Encode(ents)); len(got) != len(ents) {
			t.Fatalf("%d entries re-encoded as %d", len(ents), len(got))
		}
		Allows(ents, 0, 0, 1, []uint32{1}, Execute)
	})
}
