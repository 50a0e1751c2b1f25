package kibotos_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/sdk/kibotos"
)

func TestEveryCallCarriesTheKeyAndTheNamespace(t *testing.T) {
	f := newFakeAPI(t)
	f.handle("GET /v1/namespaces/acme", func(*http.Request, []byte) (int, http.Header, any) {
		return 200, nil, api.Namespace{Name: "acme"}
	})
	c := f.connect(t, &kibotos.Options{Namespace: "acme"})
	if _, err := c.Workspaces.List(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	checks := f.seenOf("GET", "/v1/namespaces/acme")
	if len(checks) != 1 {
		t.Fatalf("Connect with namespace acme: %d reads of namespace acme, want the one check", len(checks))
	}
	for _, s := range append(checks, f.seenOf("GET", "/v1/workspaces")...) {
		if s.auth != "Bearer "+testKey {
			t.Errorf("%s %s: Authorization %q, want the key as a bearer", s.method, s.path, s.auth)
		}
		if s.query.Get("namespace") != "acme" {
			t.Errorf("%s %s: namespace=%q, want acme", s.method, s.path, s.query.Get("namespace"))
		}
	}
}

func TestConnectRefusesAServerTheCADidNotIssue(t *testing.T) {
	f := newFakeAPI(t)
	ctx := context.Background()
	_, err := kibotos.Connect(ctx, f.srv.URL, testKey, &kibotos.Options{CAPEM: otherCA(t)})
	if !errors.Is(err, kibotos.ErrUnauthenticated) || !strings.Contains(err.Error(), "CAFile") {
		t.Fatalf("Connect with another server's CA: %v; want unauthenticated naming the CA option", err)
	}
	if _, err := kibotos.Connect(ctx, f.srv.URL, testKey, nil); !errors.Is(err, kibotos.ErrUnauthenticated) {
		t.Fatalf("Connect with the system roots to a self-signed server: %v; want unauthenticated", err)
	}
	if n := len(f.seenOf("GET", "/v1/workspaces")); n != 0 {
		t.Fatalf("the server got %d requests from clients that did not trust it; want none (the key must not leave)", n)
	}
	// The right CA, from a file.
	file := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(file, f.caPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := kibotos.Connect(ctx, f.srv.URL, testKey, &kibotos.Options{CAFile: file}); err != nil {
		t.Fatalf("Connect with the server's CA file: %v", err)
	}
}

func TestConnectRefusesWhatCannotWork(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, url, token string
		opts             *kibotos.Options
		want             error
	}{
		{"plain http", "http://127.0.0.1:1", testKey, nil, kibotos.ErrInvalidArgument},
		{"no key", "https://127.0.0.1:1", "", nil, kibotos.ErrUnauthenticated},
		{"bad namespace", "https://127.0.0.1:1", testKey, &kibotos.Options{Namespace: "Not_A_Label"}, kibotos.ErrInvalidArgument},
		{"CA without a certificate", "https://127.0.0.1:1", testKey, &kibotos.Options{CAPEM: []byte("not pem")}, kibotos.ErrInvalidArgument},
		{"missing CA file", "https://127.0.0.1:1", testKey, &kibotos.Options{CAFile: "/nonexistent/ca.crt"}, kibotos.ErrInvalidArgument},
	} {
		if _, err := kibotos.Connect(ctx, tc.url, tc.token, tc.opts); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v; want %v", tc.name, err, tc.want)
		}
	}
}

