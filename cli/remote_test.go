package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/trust"
)

// remoteAPI is a stand-in for a ctrl member's API listener (a
// certificate of the cluster CA) and a node's data plane: it records the
// key of every call and hands out credentials for that data plane.
type remoteAPI struct {
	url, caFile, otherCAFile string
	dataPlane                string // address of the data plane

	// answer, when set, answers what it can before the default handler.
	answer func(w http.ResponseWriter, req *http.Request) bool

	mu    sync.Mutex
	keys  []string
	calls []string // method and request URI of each call
}

func (r *remoteAPI) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...)
}

func newRemoteAPI(t *testing.T, dataPlaneCA *trust.CA) *remoteAPI {
	t.Helper()
	ca, err := trust.NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := trust.NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	if dataPlaneCA == nil {
		dataPlaneCA = ca
	}
	pair := func(ca *trust.CA, kind string) tls.Certificate {
		c, err := ca.IssueTLS(trust.Identity{ClusterID: "c1", Kind: kind, NodeID: "n1"}, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	dir := t.TempDir()
	r := &remoteAPI{caFile: filepath.Join(dir, "ca.crt"), otherCAFile: filepath.Join(dir, "other.crt")}
	os.WriteFile(r.caFile, ca.CertPEM, 0o600)
	os.WriteFile(r.otherCAFile, other.CertPEM, 0o600)

	// The data plane takes the connection and closes it unanswered: how
	// far a client gets shows whether it trusted the certificate.
	dp, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair(dataPlaneCA, trust.KindDataPlane)}, NextProtos: []string{dataplane.ALPN}})
	if err != nil {
		t.Fatal(err)
	}
	r.dataPlane = dp.Addr().String()
	var wg sync.WaitGroup
	t.Cleanup(func() { dp.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := dp.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	})

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.keys = append(r.keys, req.Header.Get("Authorization"))
		r.calls = append(r.calls, req.Method+" "+req.URL.RequestURI())
		answer := r.answer
		r.mu.Unlock()
		if answer != nil && answer(w, req) {
			return
		}
		var result any
		switch {
		case req.URL.Path == "/v1/status":
			result = api.Status{ClusterID: "c1", NodeID: "n1", Roles: []string{"ctrl"}, Advertise: "127.0.0.1:7480", RaftState: "Leader"}
		case strings.HasSuffix(req.URL.Path, "/credentials"):
			result = api.DataPlaneCredential{WorkspaceID: "ws1", NodeID: "n1", Address: r.dataPlane, Credential: "c", ExpiresAt: time.Now().Add(time.Minute)}
		default:
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.Errorf(api.CodeNotFound, "no %s here", req.URL.Path)})
			return
		}
		json.NewEncoder(w).Encode(api.ResultBody{Result: result})
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair(ca, trust.KindAPIServer)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// remoteHost is a host with neither a member data directory nor an
// operator credential: whatever works there needs none.
func remoteHost(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	t.Setenv("KIBOTOS_DATA_DIR", filepath.Join(home, "no-member"))
	for _, k := range []string{"KIBOTOS_ADDR", "KIBOTOS_CREDENTIALS", "KIBOTOS_API_URL", "KIBOTOS_TOKEN", "KIBOTOS_CA_FILE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
}

func (r *remoteAPI) seenCalls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// The state resume and move check before they write is read from the
// ctrl leader (?consistent=true) even without --consistent: a member
// whose replica lags, one that just restarted, would answer that a live
// Workspace does not exist (found by the fault harness, nemesis).
func TestWritePreconditionsReadConsistently(t *testing.T) {
	remoteHost(t)
	r := newRemoteAPI(t, nil)
	t.Setenv("KIBOTOS_TOKEN", "k")
	for _, args := range [][]string{{"workspace", "resume", "ws1"}, {"workspace", "move", "ws1", "--node", "n2"}} {
		before := len(r.seenCalls())
		_, errOut, code := runKibo(append([]string{"--api-url", r.url, "--ca-file", r.caFile}, args...)...)
		calls := r.seenCalls()[before:]
		if code != api.ExitNotFound || len(calls) != 1 || calls[0] != "GET /v1/workspaces/ws1?consistent=true" {
			t.Errorf("%v against an API that knows no ws1: exit %d (%q), calls %q; want %d after one consistent read", args, code, errOut, calls, api.ExitNotFound)
		}
	}
}

// A member whose replica lags answers "not found" for a Workspace the
// leader has: a wait after a write asks the leader before it says the
// Workspace is gone (found by the fault harness: a start answered exit 12
// through a member that had just restarted).
func TestWaitAsksTheLeaderBeforeGone(t *testing.T) {
	remoteHost(t)
	r := newRemoteAPI(t, nil)
	t.Setenv("KIBOTOS_TOKEN", "k")
	reply := func(w http.ResponseWriter, ws api.Workspace) bool {
		json.NewEncoder(w).Encode(api.ResultBody{Result: ws})
		return true
	}
	r.mu.Lock()
	r.answer = func(w http.ResponseWriter, req *http.Request) bool {
		switch {
		case req.Method == "POST" && req.URL.Path == "/v1/workspaces/ws1/start":
			return reply(w, api.Workspace{WorkspaceID: "ws1", State: api.WorkspaceStarting, Version: 5})
		case req.Method == "GET" && req.URL.Path == "/v1/workspaces/ws1" && req.URL.Query().Get("consistent") == "true":
			return reply(w, api.Workspace{WorkspaceID: "ws1", State: api.WorkspaceAvailable, Version: 6})
		}
		return false // the lagging replica: not found
	}
	r.mu.Unlock()
	out, errOut, code := runKibo("--api-url", r.url, "--ca-file", r.caFile, "workspace", "start", "ws1")
	if code != 0 {
		t.Fatalf("start through a lagging member: exit %d, %s%s; calls %q", code, out, errOut, r.seenCalls())
	}
}

func runKibo(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = Main(context.Background(), "kibo", args, nil, &out, &errb)
	return out.String(), errb.String(), code
}

// --api-url, --token and --ca-file, or KIBOTOS_API_URL, KIBOTOS_TOKEN and
// KIBOTOS_CA_FILE (a flag wins over its variable), are all a host needs
// to call the API: the key goes as a bearer, the server is checked
// against the CA file, and a missing key is exit 18 in one line.
func TestRemoteFlagsAndEnvironment(t *testing.T) {
	remoteHost(t)
	r := newRemoteAPI(t, nil)

	out, errOut, code := runKibo("--api-url", r.url, "--token", "flag-key", "--ca-file", r.caFile, "status")
	if code != 0 || !strings.Contains(out, "n1") {
		t.Fatalf("status with the flags: exit %d, %s%s", code, out, errOut)
	}
	t.Setenv("KIBOTOS_API_URL", r.url)
	t.Setenv("KIBOTOS_TOKEN", "env-key")
	t.Setenv("KIBOTOS_CA_FILE", r.caFile)
	if _, errOut, code := runKibo("status"); code != 0 {
		t.Fatalf("status with the environment: exit %d, %s", code, errOut)
	}
	if _, errOut, code := runKibo("--token", "flag-key", "status"); code != 0 {
		t.Fatalf("status with --token over KIBOTOS_TOKEN: exit %d, %s", code, errOut)
	}
	t.Setenv("KIBOTOS_API_URL", "https://127.0.0.1:1")
	if _, errOut, code := runKibo("--api-url", r.url, "status"); code != 0 {
		t.Fatalf("status with --api-url over KIBOTOS_API_URL: exit %d, %s", code, errOut)
	}
	if got, want := r.seen(), []string{"Bearer flag-key", "Bearer env-key", "Bearer flag-key", "Bearer env-key"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("keys the API received: %q, want %q", got, want)
	}

	// A CA file of another CA: the server is not trusted, nothing sent.
	_, errOut, code = runKibo("--api-url", r.url, "--ca-file", r.otherCAFile, "status")
	if code != api.ExitUnauthenticated || !strings.Contains(errOut, "does not trust") || len(r.seen()) != 4 {
		t.Fatalf("with another CA file: exit %d, %q, %d calls; want %d, not trusted, no call", code, errOut, len(r.seen()), api.ExitUnauthenticated)
	}
	os.Unsetenv("KIBOTOS_TOKEN")
	_, errOut, code = runKibo("--api-url", r.url, "status")
	if code != api.ExitUnauthenticated || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "needs an API key: pass --token KEY or set KIBOTOS_TOKEN") {
		t.Fatalf("without a key: exit %d, %q; want %d in one line", code, errOut, api.ExitUnauthenticated)
	}
}

