package cluster_test

// Fuzz targets for every JSON body the API accepts. Each posts the fuzzed
// body to the real handler of a real one-voter member and asserts what a
// caller can see: no 5xx but 503-unavailable, an error body that is one
// JSON line with a one-line message, and a rejected write that leaves the
// cluster state byte-identical. `go test` runs the seeds below and those
// in testdata/fuzz; `go test -fuzz FuzzX` explores further.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

// fuzzMember is a one-voter member without a node agent: nothing but the
// fuzzed requests writes to its state, so a digest taken around one
// request shows exactly what that request changed.
type fuzzMember struct {
	srv       *cluster.Server
	addr      string
	admin     *http.Client
	adminTLS  trust.Client
	member    *http.Client // node-1's member certificate: the internal calls
	anon      *http.Client // no client certificate: what /v1/join sees
	workspace string       // a Workspace that exists in the state
}

// newFuzzMember builds the cluster with clustertest (so node-1 is
// registered and a Workspace exists), stops it and serves the same data
// directory again without the agent, once node-1's session is closed.
func newFuzzMember(t testing.TB) *fuzzMember {
	t.Helper()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding") // a Workspace can be placed
	}})
	m := c.Members[0]
	var ws api.Workspace
	if _, err := c.Client(m).Do(context.Background(), "POST", "/v1/workspaces",
		api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 512 << 20}, &ws); err != nil {
		t.Fatalf("create the seed Workspace: %v", err)
	}
	m.Stop()
	srv, err := cluster.Open(context.Background(), cluster.Config{DataDir: m.Dir, Timings: cluster.TestTimings()})
	if err != nil {
		t.Fatalf("serve %s again: %v", m.ID, err)
	}
	t.Cleanup(srv.Shutdown)
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		if !srv.IsLeader() {
			return false, "no leader"
		}
		// Entries committed before the restart are applied again only
		// now: without the barrier they land between a digest and the
		// next and look like the fuzzed request's doing.
		if err := srv.Raft().Barrier(5 * time.Second).Error(); err != nil {
			return false, "barrier: " + err.Error()
		}
		var live map[string]string
		srv.FSM().View(func(tx *bolt.Tx) (err error) { live, err = fsm.LiveSessions(tx); return })
		return len(live) == 0, "node-1's session is still open"
	})
	admin, err := m.Dir.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	anon := trust.Client{Pool: admin.Pool} // no certificate: only the join endpoint answers
	mc, err := m.Dir.MemberCertificate()
	if err != nil {
		t.Fatal(err)
	}
	memberTLS := trust.Client{Pool: admin.Pool, Cert: trust.Static(mc)}
	want := trust.Want{Kind: trust.KindMember}
	f := &fuzzMember{srv: srv, addr: m.Addr, workspace: ws.WorkspaceID,
		admin: &http.Client{Transport: admin.HTTPTransport(want, 10*time.Second), Timeout: time.Minute}, adminTLS: admin,
		anon:   &http.Client{Transport: anon.HTTPTransport(want, 10*time.Second), Timeout: time.Minute},
		member: &http.Client{Transport: memberTLS.HTTPTransport(want, 10*time.Second), Timeout: time.Minute}}
	t.Cleanup(f.member.CloseIdleConnections)
	t.Cleanup(f.admin.CloseIdleConnections)
	t.Cleanup(f.anon.CloseIdleConnections)
	return f
}

func (f *fuzzMember) digest(t *testing.T) []byte {
	t.Helper()
	// Every entry moves the FSM clock, rejected ones too; what counts is
	// that nothing was decided.
	d, err := f.srv.FSM().DumpDecisions()
	if err != nil {
		t.Fatalf("dump the state: %v", err)
	}
	return d
}

