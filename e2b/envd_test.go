package e2b

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// envelope frames one Connect message.
func envelope(flags byte, v any) []byte {
	raw, _ := json.Marshal(v)
	out := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(raw)))
	return append(out, raw...)
}

// A start's request as the guest's exec: the command and its arguments,
// the environment in a stable order, the directory, the Workspace's
// root; E2B's "user" as the template's own user and any other by name;
// what cannot run is refused, saying so.
func TestExecRequest(t *testing.T) {
	cwd := "/tmp"
	req := startRequest{Process: processConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi"}, Envs: map[string]string{"B": "2", "A": "1"}, Cwd: &cwd}}
	r := httptest.NewRequest("POST", "/process.Process/Start", nil)
	got, err := execRequest(r, &req)
	if err != nil || !slices.Equal(got.Argv, []string{"/bin/bash", "-l", "-c", "echo hi"}) || !slices.Equal(got.Env, []string{"A=1", "B=2"}) || got.Dir != "/tmp" || got.Root != guestproto.WorkspaceRoot {
		t.Fatalf("exec of a start: %+v, %v", got, err)
	}
	r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:")))
	yes := true
	req.Stdin = &yes
	if got, err := execRequest(r, &req); err != nil || !got.Stdin || got.User != "" {
		t.Errorf("with stdin, as the user E2B's SDKs name by default: %+v %v", got, err)
	}
	r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
	if got, err := execRequest(r, &req); err != nil || got.User != "root" {
		t.Errorf("as root: %+v %v", got, err)
	}
	term := &ptyConfig{}
	term.Size.Cols, term.Size.Rows = 80, 24
	if got, err := execRequest(r, &startRequest{Process: processConfig{Cmd: "/bin/bash"}, PTY: term}); err != nil || got.PTY == nil || got.PTY.Cols != 80 || got.PTY.Rows != 24 || !got.Stdin {
		t.Errorf("with a PTY: %+v %v", got, err)
	}
	for _, c := range []struct {
		name string
		req  startRequest
		user string
		code string
		want string
	}{
		{"a PTY of no size", startRequest{Process: processConfig{Cmd: "sh"}, PTY: &ptyConfig{}}, "", "invalid_argument", "pty size 0x0"},
		{"no command", startRequest{}, "", "invalid_argument", "process.cmd is empty"},
		{"a bad variable", startRequest{Process: processConfig{Cmd: "sh", Envs: map[string]string{"A=B": "1"}}}, "", "invalid_argument", "not valid"},
	} {
		r := httptest.NewRequest("POST", "/process.Process/Start", nil)
		if c.user != "" {
			r.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.user+":")))
		}
		_, err := execRequest(r, &c.req)
		ce, ok := err.(*connectError)
		if !ok || ce.Code != c.code || !strings.Contains(ce.Message, c.want) {
			t.Errorf("%s: %v, want %s saying %q", c.name, err, c.code, c.want)
		}
	}
}

// The Connect framing: a request message read back, a stream's messages
// and its end with an error, a unary error with its HTTP status.
func TestConnectFraming(t *testing.T) {
	var req startRequest
	if err := readEnvelope(bytes.NewReader(envelope(0, map[string]any{"process": map[string]any{"cmd": "ls"}})), &req); err != nil || req.Process.Cmd != "ls" {
		t.Fatalf("read a request message: %+v %v", req, err)
	}
	if err := readEnvelope(bytes.NewReader(envelope(flagCompressed, map[string]any{})), &req); err == nil || !strings.Contains(err.Error(), "compressed") {
		t.Errorf("a compressed message: %v", err)
	}
	huge := []byte{0, 0xff, 0xff, 0xff, 0xff}
	if err := readEnvelope(bytes.NewReader(huge), &req); err == nil || !strings.Contains(err.Error(), "resource_exhausted") {
		t.Errorf("a message of 4 GiB: %v", err)
	}

	w := httptest.NewRecorder()
	s := newStream(w)
	s.send(startResponse{Event: processEvent{Data: &dataEvent{Stdout: []byte("hi\n")}}})
	s.end(rpcErrorf("deadline_exceeded", "too long"))
	want := append(envelope(0, map[string]any{"event": map[string]any{"data": map[string]any{"stdout": "aGkK"}}}),
		envelope(flagEndStream, map[string]any{"error": map[string]any{"code": "deadline_exceeded", "message": "too long"}})...)
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != connectStreamJSON || !bytes.Equal(w.Body.Bytes(), want) {
		t.Errorf("stream: %d %q %q, want %q", w.Code, w.Header().Get("Content-Type"), w.Body.Bytes(), want)
	}

	w = httptest.NewRecorder()
	unaryError(w, rpcErrorf("unimplemented", "not yet"))
	if w.Code != http.StatusNotImplemented || !strings.Contains(w.Body.String(), `"code":"unimplemented"`) {
		t.Errorf("unary error: %d %s", w.Code, w.Body)
	}
}

// find's records as EntryInfo: types, sizes as strings, modes, times,
// link targets, and a path with a tab.
func TestParseEntries(t *testing.T) {
	out := "f\t12\t644\t-rw-r--r--\tuser\tuser\t1765000000.5\t\t/home/user/a b\x00" +
		"d\t4096\t755\tdrwxr-xr-x\tuser\tuser\t1765000000\t\t/home/user/dir\x00" +
		"l\t7\t777\tlrwxrwxrwx\troot\troot\t1765000000\t/etc/hosts\t/home/user/with\ttab\x00"
	got, err := parseEntries([]byte(out))
	if err != nil || len(got) != 3 {
		t.Fatalf("%+v %v", got, err)
	}
	if e := got[0]; e.Name != "a b" || e.Type != "FILE_TYPE_FILE" || e.Size != "12" || e.Mode != 0o644 || e.Permissions != "-rw-r--r--" || e.ModifiedTime != "2025-12-06T05:46:40.5Z" {
		t.Errorf("file: %+v", e)
	}
	if e := got[1]; e.Type != "FILE_TYPE_DIRECTORY" || e.Path != "/home/user/dir" {
		t.Errorf("directory: %+v", e)
	}
	if e := got[2]; e.Type != "FILE_TYPE_SYMLINK" || e.SymlinkTarget != "/etc/hosts" || e.Path != "/home/user/with\ttab" || e.Name != "with\ttab" {
		t.Errorf("link: %+v", e)
	}
	if _, err := parseEntries([]byte("garbage\x00")); err == nil {
		t.Error("a record that is not one was taken")
	}
}

// The signature of a file URL is the SDKs': for e2b@2.51's getSignature
// of path /home/user/a.txt, read, user "", token "k.t", no expiry, node
// computes v1_ and the unpadded base64 SHA-256 below.
func TestFileSignature(t *testing.T) {
	if got, want := fileSignature("/home/user/a.txt", "read", "", "k.t", ""), "v1_"+sdkSignature; got != want {
		t.Fatalf("signature %q, want the SDK's %q", got, want)
	}
	if fileSignature("/home/user/a.txt", "write", "", "k.t", "") == fileSignature("/home/user/a.txt", "read", "", "k.t", "") {
		t.Fatal("read and write sign alike")
	}
}

// sdkSignature is node's crypto SHA-256 of "/home/user/a.txt:read::k.t",
// base64 without padding, as the SDK's sha256() gives it.
const sdkSignature = "Re+MmipINabLDsAB+OEoPeMZQRgVY/NnBR33wTjjU6o"
