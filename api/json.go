package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"unicode/utf8"
)

// CheckJSON refuses a request body that a lenient decoder would read
// differently from a strict one: text that is not UTF-8 (the decoder
// replaces it with U+FFFD, so a password or a name would silently change)
// and an object with the same key twice (the decoder keeps the last, a
// proxy or a log reader may see the first). An empty body passes.
func CheckJSON(raw []byte) error {
	if !utf8.Valid(raw) {
		return Errorf(CodeInvalidArgument, "request body is not valid UTF-8: send JSON text in UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	// One set of keys per open object; nil for an open array.
	var open []map[string]bool
	expectKey := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) && len(open) == 0 {
			return nil
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return Errorf(CodeInvalidArgument, "request body is not valid JSON: %v", err)
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				open = append(open, map[string]bool{})
				expectKey = true
				continue
			case '[':
				open = append(open, nil)
			case '}', ']':
				open = open[:len(open)-1]
			}
		case string:
			if expectKey {
				keys := open[len(open)-1]
				if keys[t] {
					return Errorf(CodeInvalidArgument, "request body has the key %q twice in one object: send each field once", EscapeText(t))
				}
				keys[t] = true
				expectKey = false
				continue
			}
		}
		// After a value inside an object the next token is a key.
		expectKey = len(open) > 0 && open[len(open)-1] != nil
	}
}
