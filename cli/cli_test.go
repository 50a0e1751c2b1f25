package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

var update = flag.Bool("update", false, "rewrite golden files")

type cliEnv struct {
	t       *testing.T
	c       *clustertest.Cluster
	dataDir string
}

// run runs the CLI in-process against the test cluster, as `kibo ARGS`.
func (e *cliEnv) run(args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	var out, errb bytes.Buffer
	full := append([]string{"--data-dir", e.dataDir}, args...)
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	code = Main(context.Background(), "kibo", full, devnull, &out, &errb)
	return out.String(), errb.String(), code
}

func (e *cliEnv) mustRun(args ...string) string {
	e.t.Helper()
	out, errs, code := e.run(args...)
	if code != 0 {
		e.t.Fatalf("kibo %s: exit %d: %s", strings.Join(args, " "), code, errs)
	}
	return out
}

func (e *cliEnv) expectExit(want int, msgPart string, args ...string) {
	e.t.Helper()
	_, errs, code := e.run(args...)
	if code != want {
		e.t.Fatalf("kibo %s: exit %d, want %d (stderr %q)", strings.Join(args, " "), code, want, errs)
	}
	if !strings.Contains(errs, msgPart) {
		e.t.Fatalf("kibo %s: stderr %q does not say %q", strings.Join(args, " "), errs, msgPart)
	}
	if strings.Count(strings.TrimSpace(errs), "\n") > 0 && want != api.ExitUsage {
		e.t.Fatalf("kibo %s: error is not one line: %q", strings.Join(args, " "), errs)
	}
}

var normalizers = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "<TIME>"},
	{regexp.MustCompile(`sess-[0-9a-f]+`), "<SESSION>"},
	{regexp.MustCompile(`[+-]\d+\.\dm?s\b`), "<SKEW>"},
	{regexp.MustCompile(`\d+\.\d%`), "<PCT>"},
	{regexp.MustCompile(`\b\d+\.\d(B|KiB|MiB|GiB|TiB) (free )?of \d+\.\d(B|KiB|MiB|GiB|TiB)`), "<USAGE>"},
	{regexp.MustCompile(`revision ([0-9a-f]{7,}|unknown)(\+dirty)?(\.[0-9a-f]{12})?`), "revision <REV>"},
	{regexp.MustCompile(`127\.0\.0\.1:\d+`), "<ADDR>"},
	{regexp.MustCompile(`uncertainty \S+,`), "uncertainty <U>,"},
	{regexp.MustCompile(`(Registration|Report) version:\s+\d+`), "$1 version: <N>"},
	{regexp.MustCompile(`(?m)^(node-\S+ .*) \d+$`), "$1 <REG_VERSION>"},
	{regexp.MustCompile(`Kernel time sync:\s+\w+`), "Kernel time sync: <SYNC>"},
	{regexp.MustCompile(`Source revision:\s+\S+`), "Source revision: <REV>"},
	{regexp.MustCompile(` +`), " "},
}

// normalize hides values that change from run to run (times, skews,
// session ids, host usage) and collapses column padding.
func normalize(s string) string {
	for _, n := range normalizers {
		s = n.re.ReplaceAllString(s, n.with)
	}
	return s
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden %s: %v (run go test ./cli -update to create it)", path, err)
	}
	if string(want) != got {
		t.Fatalf("output differs from %s:\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}

// jsonShape lists every key path of a JSON document with its value type,
// so the golden file pins field names without pinning values.
func jsonShape(t *testing.T, raw string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, raw)
	}
	set := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, vv := range x {
				walk(prefix+"."+k, vv)
			}
		case []any:
			for _, vv := range x {
				walk(prefix+"[]", vv)
			}
			if len(x) == 0 {
				set[prefix+"[] (empty)"] = true
			}
		case string:
			set[prefix+" string"] = true
		case float64:
			set[prefix+" number"] = true
		case bool:
			set[prefix+" bool"] = true
		case nil:
			set[prefix+" null"] = true
		}
	}
	walk("", v)
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, "\n") + "\n"
}

func newCLIEnv(t *testing.T, o clustertest.Options) *cliEnv {
	// The per-user credentials of whoever runs the tests must not count.
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("KIBOTOS_CREDENTIALS", "")
	c := clustertest.New(t, o)
	return &cliEnv{t: t, c: c, dataDir: string(c.Members[0].Dir)}
}

