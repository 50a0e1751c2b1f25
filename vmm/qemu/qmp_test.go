package qemu_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/vmm/qemu"
)

const qmpGreeting = `{"QMP": {"version": {"qemu": {"micro": 19, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7"}, "capabilities": ["oob"]}}`

// fakeQMP serves connections on a unix socket like QEMU's monitor, one
// at a time: greeting first, then for each command the lines answer
// returns, the command's id copied into each reply that has none (as
// QEMU does) unless noIDs is set. Commands it received are sent to got.
type fakeQMP struct {
	socket string
	got    chan map[string]any
	noIDs  atomic.Bool // answer like QEMU to requests it could not parse
}

func startFakeQMP(t *testing.T, greeting string, answer func(cmd string, args map[string]any) []string) *fakeQMP {
	t.Helper()
	f := &fakeQMP{socket: filepath.Join(t.TempDir(), "qmp.sock"), got: make(chan map[string]any, 16)}
	l, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		l.Close()
		<-done
	})
	serve := func(conn net.Conn) {
		defer conn.Close()
		// Unblock the reads below when the test ends.
		stop := context.AfterFunc(t.Context(), func() { conn.Close() })
		defer stop()
		w := bufio.NewWriter(conn)
		send := func(lines ...string) {
			for _, s := range lines {
				w.WriteString(s + "\r\n") // QEMU ends lines with CRLF
			}
			w.Flush()
		}
		send(greeting)
		dec := json.NewDecoder(conn)
		for {
			var req map[string]any
			if dec.Decode(&req) != nil {
				return
			}
			f.got <- req
			cmd, _ := req["execute"].(string)
			args, _ := req["arguments"].(map[string]any)
			if f.noIDs.Load() {
				send(answer(cmd, args)...)
			} else {
				send(withID(answer(cmd, args), req["id"])...)
			}
		}
	}
	go func() {
		defer close(done)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			serve(conn)
		}
	}()
	return f
}

// withID copies id into the replies (return or error) among lines that
// have no id key of their own.
func withID(lines []string, id any) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		var m map[string]any
		out[i] = l
		if json.Unmarshal([]byte(l), &m) != nil || (m["return"] == nil && m["error"] == nil) {
			continue
		}
		if _, has := m["id"]; has {
			continue
		}
		m["id"] = id
		b, _ := json.Marshal(m)
		out[i] = string(b)
	}
	return out
}

// ok answers every command with an empty return.
func ok(string, map[string]any) []string { return []string{`{"return": {}}`} }

func dialFake(t *testing.T, f *fakeQMP) *qemu.QMP {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	q, err := qemu.DialQMP(ctx, f.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	if got := <-f.got; got["execute"] != "qmp_capabilities" {
		t.Fatalf("first command %v, want qmp_capabilities", got)
	}
	return q
}

// Events QEMU sends between a command and its reply are skipped; the
// return value is decoded; block_resize sends the drive id and the size.
func TestQMPExecuteSkipsEvents(t *testing.T) {
	f := startFakeQMP(t, qmpGreeting, func(cmd string, _ map[string]any) []string {
		event := `{"timestamp": {"seconds": 1764400000, "microseconds": 1}, "event": "BLOCK_IO_ERROR", "data": {"device": "x"}}`
		switch cmd {
		case "query-status":
			return []string{event, event, `{"return": {"status": "running", "singlestep": false, "running": true}}`}
		default:
			return []string{event, `{"return": {}}`}
		}
	})
	q := dialFake(t, f)
	ctx := t.Context()
	var st struct {
		Status  string `json:"status"`
		Running bool   `json:"running"`
	}
	if err := q.Execute(ctx, "query-status", nil, &st); err != nil || st.Status != "running" || !st.Running {
		t.Fatalf("query-status: %+v, %v", st, err)
	}
	if got := <-f.got; got["execute"] != "query-status" || got["arguments"] != nil {
		t.Errorf("sent %v; want no arguments", got)
	}
	if err := q.BlockResize(ctx, "v-vol-1", 3<<30); err != nil {
		t.Fatal(err)
	}
	got := <-f.got
	args, _ := got["arguments"].(map[string]any)
	if got["execute"] != "block_resize" || args["device"] != "v-vol-1" || args["size"] != float64(3<<30) {
		t.Errorf("block_resize sent %v", got)
	}
}

// A command whose client went away mid-call still finishes, and QEMU
// writes its reply to the next client, at times before the greeting (seen
// after a given-up save's query-migrate): such replies are not taken for
// the greeting or for the reply to a command of this connection.
func TestQMPStrayReplies(t *testing.T) {
	stray := `{"return": {"status": "active", "expected-downtime": 300}, "id": "kibotos-0000000000000000-7"}`
	f := startFakeQMP(t, stray+"\r\n"+qmpGreeting, func(cmd string, _ map[string]any) []string {
		if cmd == "query-status" {
			return []string{stray, `{"return": {"status": "running", "running": true}}`}
		}
		return ok(cmd, nil)
	})
	q := dialFake(t, f)
	var st struct {
		Status string `json:"status"`
	}
	if err := q.Execute(t.Context(), "query-status", nil, &st); err != nil || st.Status != "running" {
		t.Fatalf("query-status: %+v, %v; want the reply to this command", st, err)
	}
	if got := <-f.got; got["id"] == nil {
		t.Errorf("sent %v; want an id", got)
	}
}

// QEMU's answer to a request it could not parse carries no id; it is
// taken as the answer, not waited past.
func TestQMPErrorWithoutID(t *testing.T) {
	f := startFakeQMP(t, qmpGreeting, func(cmd string, _ map[string]any) []string {
		if cmd == "query-status" {
			return []string{`{"error": {"class": "GenericError", "desc": "JSON parse error, expecting value"}}`}
		}
		return ok(cmd, nil)
	})
	q := dialFake(t, f)
	f.noIDs.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err := q.Execute(ctx, "query-status", nil, nil)
	var qe *qemu.QMPError
	if !errors.As(err, &qe) || qe.Class != "GenericError" {
		t.Fatalf("err = %v; want the GenericError at once", err)
	}
}

// A command QEMU refuses is a *QMPError naming the command; the
// connection stays usable.
func TestQMPError(t *testing.T) {
	f := startFakeQMP(t, qmpGreeting, func(cmd string, _ map[string]any) []string {
		if cmd == "block_resize" {
			return []string{`{"error": {"class": "DeviceNotFound", "desc": "Cannot find device='v-nope' nor node-name='v-nope'"}}`}
		}
		return ok(cmd, nil)
	})
	q := dialFake(t, f)
	err := q.BlockResize(t.Context(), "v-nope", 1<<20)
	var qe *qemu.QMPError
	if !errors.As(err, &qe) || qe.Class != "DeviceNotFound" || qe.Command != "block_resize" {
		t.Fatalf("err = %#v; want a QMPError of block_resize", err)
	}
	if want := "qmp block_resize: DeviceNotFound: Cannot find device='v-nope'"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message %q; want it to begin %q", err, want)
	}
	if err := q.Execute(t.Context(), "query-status", nil, nil); err != nil {
		t.Errorf("next command after an error answer: %v", err)
	}
}