// post sends body to path and checks the answer's shape; it returns the
// status. A rejected request must leave the state as it was.
func (f *fuzzMember) post(t *testing.T, client *http.Client, path string, body []byte) int {
	t.Helper()
	before := f.digest(t)
	req, err := http.NewRequest("POST", "https://"+f.addr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("POST %s: read the answer: %v", path, err)
	}
	if resp.StatusCode == http.StatusOK {
		var rb struct {
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(raw, &rb); err != nil || len(rb.Result) == 0 {
			t.Fatalf("POST %s %q: 200 with body %q, want {\"result\": ...}", path, body, raw)
		}
		return resp.StatusCode
	}
	var eb api.ErrorBody
	if err := json.Unmarshal(raw, &eb); err != nil || eb.Error == nil || eb.Error.Message == "" {
		t.Fatalf("POST %s %q: %d with body %q, want an error body", path, body, resp.StatusCode, raw)
	}
	if strings.Contains(eb.Error.Message, "\n") || bytes.Contains(bytes.TrimSuffix(raw, []byte("\n")), []byte("\n")) {
		t.Fatalf("POST %s %q: error body is more than one line: %q", path, body, raw)
	}
	if resp.StatusCode >= 500 && eb.Error.Code != api.CodeUnavailable {
		t.Fatalf("POST %s %q: %d %s: %s", path, body, resp.StatusCode, eb.Error.Code, eb.Error.Message)
	}
	if after := f.digest(t); !bytes.Equal(before, after) {
		t.Fatalf("POST %s %q was rejected (%d %s: %s) but changed the state:\nbefore %s\nafter  %s",
			path, body, resp.StatusCode, eb.Error.Code, eb.Error.Message, before, after)
	}
	return resp.StatusCode
}

// bodySeeds are shapes every endpoint gets on top of its own valid bodies.
var bodySeeds = []string{
	``,
	`{}`,
	`null`,
	`[]`,
	`"x"`,
	`{`,
	`{"command_id":`,
	`{"unknown_field":1}`,
	`{"command_id":1}`,
	`{"command_id":"c-1","expected_version":-1}`,
	`{"command_id":"c-1","expected_version":18446744073709551616}`,
	`{"expected_version":1e400}`,
	`{"command_id":"` + strings.Repeat("k", 600) + `"}`,
	`{"command_id":"c-1","expected_version":1}`,
	`{"command_id":"c-1","command_id_generated":true}`,
	`{"a":{"b":{"c":[[[[{"d":null}]]]]}}}`,
	`{} {"trailing":"value"}`,
	"{\"command_id\":\"line\\nbreak\"}",
	"\xff\xfe{}",
}

func addSeeds(f *testing.F, paths int, own ...string) {
	for p := 0; p < paths; p++ {
		for _, b := range append(own, bodySeeds...) {
			f.Add(uint8(p), []byte(b))
		}
	}
}

// FuzzWorkspaceBodies: create, start, stop, delete, credentials and
// set-network.
func FuzzWorkspaceBodies(f *testing.F) {
	addSeeds(f, 12,
		`{"template":"kibotos-coding","cpu":1000,"memory_bytes":268435456}`,
		`{"template":"kibotos-coding","cpu":1000,"memory_bytes":268435456,"labels":{"team":"a"},"node_id":"node-1"}`,
		`{"template":"kibotos-coding","cpu":"0.5","memory_bytes":1}`,
		`{"template":"","cpu":0,"memory_bytes":0}`,
		`{"template":"kibotos-coding","cpu":99999999999999999999,"memory_bytes":18446744073709551615}`,
		`{"template":"kibotos-coding","cpu":-1,"memory_bytes":-1}`,
		`{"template":"kibotos-coding","cpu":1.5,"memory_bytes":1e3}`,
		`{"template":"../../etc/passwd","cpu":1000,"memory_bytes":268435456}`,
		`{"template":"kibotos-coding","cpu":1000,"memory_bytes":268435456,"labels":{"":""}}`,
		`{"template":"kibotos-coding","cpu":1000,"memory_bytes":268435456,"labels":[1,2]}`,
		`{"template":"kibotos-coding","cpu":1000,"memory_bytes":268435456,"node_id":"nope"}`,
		`{"node_id":"node-1"}`,
		`{"force":true}`,
		`{"force":"yes"}`,
		`{"wait":true}`,
		`{"template":"kibotos-coding","cpu":1000,"memory_bytes":268435456,"network":{"egress":"public","allow":["10.0.0.0/8"]}}`,
		`{"template":"kibotos-coding","cpu":1000,"memory_bytes":268435456,"network":{"egress":"corp","deny":["*.example.com"]}}`,
		`{"egress":"public","allow":["10.1.2.3","2001:db8::/32"],"deny":["192.0.2.0/24"]}`,
		`{"egress":"none","allow":[],"deny":[]}`,
		`{"allow":null,"resolver":""}`,
		`{"egress":"corp"}`,
		`{"resolver":"corp-dns"}`,
		`{"egress":"public","allow":["*.example.com"]}`,
		`{"egress":"public","allow":["10.0.0.0/33","fe80::1%eth0"]}`,
		`{"allow":"10.0.0.0/8"}`,
		`{"egress":7}`,
	)
	m := newFuzzMember(f)
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		id := m.workspace
		if which%12 >= 6 {
			id = "ws-nope"
		}
		path := "/v1/workspaces"
		if op := which % 6; op > 0 {
			path += "/" + id + "/" + []string{"", "start", "stop", "delete", "credentials", "network"}[op]
		}
		m.post(t, m.admin, path, body)
	})
}