// exec, terminal, cp and port-forward from such a host: the credential
// comes from the API with the key, and the node's data plane is checked
// against --ca-file alone, which must be given.
func TestRemoteDataPlaneUsesTheCAFile(t *testing.T) {
	remoteHost(t)
	r := newRemoteAPI(t, nil)
	t.Setenv("KIBOTOS_TOKEN", "k")

	_, errOut, code := runKibo("--api-url", r.url, "workspace", "exec", "ws1", "--", "true")
	if code != api.ExitInvalidArgument || !strings.Contains(errOut, "give the cluster CA file") || len(r.seen()) != 0 {
		t.Fatalf("exec without --ca-file: exit %d, %q, %d calls; want %d before any call", code, errOut, len(r.seen()), api.ExitInvalidArgument)
	}
	// Trusted: the data plane is reached (and, a stand-in, answers nothing).
	_, errOut, _ = runKibo("--api-url", r.url, "--ca-file", r.caFile, "workspace", "exec", "ws1", "--", "true")
	if !strings.Contains(errOut, "no answer to the credential") {
		t.Fatalf("exec with the cluster CA file: %q, want the data plane reached", errOut)
	}

	// A data plane whose certificate another CA issued is refused.
	other, err := trust.NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	r = newRemoteAPI(t, other)
	_, errOut, code = runKibo("--api-url", r.url, "--ca-file", r.caFile, "workspace", "exec", "ws1", "--", "true")
	if code != api.ExitUnavailable || !strings.Contains(errOut, "not valid for this cluster") {
		t.Fatalf("exec to a data plane of another CA: exit %d, %q; want %d, its certificate refused", code, errOut, api.ExitUnavailable)
	}
}