func TestErrorsMatchTheirClass(t *testing.T) {
	f := newFakeAPI(t)
	c := f.connect(t, &kibotos.Options{MaxRetries: -1})
	for _, tc := range []struct {
		status int
		hdr    http.Header
		answer any
		want   error
		code   kibotos.Code
	}{
		{404, nil, api.Errorf(api.CodeNotFound, "workspace x does not exist"), kibotos.ErrNotFound, kibotos.CodeNotFound},
		{403, nil, api.Errorf(api.CodePermissionDenied, "API key k belongs to namespace a"), kibotos.ErrPermissionDenied, kibotos.CodePermissionDenied},
		{401, nil, api.Errorf(api.CodeUnauthenticated, "unknown key"), kibotos.ErrUnauthenticated, kibotos.CodeUnauthenticated},
		{412, nil, api.Errorf(api.CodeFailedPrecondition, "workspace x is STOPPED"), kibotos.ErrFailedPrecondition, kibotos.CodeFailedPrecondition},
		{429, nil, api.Errorf(api.CodeResourceExhausted, "namespace acme: memory quota 1.0GiB"), kibotos.ErrQuotaExceeded, kibotos.CodeResourceExhausted},
		{503, nil, api.Errorf(api.CodeUnavailable, "no leader"), kibotos.ErrUnavailable, kibotos.CodeUnavailable},
		{504, nil, api.Errorf(api.CodeDeadlineExceeded, "too slow"), kibotos.ErrTimedOut, kibotos.CodeDeadlineExceeded},
		{409, nil, api.Errorf(api.CodeAlreadyExists, "volume data exists"), kibotos.ErrAlreadyExists, kibotos.CodeAlreadyExists},
		{409, nil, api.Errorf(api.CodeVersionMismatch, "version 3, not 2"), kibotos.ErrVersionMismatch, kibotos.CodeVersionMismatch},
		{409, nil, api.Errorf(api.CodeAborted, "aborted"), kibotos.ErrAborted, kibotos.CodeAborted},
		{400, nil, api.Errorf(api.CodeInvalidArgument, "bad"), kibotos.ErrInvalidArgument, kibotos.CodeInvalidArgument},
		{413, nil, api.Errorf(api.CodeTooLarge, "body too large"), kibotos.ErrInvalidArgument, kibotos.CodeTooLarge},
		{500, nil, api.Errorf(api.CodeInternal, "bug"), kibotos.ErrInternal, kibotos.CodeInternal},
		{429, http.Header{"Retry-After": {"3"}}, api.Errorf(api.CodeResourceExhausted, "over its rate"), kibotos.ErrRateLimited, kibotos.CodeResourceExhausted},
		// Something in between answered, not the API.
		{502, nil, "<html>bad gateway</html>", kibotos.ErrUnavailable, kibotos.CodeUnavailable},
	} {
		f.handle("GET /v1/workspaces/ws-1", func(*http.Request, []byte) (int, http.Header, any) { return tc.status, tc.hdr, tc.answer })
		_, err := c.Workspaces.Get(context.Background(), "ws-1")
		if !errors.Is(err, tc.want) || kibotos.CodeOf(err) != tc.code {
			t.Errorf("answer %d %v: got %v (code %s); want %v with code %s", tc.status, tc.answer, err, kibotos.CodeOf(err), tc.want, tc.code)
		}
		var e *kibotos.Error
		if !errors.As(err, &e) || e.Status != tc.status {
			t.Errorf("answer %d: error %#v does not carry the status", tc.status, err)
		}
	}
	// A quota refusal is no rate limit, and a rate limit no quota refusal.
	f.handle("GET /v1/workspaces/ws-1", func(*http.Request, []byte) (int, http.Header, any) {
		return 429, nil, api.Errorf(api.CodeResourceExhausted, "namespace acme: memory quota")
	})
	if _, err := c.Workspaces.Get(context.Background(), "ws-1"); errors.Is(err, kibotos.ErrRateLimited) {
		t.Errorf("a quota refusal matched ErrRateLimited: %v", err)
	}
	f.handle("GET /v1/workspaces/ws-1", func(*http.Request, []byte) (int, http.Header, any) {
		return 429, http.Header{"Retry-After": {"7"}}, api.Errorf(api.CodeResourceExhausted, "over its rate")
	})
	_, err := c.Workspaces.Get(context.Background(), "ws-1")
	var e *kibotos.Error
	if errors.Is(err, kibotos.ErrResourceExhausted) || !errors.As(err, &e) || !e.RateLimited || e.RetryAfter != 7*time.Second {
		t.Errorf("a rate limit: %#v; want RateLimited with RetryAfter 7s, not a quota refusal", err)
	}
}