// FuzzNodeBodies: drain, cancel-drain, isolate, retire, overcommit and the
// default overcommit.
func FuzzNodeBodies(f *testing.F) {
	addSeeds(f, 12,
		`{"confirm_host_cannot_write":true}`,
		`{"confirm_host_cannot_write":"true"}`,
		`{"cpu":"2","memory":"1.5"}`,
		`{"cpu":"default","memory":"default"}`,
		`{"cpu":"16.0001"}`,
		`{"cpu":"-1"}`,
		`{"cpu":"1e3"}`,
		`{"cpu":"99999999999999999999999"}`,
		`{"cpu":2}`,
		`{"memory":""}`,
		`{"cpu":"NaN","memory":"Inf"}`,
		`{"command_id":"oc-1","expected_version":1,"cpu":"2","memory":"2"}`,
		`{"command_id":"oc-1","cpu":"2"}`,
	)
	m := newFuzzMember(f)
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		node := "node-1"
		if which%12 >= 6 {
			node = "nope"
		}
		path := "/v1/overcommit/default"
		if op := which % 6; op < 5 {
			path = "/v1/nodes/" + node + "/" + []string{"drain", "cancel-drain", "isolate", "retire", "overcommit"}[op]
		}
		m.post(t, m.admin, path, body)
	})
}

// FuzzInternalBodies: the calls members make of ctrl with their member
// certificate (renewal, data-plane certificate, admission of a caller).
func FuzzInternalBodies(f *testing.F) {
	key, _ := trust.NewKey()
	pub := trust.PublicKeyPEM(&key.PublicKey)
	quoted, _ := json.Marshal(pub)
	addSeeds(f, 3,
		`{"admin_public_key":`+string(quoted)+`}`,
		`{"admin_public_key":"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"}`,
		`{"public_key":`+string(quoted)+`,"hosts":["127.0.0.1","node-1.example"]}`,
		`{"public_key":`+string(quoted)+`,"hosts":[`+strings.Repeat(`"h",`, 40)+`"h"]}`,
		`{"public_key":"","hosts":null}`,
		`{"kind":"admin","node_id":"node-1","admitted":"2026-01-01T00:00:00Z"}`,
		`{"kind":"member","node_id":"node-1","roles":["ctrl","node","root"],"admitted":"2026-01-01T00:00:00Z"}`,
		`{"kind":"dataplane","node_id":"nope","admitted":"not a time"}`,
	)
	m := newFuzzMember(f)
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		path := []string{"/v1/internal/certs/renew", "/v1/internal/certs/dataplane", "/v1/internal/admission"}[which%3]
		m.post(t, m.member, path, body)
	})
}

// FuzzEgressBodies: create, update and delete of Egress and Resolver
// objects (an existing and an unknown name).
func FuzzEgressBodies(f *testing.F) {
	addSeeds(f, 10,
		`{"name":"corp","socks5":"proxy.corp.example:1080","username":"u","password":"p"}`,
		`{"name":"corp","socks5":"[2001:db8::1]:1080"}`,
		`{"name":"none","socks5":"p:1"}`,
		`{"name":"corp","socks5":"p"}`,
		`{"name":"corp","socks5":"0.0.0.0:0","username":"`+strings.Repeat("u", 300)+`"}`,
		`{"name":"corp","socks5":"p:1","password":"only"}`,
		`{"name":"corp","socks5":"p:1","username":"a
b","password":"p"}`,
		`{"socks5":"other:1080"}`,
		`{"password":"rotated"}`,
		`{"clear_credentials":true}`,
		`{"clear_credentials":true,"username":"u"}`,
		`{"socks5":7}`,
		`{"name":"corp-dns","upstreams":["192.0.2.53","dns.corp.example:5353","[2001:db8::53]"]}`,
		`{"name":"corp-dns","upstreams":[]}`,
		`{"name":"corp-dns","upstreams":["10.0.0.300"]}`,
		`{"name":"corp-dns","upstreams":"192.0.2.53"}`,
		`{"name":"default","upstreams":["192.0.2.53"]}`,
		`{"name":"corp-dns","upstreams":[`+strings.Repeat(`"192.0.2.1",`, 20)+`"192.0.2.2"]}`,
	)
	m := newFuzzMember(f)
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		egress, resolver := "corp", "corp-dns"
		if which%10 >= 5 {
			egress, resolver = "Nope", "nope"
		}
		path := []string{"/v1/egress", "/v1/egress/" + egress + "/update", "/v1/egress/" + egress + "/delete",
			"/v1/resolvers", "/v1/resolvers/" + resolver + "/delete"}[which%5]
		m.post(t, m.admin, path, body)
	})
}