// Against a cluster: the key kibo api-key create printed on a member's
// host is all another host needs, with the API URL and the cluster CA
// file, to work in the key's namespace, and no more than that.
func TestRemoteAgainstACluster(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, API: &cluster.APIConfig{}})
	m := e.c.Members[0]
	key := strings.TrimSpace(e.mustRun("api-key", "create", "app", "--role", "sandbox"))
	url, ca := "https://"+m.Server.APIAddr(), m.Dir.CACert()

	remoteHost(t)
	if out, errOut, code := runKibo("--api-url", url, "--token", key, "--ca-file", ca, "volume", "create", "data", "--size", "64MiB"); code != 0 {
		t.Fatalf("volume create with the key: exit %d, %s%s", code, out, errOut)
	}
	if out, errOut, code := runKibo("--api-url", url, "--token", key, "--ca-file", ca, "volume", "list", "-q"); code != 0 || strings.Count(out, "\n") != 1 {
		t.Fatalf("volume list with the key: exit %d, %q %s; want its one Volume", code, out, errOut)
	}
	if _, errOut, code := runKibo("--api-url", url, "--token", key, "--ca-file", ca, "node", "list"); code != api.ExitPermissionDenied {
		t.Fatalf("node list with the key: exit %d, %s; want %d", code, errOut, api.ExitPermissionDenied)
	}
	if _, errOut, code := runKibo("--api-url", url, "--token", key+"x", "--ca-file", ca, "volume", "list"); code != api.ExitUnauthenticated {
		t.Fatalf("volume list with a wrong key: exit %d, %s; want %d", code, errOut, api.ExitUnauthenticated)
	}
}