func TestQMPBadPeers(t *testing.T) {
	t.Run("not a greeting", func(t *testing.T) {
		f := startFakeQMP(t, `{"hello": 1}`, ok)
		_, err := qemu.DialQMP(t.Context(), f.socket)
		if err == nil || !strings.Contains(err.Error(), "not a QMP greeting") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("line too long", func(t *testing.T) {
		f := startFakeQMP(t, qmpGreeting, func(string, map[string]any) []string {
			return []string{`{"return": "` + strings.Repeat("x", 2<<20) + `"}`}
		})
		_, err := qemu.DialQMP(t.Context(), f.socket)
		if err == nil || !strings.Contains(err.Error(), "a line longer than 1048576 bytes") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("no socket", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "qmp.sock")
		_, err := qemu.DialQMP(t.Context(), sock)
		if err == nil || !strings.Contains(err.Error(), sock) {
			t.Fatalf("err = %v; want it to name the socket", err)
		}
	})
}

// A QEMU that does not answer holds a call no longer than ctx; what is
// then on the wire is unknown, so the connection refuses further calls
// (but cont, which dials again).
func TestQMPDeadline(t *testing.T) {
	f := startFakeQMP(t, qmpGreeting, func(cmd string, _ map[string]any) []string {
		if cmd == "block_resize" {
			return nil // never answers
		}
		return ok(cmd, nil)
	})
	q := dialFake(t, f)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := q.BlockResize(ctx, "v-vol-1", 1<<30)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want the deadline", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("call returned after %v, past its 200ms deadline", d)
	}
	if err := q.Execute(t.Context(), "query-status", nil, nil); err == nil || !strings.Contains(err.Error(), "dial again") {
		t.Errorf("call after a timed-out one: %v; want it refused", err)
	}
	// Starting the vCPUs is how a caller undoes its stop whatever became
	// of its other calls: it dials again.
	if err := q.Cont(t.Context()); err != nil {
		t.Errorf("cont after a timed-out call: %v; want it sent on a new connection", err)
	}
}

// A save given up on mid-exchange leaves its connection unusable;
// Abandon dials again, cancels the migration, waits for it to end and
// only then starts the vCPUs.
func TestQMPAbandonGivenUpSave(t *testing.T) {
	cancelled := false
	f := startFakeQMP(t, qmpGreeting, func(cmd string, _ map[string]any) []string {
		switch {
		case cmd == "migrate_cancel":
			cancelled = true
		case cmd == "query-migrate" && !cancelled:
			return nil // QEMU busy saving: the answer comes after the caller gave up
		case cmd == "query-migrate":
			return []string{`{"return": {"status": "cancelled"}}`}
		}
		return ok(cmd, nil)
	})
	q := dialFake(t, f)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		for got := range f.got {
			if got["execute"] == "query-migrate" {
				cancel()
				return
			}
		}
	}()
	err := q.Save(ctx, os.Stdin)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("save given up on: %v", err)
	}
	var sent []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for got := range f.got {
			if sent = append(sent, got["execute"].(string)); got["execute"] == "cont" {
				return
			}
		}
	}()
	if err := q.Abandon(t.Context()); err != nil {
		t.Fatalf("abandon: %v", err)
	}
	<-done
	if want := "qmp_capabilities migrate_cancel query-migrate cont"; strings.Join(sent, " ") != want {
		t.Errorf("abandon sent %v; want %s", sent, want)
	}
}