// FuzzEnrollmentBodies: issuing and revoking grants.
func FuzzEnrollmentBodies(f *testing.F) {
	addSeeds(f, 3,
		`{"node_id":"node-9","roles":["node"],"ttl":"30m"}`,
		`{"node_id":"node-9","roles":["ctrl","node"]}`,
		`{"node_id":"node-9","roles":["root"]}`,
		`{"node_id":"","roles":[]}`,
		`{"node_id":"node-9","ttl":"-5m"}`,
		`{"node_id":"node-9","ttl":"9999999999h"}`,
		`{"node_id":"node-9","ttl":30}`,
		`{"node_id":"node/../../x"}`,
		`{"node_id":"`+strings.Repeat("n", 70000)+`"}`,
		`{"node_id":"node-9","roles":"node"}`,
	)
	m := newFuzzMember(f)
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		path := "/v1/enrollment/grants"
		switch which % 3 {
		case 1:
			path += "/node-9/revoke"
		case 2:
			path += "/node-1/revoke"
		}
		m.post(t, m.admin, path, body)
	})
}

// FuzzJoinBody: the one unauthenticated endpoint. "$TOKEN" in a body is
// replaced by a fresh grant (for a node-only host, so a join that works
// never adds a voter the test cannot run), "$KEY" by a PEM public key
// (JSON-escaped).
func FuzzJoinBody(f *testing.F) {
	valid, _ := json.Marshal(api.JoinRequest{Token: "$TOKEN", Advertise: "127.0.0.1:1", MemberKey: "$KEY", AdminKey: "$KEY"})
	for _, b := range append([]string{
		string(valid),
		`{"token":"$TOKEN","advertise":"127.0.0.1:1"}`,
		`{"token":"$TOKEN","advertise":"no-port","member_public_key":"$KEY","admin_public_key":"$KEY"}`,
		`{"token":"$TOKEN","advertise":"127.0.0.1:1","member_public_key":"x","admin_public_key":"y"}`,
		`{"token":"$TOKEN","advertise":"127.0.0.1:1","member_public_key":"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n","admin_public_key":"$KEY"}`,
		`{"token":"not-a-token","advertise":"127.0.0.1:1"}`,
		`{"token":"kbg1.AAAA.BBBB","advertise":"127.0.0.1:1"}`,
		`{"token":"","advertise":""}`,
		`{"token":123}`,
	}, bodySeeds...) {
		f.Add(uint8(0), []byte(b))
	}
	m := newFuzzMember(f)
	joiners := 0 // a join that works admits its node id: each grant gets a new one
	grant := func(t *testing.T) string {
		joiners++
		var out api.GrantResponse
		c := api.NewClient(m.addr, m.adminTLS)
		if _, err := c.Do(context.Background(), "POST", "/v1/enrollment/grants", api.GrantRequest{NodeID: "joiner-" + strconv.Itoa(joiners), Roles: []string{api.RoleNode}}, &out); err != nil {
			t.Fatalf("grant: %v", err)
		}
		return out.Token
	}
	key, err := trust.NewKey()
	if err != nil {
		f.Fatal(err)
	}
	pemKey, _ := json.Marshal(trust.PublicKeyPEM(&key.PublicKey))
	pemKey = pemKey[1 : len(pemKey)-1] // the inside of a JSON string
	f.Fuzz(func(t *testing.T, _ uint8, body []byte) {
		body = bytes.ReplaceAll(body, []byte("$KEY"), pemKey)
		if bytes.Contains(body, []byte("$TOKEN")) {
			body = bytes.ReplaceAll(body, []byte("$TOKEN"), []byte(grant(t)))
		}
		m.post(t, m.anon, "/v1/join", body)
	})
}