func TestNodeListAndGetShapes(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 1})
	// The host usage sampler needs two samples for CPU idle; wait for the
	// report that carries them so the shape is complete.
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		e.c.Members[1].Agent.PushReport()
		n, err := e.c.Node(e.c.Members[0], "node-2")
		return err == nil && n.HostUsage != nil && n.HostUsage.CPUIdle != nil && n.Session != nil && n.Session.Clock != nil && n.Overcommit.Acknowledged, "no host usage yet"
	})
	for _, m := range e.c.Members {
		m.Agent.PushReport() // the same shape for every row
	}
	golden(t, "node_list", normalize(e.mustRun("node", "list", "--consistent")))
	golden(t, "node_list_wide", normalize(e.mustRun("node", "list", "--wide", "--consistent")))
	golden(t, "node_list_json", jsonShape(t, e.mustRun("node", "list", "--json", "--consistent")))
	golden(t, "node_get", normalize(e.mustRun("node", "get", "node-2", "--consistent")))
	golden(t, "node_get_wide", normalize(e.mustRun("node", "get", "node-2", "--wide", "--consistent")))
	golden(t, "overcommit_get", normalize(e.mustRun("node", "overcommit", "get", "--consistent")))
	// Host usage is a node's get's, not the list's (the product shows it
	// only in get); the list's MEM_TIGHT reads memory_tight instead.
	var list struct {
		Result struct{ Nodes []map[string]any } `json:"result"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("node", "list", "--json", "--consistent")), &list); err != nil {
		t.Fatal(err)
	}
	for _, n := range list.Result.Nodes {
		if _, ok := n["host_usage"]; ok || n["memory_tight"] != false {
			t.Errorf("node list --json: %s: host_usage %v, memory_tight %v; want none and false", n["node_id"], n["host_usage"], n["memory_tight"])
		}
	}
	var get struct {
		Result api.Node `json:"result"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("node", "get", "node-2", "--json", "--consistent")), &get); err != nil || get.Result.HostUsage == nil {
		t.Errorf("node get --json: no host_usage (%v)", err)
	}

	// Paging is done by the server: one node per page, token to the next.
	out, errs, code := e.run("node", "list", "--page-size", "1", "--consistent")
	if code != 0 || !strings.Contains(out, "node-1") || strings.Contains(out, "node-2") || !strings.Contains(errs, "--page-token node-1") {
		t.Fatalf("page 1: exit %d out %q err %q", code, out, errs)
	}
	out = e.mustRun("node", "list", "--page-size", "1", "--page-token", "node-1", "--consistent")
	if !strings.Contains(out, "node-2") || strings.Contains(out, "node-1") {
		t.Fatalf("page 2: %q", out)
	}
}

