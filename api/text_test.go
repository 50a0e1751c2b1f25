package api

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" = accepted, else a part of the error
	}{
		{"web-1", ""},
		{"Zürich 東京 ✓", ""},
		{"", ""},
		{"a\x1b[31mred", `contains U+001B`},
		{"line\nbreak", `contains U+000A`},
		{"tab\there", `contains U+0009`},
		{"bell\a", `contains U+0007`},
		{"del\x7f", `contains U+007F`},
		{"c1\u0085", `contains U+0085`},
		{"admin\u202Etxt.exe", `contains U+202E`},
		{"\u2066isolate\u2069", `contains U+2066`},
		{"mark\u200F", `contains U+200F`},
		{"sep\u2028", `contains U+2028`},
		{"bad\xffbyte", `not valid UTF-8 (at byte 3)`},
		{"\xed\xa0\x80", `not valid UTF-8`}, // an encoded surrogate
	} {
		err := CheckText("label app", tc.in)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckText(%q) = %v; want accepted", tc.in, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckText(%q) = %v; want an error containing %q", tc.in, err, tc.want)
		case err != nil:
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeInvalidArgument {
				t.Errorf("CheckText(%q) = %#v; want invalid_argument", tc.in, err)
			}
			if strings.ContainsAny(err.Error(), "\x1b\n\t\a\u202E") {
				t.Errorf("CheckText(%q)'s error shows the character raw: %q", tc.in, err.Error())
			}
		}
	}
}

func TestCheckSecret(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"correct horse battery staple", true},
		{`p@ss w0rd!"\`, true},
		{"пароль\u202E", true}, // shown to no one: only bytes must survive
		{"bad\xff", false},
		{"lone\uFFFDsurrogate", false}, // what a decoder makes of "\ud800"
		{"nul\x00", false},
		{"newline\n", false},
	} {
		if err := CheckSecret("egress password", tc.in); (err == nil) != tc.ok {
			t.Errorf("CheckSecret(%q) = %v; want ok=%v", tc.in, err, tc.ok)
		} else if err != nil && strings.Contains(err.Error(), tc.in) {
			t.Errorf("CheckSecret's error shows the secret: %v", err)
		}
	}
}

func TestEscapeText(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                 "plain",
		"Zürich ✓":              "Zürich ✓",
		"a\x1b[2Jb":             `a\x1b[2Jb`,
		"x\r\ny\tz":             `x\r\ny\tz`,
		"evil\u202Egnp.exe":     `evil\u202egnp.exe`,
		"bad\xffbyte":           `bad\xffbyte`,
		"c1\u009b":              `c1\x9b`,
		`back\slash`:            `back\slash`,
		"replacement \uFFFD ok": "replacement \uFFFD ok",
	} {
		if got := EscapeText(in); got != want {
			t.Errorf("EscapeText(%q) = %q; want %q", in, got, want)
		}
		if CheckText("x", EscapeText(in)) != nil {
			t.Errorf("EscapeText(%q) = %q still holds an unsafe character", in, EscapeText(in))
		}
	}
}

func FuzzEscapeText(f *testing.F) {
	for _, s := range []string{"", "a\x1b[0m", "\u202e", "\xff\xfe", "\u2028\t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := EscapeText(s)
		if err := CheckText("x", got); err != nil {
			t.Fatalf("EscapeText(%q) = %q: %v", s, got, err)
		}
		if CheckText("x", s) == nil && got != s {
			t.Fatalf("EscapeText changed safe text %q into %q", s, got)
		}
	})
}
