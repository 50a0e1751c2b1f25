package cluster_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/kibotos/kibotos/api"
)

// A write body is read whole and strictly: padded past the limit it is
// refused (413) rather than cut to what fits, which decoded 4 MiB of
// spaces as an empty body and drained a node without the version guard
// its fields carried; a key given twice, or text that is not UTF-8, is
// refused rather than read as whichever value a decoder keeps.
func TestWriteBodiesAreReadWholeAndStrictly(t *testing.T) {
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