// regVersion reads registration_version through the CLI's JSON.
func (e *cliEnv) regVersion(node string) uint64 {
	e.t.Helper()
	var body struct {
		Result api.Node `json:"result"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("node", "get", node, "--json", "--consistent")), &body); err != nil {
		e.t.Fatal(err)
	}
	return body.Result.RegistrationVersion
}

func TestExitCodesAndBadInputChangesNothing(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 1})
	v := e.regVersion("node-2")
	vs := func(n uint64) string { return strconv.FormatUint(n, 10) }

	e.expectExit(api.ExitNotFound, "node nope is not registered", "node", "get", "nope")
	e.expectExit(api.ExitNotFound, "node nope is not registered", "node", "drain", "nope")
	e.expectExit(api.ExitInvalidArgument, `"16.0001" has more than three decimal places`, "node", "overcommit", "set", "node-2", "--cpu", "16.0001")
	e.expectExit(api.ExitInvalidArgument, "out of range", "node", "overcommit", "set-default", "--memory", "16.5")
	e.expectExit(api.ExitInvalidArgument, "--command-id needs --expected-version", "node", "overcommit", "set", "node-2", "--cpu", "2", "--command-id", "oc-1")
	e.expectExit(api.ExitInvalidArgument, "--command-id needs --expected-version", "node", "retire", "node-2", "--yes", "--command-id", "r-1")
	e.expectExit(api.ExitUsage, "--confirm-host-cannot-write", "node", "isolate", "node-2")
	e.expectExit(api.ExitFailedPrecondition, "still has a live control session", "node", "isolate", "node-2", "--confirm-host-cannot-write")
	e.expectExit(api.ExitVersionMismatch, "not the expected", "node", "drain", "node-2", "--expected-version", vs(v+7))
	e.expectExit(api.ExitFailedPrecondition, "retire accepts only a DRAINED node", "node", "retire", "node-2", "--yes")
	e.expectExit(api.ExitUsage, "needs confirmation", "node", "retire", "node-2")
	e.expectExit(api.ExitUsage, "unknown flag", "node", "list", "--bogus")
	if got := e.regVersion("node-2"); got != v {
		t.Fatalf("refused writes changed registration_version %d → %d", v, got)
	}

	// Same --command-id and inputs: the first result, exit 0; other inputs: 13.
	e.mustRun("node", "drain", "node-2", "--command-id", "drain-2", "--expected-version", vs(v))
	after := e.regVersion("node-2")
	e.mustRun("node", "drain", "node-2", "--command-id", "drain-2", "--expected-version", vs(v))
	if got := e.regVersion("node-2"); got != after {
		t.Fatalf("replay changed registration_version %d → %d", after, got)
	}
	e.expectExit(api.ExitFailedPrecondition, "already used", "node", "drain", "node-2", "--command-id", "drain-2", "--expected-version", vs(after))
	e.mustRun("node", "cancel-drain", "node-2")

	// overcommit: only the given item changes; default clears it.
	out := e.mustRun("node", "overcommit", "set", "node-2", "--cpu", "2.5", "--memory", "0.9")
	if !strings.Contains(out, "cpu 2.5 (node), memory 0.9 (node)") {
		t.Fatalf("set: %q", out)
	}
	out = e.mustRun("node", "overcommit", "set", "node-2", "--cpu", "default")
	if !strings.Contains(out, "cpu 1 (default), memory 0.9 (node)") {
		t.Fatalf("set default: %q", out)
	}
	out = e.mustRun("node", "overcommit", "set-default", "--cpu", "4")
	if !strings.Contains(out, "cpu 4, memory 1 (version 2)") {
		t.Fatalf("set-default: %q", out)
	}
}

func TestDrainWait(t *testing.T) {
	var held atomic.Int64
	held.Store(1)
	o := clustertest.Options{Ctrl: 1, NodeOnly: 1, AdjustReport: func(id string, r *api.Report) {
		if id == "node-2" {
			r.Instances = int(held.Load())
		}
	}}
	e := newCLIEnv(t, o)
	node := e.c.Members[1]
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		n, err := e.c.Node(e.c.Members[0], "node-2")
		return err == nil && n.Report != nil && n.Report.Instances == 1, "report without the held Instance"
	})

	// Timeout: exit 16, drain stays requested and is not submitted again.
	start := time.Now()
	e.expectExit(api.ExitTimedOut, "still DRAINING", "node", "drain", "node-2", "--wait", "--timeout", "600ms", "--interval", "100ms")
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("--timeout 600ms took %s", d)
	}
	v := e.regVersion("node-2")
	if !strings.Contains(e.mustRun("node", "get", "node-2", "--json", "--consistent"), `"drain_requested": true`) {
		t.Fatal("drain_requested is not true after a timed-out wait")
	}

	// Cancelled while waiting: exit 13, and the drain stays cancelled. A
	// wait that submitted the drain again as it polled would undo the
	// cancel: it would not end, or leave drain_requested true.
	done := make(chan int, 1)
	go func() {
		_, _, code := e.run("node", "drain", "node-2", "--wait", "--timeout", "30s", "--interval", "50ms")
		done <- code
	}()
	clustertest.WaitFor(t, 5*time.Second, func() (bool, string) { return e.regVersion("node-2") > v, "second drain not applied" })
	e.mustRun("node", "cancel-drain", "node-2")
	if code := <-done; code != api.ExitFailedPrecondition {
		t.Fatalf("wait cancelled by cancel-drain: exit %d, want 13", code)
	}
	if !strings.Contains(e.mustRun("node", "get", "node-2", "--json", "--consistent"), `"drain_requested": false`) {
		t.Fatal("drain_requested is true after the cancelled wait: the wait submitted the drain again")
	}

	// Emptied while waiting: DRAINED, exit 0.
	go func() {
		_, _, code := e.run("node", "drain", "node-2", "--wait", "--timeout", "30s", "--interval", "50ms")
		done <- code
	}()
	held.Store(0)
	clustertest.WaitFor(t, 5*time.Second, func() (bool, string) { return node.Agent.PushReport(), "no session to push the report" })
	if code := <-done; code != 0 {
		t.Fatalf("wait until empty: exit %d, want 0", code)
	}
	out := e.mustRun("node", "get", "node-2", "--consistent")
	if !strings.Contains(out, "Status: DRAINED") && !strings.Contains(normalize(out), "Status: DRAINED") {
		t.Fatalf("node get after drain: %s", out)
	}

	// A DRAINED node can be retired; a retired node refuses drain and grants.
	e.mustRun("node", "retire", "node-2", "--yes")
	e.expectExit(api.ExitFailedPrecondition, "retired", "node", "drain", "node-2")
	e.expectExit(api.ExitFailedPrecondition, "retired", "enrollment", "grant", "node-2")
}

// A node revoked while a drain waits for it ends the wait: exit 13,
// saying so.
func TestDrainWaitRevoked(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, AdjustReport: func(id string, r *api.Report) {
		if id == "node-2" {
			r.Instances = 1 // never empties
		}
	}})
	type result struct {
		errs string
		code int
	}
	done := make(chan result, 1)
	go func() {
		_, errs, code := e.run("node", "drain", "node-2", "--wait", "--timeout", "30s", "--interval", "50ms")
		done <- result{errs, code}
	}()
	clustertest.WaitFor(t, 5*time.Second, func() (bool, string) {
		n, err := e.c.Node(e.c.Members[0], "node-2")
		return err == nil && n.DrainRequested, "drain not applied"
	})
	e.mustRun("enrollment", "revoke", "node-2")
	r := <-done
	if r.code != api.ExitFailedPrecondition || !strings.Contains(r.errs, "node node-2 was REVOKED while waiting for DRAINED") {
		t.Fatalf("wait for a node revoked meanwhile: exit %d, %q; want 13 saying it was revoked", r.code, r.errs)
	}
}

// A node whose clock is off by more than 30 s (beyond the uncertainty) is
// marked (over); the skew is node minus ctrl.
func TestClockOver(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, ClockSkew: map[string]time.Duration{"node-2": 45 * time.Second}})
	out := e.mustRun("node", "list", "--consistent")
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "node-2 ") {
			line = l
		}
	}
	if !regexp.MustCompile(`\+4[45]\.\ds \(over\)`).MatchString(line) {
		t.Fatalf("node-2 row has no +45s (over) clock: %q", line)
	}
	if got := e.mustRun("node", "get", "node-2", "--consistent"); !strings.Contains(got, "(over)") {
		t.Fatalf("node get does not mark the skew over: %s", got)
	}
	if strings.Contains(strings.Split(out, "\n")[1], "(over)") {
		t.Fatalf("node-1 marked over: %q", out)
	}
}

// A node whose clock is over 30 s off takes no Workspace: --node to it is
// refused, the others go elsewhere; once a later measurement is back
// within 30 s it takes them again.
func TestClockOverKeepsPlacementAway(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, SyncInterval: time.Second, Capacity: api.Resources{CPU: 8000, MemoryBytes: 8 << 30},
		ClockSkew:    map[string]time.Duration{"node-2": 45 * time.Second},
		AdjustReport: func(_ string, r *api.Report) { r.Templates = append(r.Templates, "kibotos-coding") },
		HoldTask:     func(string, api.WorkspaceTask) bool { return true }})
	create := []string{"workspace", "create", "--template", "kibotos-coding", "--cpu", "1", "--memory", "256MiB", "--no-wait", "-q"}
	e.expectExit(api.ExitFailedPrecondition, "node node-2 cannot take this Workspace: clock skew over 30s", append(create, "--node", "node-2")...)
	for range 3 {
		id := strings.TrimSpace(e.mustRun(create...))
		if n := e.wsJSON(id).NodeID; n != "node-1" {
			t.Fatalf("workspace %s placed on %s while node-2's clock is over", id, n)
		}
	}
	e.c.Members[1].Agent.SetClockSkew(0)
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		n, err := e.c.Node(e.c.Members[0], "node-2")
		return err == nil && n.Session != nil && n.Session.Clock != nil && !n.Session.Clock.Over, "node-2's clock still over"
	})
	id := strings.TrimSpace(e.mustRun(append(create, "--node", "node-2")...))
	if n := e.wsJSON(id).NodeID; n != "node-2" {
		t.Fatalf("workspace %s placed on %s once node-2's clock was back", id, n)
	}
}
