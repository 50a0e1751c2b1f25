package api

import (
	"strings"
	"testing"
)

func TestCheckJSON(t *testing.T) {
	for body, want := range map[string]string{
		``:   "",
		`{}`: "",
		`{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}`: "",
		`[{"a":1},{"a":1}]`:                         "",
		`{"a":[1,2,{"b":[]}],"b":"a"}`:              "",
		`{"a":1,"a":2}`:                             `key "a" twice`,
		`{"x":{"a":1,"a":2}}`:                       `key "a" twice`,
		`{"x":[{"a":1,"a":2}]}`:                     `key "a" twice`,
		`{"x":{"a":1},"x":{"b":2}}`:                 `key "x" twice`,
		`{"\u001b":1,"\u001b":2}`:                   `key "\\x1b" twice`,
		"{\"a\":\"\xff\"}":                          "not valid UTF-8",
		`{"a":`:                                     "not valid JSON",
	} {
		err := CheckJSON([]byte(body))
		switch {
		case want == "" && err != nil:
			t.Errorf("CheckJSON(%q) = %v; want accepted", body, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("CheckJSON(%q) = %v; want an error containing %q", body, err, want)
		}
	}
}
