package fsm

import (
	"bytes"
	stdjson "encoding/json"
	"testing"
)

// compactJSON skips the standard library's Compact for input without
// whitespace; its result must be exactly what Compact gives (the hash is
// compared with records other builds wrote).
func FuzzCompactJSON(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"a":"b c"}`, `{ "a" : 1 }`, "[1,\n2]", `{"a":`, `"\u2028"`, `{"a":"<&>"}`, `nul`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want := b
		var buf bytes.Buffer
		if stdjson.Compact(&buf, b) == nil {
			want = buf.Bytes()
		}
		if got := compactJSON(b); !bytes.Equal(got, want) {
			t.Fatalf("compactJSON(%q) = %q, want %q", b, got, want)
		}
	})
}
