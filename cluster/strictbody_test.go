package cluster_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
)

// A write body is read whole and strictly: padded past the limit it is
// refused (413) rather than cut to what fits, which decoded 4 MiB of
// spaces as an empty body and drained a node without the version guard
// its fields carried; a key given twice, or text that is not UTF-8, is
// refused rather than read as whichever value a decoder keeps.
func TestWriteBodiesAreReadWholeAndStrictly(t *testing.T) {
	t.Parallel()
	f := newFuzzMember(t)
	drain := "/v1/nodes/node-1/drain"
	guarded := []byte(`{"command_id":"strict-1","expected_version":999999}`)
	if code := f.post(t, f.admin, drain, guarded); code != http.StatusConflict {
		t.Fatalf("drain with a stale expected_version: %d, want 409 version_mismatch", code)
	}
	padded := append(bytes.Repeat([]byte(" "), 4<<20), guarded...)
	if code := f.post(t, f.admin, drain, padded); code != http.StatusRequestEntityTooLarge {
		t.Errorf("drain padded past 4 MiB: %d, want 413", code)
	}
	for name, body := range map[string][]byte{
		"a key twice":        []byte(`{"command_id":"strict-2","expected_version":1,"expected_version":999999}`),
		"a nested key twice": []byte(`{"command_id":"strict-3","x":{"a":1,"a":2}}`),
		"invalid UTF-8":      []byte("{\"command_id\":\"strict-\xff\"}"),
		"a leading BOM-ish":  []byte("\xff\xfe{}"),
		"an unknown field":   []byte(`{"command_id":"strict-4","force":true}`),
	} {
		if code := f.post(t, f.admin, drain, body); code != http.StatusBadRequest {
			t.Errorf("drain with %s: %d, want 400", name, code)
		}
	}
	var n api.Node
	req, _ := http.NewRequestWithContext(context.Background(), "GET", "https://"+f.addr+"/v1/nodes/node-1", nil)
	resp, err := f.admin.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_ = n
}

// Text a person reads is refused with control or bidi characters, a
// credential that a lone surrogate escape turned into U+FFFD is refused,
// and memory has an upper bound: where the request enters, nothing
// changed.
func TestCreateInputsAreChecked(t *testing.T) {
	t.Parallel()
	f := newFuzzMember(t)
	for path, body := range map[string]string{
		"/v1/workspaces":   `{"template":"kibotos-coding","cpu":"1","memory_bytes":536870912,"labels":{"app":"admin\u202etxt.exe"}}`,
		"/v1/workspaces#2": `{"template":"kibotos-coding","cpu":"1","memory_bytes":536870912,"labels":{"app":"a\u001b[2Jb"}}`,
		"/v1/workspaces#3": `{"template":"kibotos-coding","cpu":"1","memory_bytes":9223372036854775808}`,
		"/v1/egress":       `{"name":"corp","socks5":"10.0.0.1:1080","username":"u","password":"p\ud800w"}`,
		"/v1/egress#2":     `{"name":"corp","socks5":"10.0.0.1:1080","username":"u\u0007","password":"pw"}`,
		"/v1/egress#3":     `{"name":"corp","socks5":"10.0.0.1:1080","username":"u","password":"p\u0000"}`,
	} {
		path, _, _ = strings.Cut(path, "#")
		if code := f.post(t, f.admin, path, []byte(body)); code != http.StatusBadRequest {
			t.Errorf("POST %s %s: %d, want 400", path, body, code)
		}
	}
}