func TestRateLimitedCallsComeBackAfterRetryAfter(t *testing.T) {
	f := newFakeAPI(t)
	c := f.connect(t, nil)
	calls := 0
	f.handle("POST /v1/workspaces/ws-1/timeout", func(*http.Request, []byte) (int, http.Header, any) {
		calls++
		if calls == 1 {
			return 429, http.Header{"Retry-After": {"1"}}, api.Errorf(api.CodeResourceExhausted, "over its rate")
		}
		return 200, nil, api.Workspace{WorkspaceID: "ws-1", State: api.WorkspaceAvailable, Version: 4, TimeoutSeconds: 7200}
	})
	f.handle("GET /v1/workspaces/ws-1", func(*http.Request, []byte) (int, http.Header, any) {
		return 200, nil, api.Workspace{WorkspaceID: "ws-1", State: api.WorkspaceAvailable, Version: 3}
	})
	ws, err := c.Workspaces.Get(context.Background(), "ws-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.SetTimeout(context.Background(), 2*time.Hour); err != nil {
		t.Fatalf("SetTimeout through a rate limit: %v", err)
	}
	s := f.seenOf("POST", "/v1/workspaces/ws-1/timeout")
	if len(s) != 2 {
		t.Fatalf("%d requests; want the refused one and its retry", len(s))
	}
	if gap := s[1].at.Sub(s[0].at); gap < time.Second {
		t.Errorf("retried %v after a Retry-After of 1 s", gap)
	}
	if string(s[0].body) != string(s[1].body) {
		t.Errorf("the retry sent %s, the first %s: a retry must repeat the command id", s[1].body, s[0].body)
	}
	if ws.Timeout != 2*time.Hour || ws.Version != 4 {
		t.Errorf("after SetTimeout: timeout %v version %d; want the answer's 2h and 4", ws.Timeout, ws.Version)
	}

	// A deadline before the server would take the call again: refused
	// at once, not after the wait.
	calls = 0
	f.handle("POST /v1/workspaces/ws-1/timeout", func(*http.Request, []byte) (int, http.Header, any) {
		calls++
		return 429, http.Header{"Retry-After": {"30"}}, api.Errorf(api.CodeResourceExhausted, "over its rate")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err = ws.SetTimeout(ctx, time.Hour)
	if !errors.Is(err, kibotos.ErrRateLimited) || time.Since(start) > 4*time.Second || calls != 1 {
		t.Errorf("rate limited for 30 s with 5 s left: %v after %v and %d calls; want ErrRateLimited at once", err, time.Since(start), calls)
	}
}

func TestUnavailableCallsAreRetriedWithTheSameCommand(t *testing.T) {
	f := newFakeAPI(t)
	c := f.connect(t, nil)
	calls := 0
	f.handle("POST /v1/volumes", func(*http.Request, []byte) (int, http.Header, any) {
		calls++
		if calls < 3 {
			return 503, nil, api.Errorf(api.CodeUnavailable, "no leader")
		}
		return 200, nil, api.Volume{VolumeID: "vol-1", Name: "data", State: api.VolumeAvailable, SizeBytes: 64 << 20}
	})
	v, err := c.Volumes.Create(context.Background(), kibotos.VolumeSpec{Name: "data", Size: 64 * kibotos.MiB})
	if err != nil || v.State != kibotos.VolumeAvailable {
		t.Fatalf("Create through two unavailable answers: %+v, %v", v, err)
	}
	s := f.seenOf("POST", "/v1/volumes")
	if len(s) != 3 || string(s[0].body) != string(s[2].body) || !strings.Contains(string(s[0].body), `"command_id":"sdk-`) {
		t.Fatalf("requests %d, bodies %s / %s; want 3 carrying the same command id", len(s), s[0].body, s[len(s)-1].body)
	}
}

func TestMaxRetriesBoundsTheAttempts(t *testing.T) {
	f := newFakeAPI(t)
	c := f.connect(t, &kibotos.Options{MaxRetries: 2})
	f.handle("GET /v1/volumes/data", func(*http.Request, []byte) (int, http.Header, any) {
		return 503, nil, api.Errorf(api.CodeUnavailable, "no leader")
	})
	if _, err := c.Volumes.Get(context.Background(), "data"); !errors.Is(err, kibotos.ErrUnavailable) {
		t.Fatalf("Get while no leader answers: %v; want ErrUnavailable", err)
	}
	if n := len(f.seenOf("GET", "/v1/volumes/data")); n != 3 {
		t.Fatalf("%d requests with MaxRetries 2; want the first and 2 retries", n)
	}
}
