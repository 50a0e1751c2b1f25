package e2b

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// message is one envelope of a streamed answer.
type message struct {
	end  bool
	body map[string]any
}

// readMessages splits a streamed answer into its envelopes.
func readMessages(t *testing.T, body []byte) []message {
	t.Helper()
	var out []message
	r := bytes.NewReader(body)
	for {
		var head [5]byte
		if _, err := io.ReadFull(r, head[:]); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatalf("a truncated envelope in %q", body)
		}
		raw := make([]byte, binary.BigEndian.Uint32(head[1:]))
		if _, err := io.ReadFull(r, raw); err != nil {
			t.Fatalf("a truncated envelope in %q", body)
		}
		m := message{end: head[0]&flagEndStream != 0}
		if err := json.Unmarshal(raw, &m.body); err != nil {
			t.Fatalf("envelope %q: %v", raw, err)
		}
		out = append(out, m)
	}
}

// endCode is the error code of a stream's end, "" for success.
func endCode(t *testing.T, msgs []message) string {
	t.Helper()
	if len(msgs) == 0 || !msgs[len(msgs)-1].end {
		t.Fatalf("the stream has no end: %v", msgs)
	}
	e, _ := msgs[len(msgs)-1].body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

// fakeWatch is a watch whose events the test sends.
type fakeWatch struct {
	ch  chan guestproto.WatchEvent
	err error
}

func (f *fakeWatch) Events() <-chan guestproto.WatchEvent { return f.ch }
func (f *fakeWatch) Err() error                           { return f.err }

// A watch's events as envd streams them: each guest op as its EventType
// with the name unchanged, an op the proto lacks skipped; the end of the
// watch ends the stream cleanly when the directory went away, with the
// guest's bound as resource_exhausted, with a lost guest as unavailable;
// the request's deadline ends it with deadline_exceeded after keepalives.
func TestStreamWatch(t *testing.T) {
	run := func(ctx context.Context, every time.Duration, events []guestproto.WatchEvent, err error) []message {
		src := &fakeWatch{ch: make(chan guestproto.WatchEvent, len(events)), err: err}
		for _, e := range events {
			src.ch <- e
		}
		if ctx.Done() == nil { // a watch that ends by itself
			close(src.ch)
		}
		w := httptest.NewRecorder()
		streamWatch(ctx, newStream(w), src, every, "sb", "/home/user")
		return readMessages(t, w.Body.Bytes())
	}

	msgs := run(context.Background(), time.Hour, []guestproto.WatchEvent{
		{Name: "a", Op: guestproto.WatchCreate}, {Name: "a", Op: guestproto.WatchWrite}, {Name: "a", Op: guestproto.WatchChmod},
		{Name: "d/a", Op: guestproto.WatchRename}, {Name: "b", Op: "truncate"}, {Name: ".", Op: guestproto.WatchRemove},
	}, nil)
	var got []string
	for _, m := range msgs[:len(msgs)-1] {
		fs, _ := m.body["filesystem"].(map[string]any)
		got = append(got, fs["name"].(string)+" "+fs["type"].(string))
	}
	want := "a EVENT_TYPE_CREATE,a EVENT_TYPE_WRITE,a EVENT_TYPE_CHMOD,d/a EVENT_TYPE_RENAME,. EVENT_TYPE_REMOVE"
	if strings.Join(got, ",") != want || endCode(t, msgs) != "" {
		t.Errorf("events %v ending %v, want %s and a clean end", got, msgs[len(msgs)-1].body, want)
	}

	limit := &guestproto.Error{Code: guestproto.CodeResourceExhausted, Message: "more than 8192 directories"}
	if code := endCode(t, run(context.Background(), time.Hour, nil, limit)); code != "resource_exhausted" {
		t.Errorf("a watch past the guest's bound ends with %q", code)
	}
	if code := endCode(t, run(context.Background(), time.Hour, nil, io.ErrUnexpectedEOF)); code != "unavailable" {
		t.Errorf("a lost watch ends with %q", code)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	msgs = run(ctx, time.Millisecond, nil, nil)
	if code := endCode(t, msgs); code != "deadline_exceeded" || len(msgs) < 2 || msgs[0].body["keepalive"] == nil {
		t.Errorf("a quiet watch past its deadline: %v", msgs)
	}
}

// sandboxesOf answers every sandbox as not found.
type sandboxesOf struct{}

func (sandboxesOf) AccessToken(key, id string) (string, error) { return "", nil }
func (sandboxesOf) Open(ctx context.Context, token, id, remote string) (*guestproto.Client, func(), error) {
	return nil, nil, api.Errorf(api.CodeNotFound, "sandbox %s not found", id)
}
func (sandboxesOf) TrafficToken(key, id string) (string, error) { return "", nil }
func (sandboxesOf) CreatorToken(id string) (string, error)      { return "", nil }
func (s sandboxesOf) OpenPort(ctx context.Context, token, id, remote string) (*guestproto.Client, error) {
	return nil, api.Errorf(api.CodeNotFound, "sandbox %s not found", id)
}

// WatchDir is routed to the watch, and its errors end a 200 stream with
// their code (a streaming client reads no code from another status): no
// token, a sandbox not there, an empty path, includeEntry.
func TestWatchDirRoute(t *testing.T) {
	h := NewHandler(Config{Sandboxes: sandboxesOf{}})
	for _, c := range []struct {
		name, token string
		req         watchDirRequest
		code        string
	}{
		{"no token", "", watchDirRequest{Path: "/home/user"}, "unauthenticated"},
		{"no sandbox", "tok", watchDirRequest{Path: "/home/user"}, "not_found"},
		{"no path", "tok", watchDirRequest{}, "invalid_argument"},
		{"includeEntry", "tok", watchDirRequest{Path: "/home/user", IncludeEntry: true}, "unimplemented"},
	} {
		r := httptest.NewRequest("POST", "/filesystem.Filesystem/WatchDir", bytes.NewReader(envelope(0, c.req)))
		r.Header.Set("E2b-Sandbox-Id", "sb")
		r.Header.Set("E2b-Sandbox-Port", envdPort)
		r.Header.Set("Content-Type", connectStreamJSON)
		if c.token != "" {
			r.Header.Set("X-Access-Token", c.token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != connectStreamJSON {
			t.Errorf("%s: %d %s", c.name, w.Code, w.Header().Get("Content-Type"))
			continue
		}
		if code := endCode(t, readMessages(t, w.Body.Bytes())); code != c.code {
			t.Errorf("%s: ends with %q, want %s", c.name, code, c.code)
		}
	}
}
