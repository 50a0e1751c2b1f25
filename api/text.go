package api

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Text a person reads (names, labels, addresses, messages) must show what
// it is: control characters move a terminal's cursor or change its
// colours, and bidirectional overrides and isolates reorder what is shown
// ("Trojan Source"), so a label can look like another. Such text is
// refused where it enters (CheckText) and escaped where it is shown
// (EscapeText). Secrets are compared byte for byte and never shown; they
// must only survive the trip unchanged (CheckSecret).

// unsafeRune says whether r may not appear in text a person reads on one
// line: a C0 or C1 control (tab and newline included), DEL, a bidi
// override, embedding, isolate or mark, or a line or paragraph separator.
func unsafeRune(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, // LRE RLE PDF LRO RLO
		r >= 0x2066 && r <= 0x2069,            // LRI RLI FSI PDI
		r == 0x200e, r == 0x200f, r == 0x061c, // LRM RLM ALM
		r == 0x2028, r == 0x2029: // line and paragraph separators
		return true
	}
	return false
}

// CheckText refuses s unless it is valid UTF-8 without control or
// bidirectional formatting characters; what names the field in the error.
func CheckText(what, s string) error {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size <= 1 {
				return Errorf(CodeInvalidArgument, "%s is not valid UTF-8 (at byte %d): give UTF-8 text", what, i)
			}
		}
		if unsafeRune(r) {
			return Errorf(CodeInvalidArgument, "%s %s contains %U, a control or bidirectional formatting character: give printable text", what, EscapeText(s), r)
		}
	}
	return nil
}

// CheckSecret refuses a password or similar credential that could not
// reach its user byte for byte: not valid UTF-8, a control character, or
// U+FFFD (what a JSON decoder puts in place of an invalid byte or a lone
// surrogate, so a different credential than the one typed).
func CheckSecret(what, s string) error {
	if !utf8.ValidString(s) || strings.ContainsRune(s, utf8.RuneError) {
		return Errorf(CodeInvalidArgument, "%s is not valid UTF-8 (or holds U+FFFD, a replaced invalid byte): give it as UTF-8 text", what)
	}
	for _, r := range s {
		if r < 0x20 || r >= 0x7f && r <= 0x9f {
			return Errorf(CodeInvalidArgument, "%s contains the control character %U: give printable characters only", what, r)
		}
	}
	return nil
}

// EscapeText returns s as it can be shown on one line: invalid UTF-8
// bytes as \xNN, and unsafe characters (see CheckText) as \t, \n, \r,
// \xNN or \uNNNN; everything else as is, backslashes included.
func EscapeText(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case unsafeRune(r) && r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func needsEscape(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || unsafeRune(r) {
			return true
		}
	}
	return !utf8.ValidString(s)
}
