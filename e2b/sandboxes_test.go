package e2b

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
)

func ptr[T any](v T) *T { return &v }

// A create's body as the Workspace it asks for: E2B's defaults (300 s,
// killed at the end, internet on), autoPause and its memory, autoResume,
// and the network lists; what is not served is refused, saying so.
func TestCreateRequest(t *testing.T) {
	h := &handler{c: Config{BaseTemplate: "kibotos-base"}}
	for _, c := range []struct {
		name string
		in   newSandbox
		want api.WorkspaceCreateRequest
		err  string
	}{
		{name: "defaults", in: newSandbox{},
			want: api.WorkspaceCreateRequest{Template: "kibotos-base", Timeout: "300s", OnTimeout: api.TimeoutDelete, Network: &api.NetworkPolicy{Egress: api.EgressPublic}}},
		{name: "a template, paused at the end, resumed on traffic, metadata", in: newSandbox{TemplateID: "kibotos-coding", Timeout: ptr[int64](60), AutoPause: ptr(true), AutoResume: &autoResume{Enabled: true}, Metadata: map[string]string{"a": "b"}},
			want: api.WorkspaceCreateRequest{Template: "kibotos-coding", Timeout: "60s", OnTimeout: api.TimeoutPause, AutoResume: true, Labels: map[string]string{"a": "b", CreatorLabel: "keyid", TrafficLabel: TrafficPublic}, Network: &api.NetworkPolicy{Egress: api.EgressPublic}}},
		{name: "paused without memory: stopped", in: newSandbox{AutoPause: ptr(true), AutoPauseMemory: ptr(false)},
			want: api.WorkspaceCreateRequest{Template: "kibotos-base", Timeout: "300s", OnTimeout: api.TimeoutStop, Network: &api.NetworkPolicy{Egress: api.EgressPublic}}},
		{name: "no internet", in: newSandbox{AllowInternetAccess: ptr(false)},
			want: api.WorkspaceCreateRequest{Template: "kibotos-base", Timeout: "300s", OnTimeout: api.TimeoutDelete, Network: &api.NetworkPolicy{Egress: api.EgressNone}}},
		{name: "no internet but what is allowed", in: newSandbox{AllowInternetAccess: ptr(false), Network: &sandboxNetwork{AllowOut: []string{"1.2.3.4", "pypi.org"}, DenyOut: []string{"2001:db8::1"}}},
			want: api.WorkspaceCreateRequest{Template: "kibotos-base", Timeout: "300s", OnTimeout: api.TimeoutDelete,
				Network: &api.NetworkPolicy{Egress: api.EgressPublic, Allow: []string{"1.2.3.4/32", "pypi.org"}}}},
		{name: "only what is allowed: everything else denied", in: newSandbox{Network: &sandboxNetwork{AllowOut: []string{"pypi.org"}, DenyOut: []string{"0.0.0.0/0"}}},
			want: api.WorkspaceCreateRequest{Template: "kibotos-base", Timeout: "300s", OnTimeout: api.TimeoutDelete, Network: &api.NetworkPolicy{Egress: api.EgressPublic, Allow: []string{"pypi.org"}}}},
		{name: "everything denied, nothing allowed", in: newSandbox{Network: &sandboxNetwork{DenyOut: []string{"0.0.0.0/0"}}},
			want: api.WorkspaceCreateRequest{Template: "kibotos-base", Timeout: "300s", OnTimeout: api.TimeoutDelete, Network: &api.NetworkPolicy{Egress: api.EgressNone}}},
		{name: "the internet but what is denied", in: newSandbox{Network: &sandboxNetwork{DenyOut: []string{"10.0.0.0/8"}}},
			want: api.WorkspaceCreateRequest{Template: "kibotos-base", Timeout: "300s", OnTimeout: api.TimeoutDelete, Network: &api.NetworkPolicy{Egress: api.EgressPublic, Deny: []string{"10.0.0.0/8"}}}},
		{name: "the internet and an allow list: all of it", in: newSandbox{Network: &sandboxNetwork{AllowOut: []string{"1.2.3.4"}, DenyOut: []string{"10.0.0.0/8"}}},
			want: api.WorkspaceCreateRequest{Template: "kibotos-base", Timeout: "300s", OnTimeout: api.TimeoutDelete, Network: &api.NetworkPolicy{Egress: api.EgressPublic, Deny: []string{"10.0.0.0/8"}}}},
		{name: "an exception to a denied range", in: newSandbox{Network: &sandboxNetwork{AllowOut: []string{"10.1.2.3"}, DenyOut: []string{"10.0.0.0/8"}}}, err: "allowOut 10.1.2.3/32 lies in denyOut 10.0.0.0/8"},
		{name: "envVars, sorted by name", in: newSandbox{EnvVars: map[string]string{"B": "2", "A": "1=x"}},
			want: api.WorkspaceCreateRequest{Template: "kibotos-base", Timeout: "300s", OnTimeout: api.TimeoutDelete, Network: &api.NetworkPolicy{Egress: api.EgressPublic}, Env: []string{"A=1=x", "B=2"}}},
		{name: "no public traffic", in: newSandbox{Network: &sandboxNetwork{AllowPublicTraffic: ptr(false)}},
			want: api.WorkspaceCreateRequest{Template: "kibotos-base", Timeout: "300s", OnTimeout: api.TimeoutDelete, Labels: map[string]string{CreatorLabel: "keyid", TrafficLabel: TrafficToken}, Network: &api.NetworkPolicy{Egress: api.EgressPublic}}},
		{name: "Kibotos's own metadata", in: newSandbox{Metadata: map[string]string{"e2b/creator": "other"}}, err: "keys beginning e2b/ are Kibotos's own"},
		{name: "volumeMounts", in: newSandbox{VolumeMounts: []any{map[string]string{"name": "v"}}}, err: "volumeMounts are not served"},
		{name: "iam", in: newSandbox{IAM: map[string]any{"tokens": map[string]any{}}}, err: "iam (workload identity tokens) is not served"},
		{name: "an egress proxy", in: newSandbox{Network: &sandboxNetwork{EgressProxy: map[string]string{"address": "p:1080"}}}, err: "network.egressProxy is not served"},
		{name: "https ports", in: newSandbox{Network: &sandboxNetwork{HTTPSPorts: []int{8443}}}, err: "network.httpsPorts is not served"},
		{name: "autoResume without autoPause", in: newSandbox{AutoResume: &autoResume{Enabled: true}}, err: "autoResume needs autoPause"},
		{name: "a timeout of 0", in: newSandbox{Timeout: ptr[int64](0)}, err: "timeout 0 s"},
		{name: "an empty destination", in: newSandbox{Network: &sandboxNetwork{AllowOut: []string{" "}}}, err: "network.allowOut has an empty destination"},
	} {
		got, err := h.createRequest(&c.in, "keyid")
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || api.CodeOf(err) != api.CodeInvalidArgument {
				t.Errorf("%s: %v, want invalid_argument with %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		c.want.CPU, c.want.MemoryBytes = sandboxCPU, sandboxMemory
		if c.want.Labels == nil {
			c.want.Labels = map[string]string{CreatorLabel: "keyid", TrafficLabel: TrafficPublic} // E2B's default: public traffic as the creator
		}
		if got.Template != c.want.Template || got.Timeout != c.want.Timeout || got.OnTimeout != c.want.OnTimeout || got.AutoResume != c.want.AutoResume ||
			got.CPU != c.want.CPU || got.MemoryBytes != c.want.MemoryBytes || !maps.Equal(got.Labels, c.want.Labels) || !slices.Equal(got.Env, c.want.Env) ||
			got.Network.Egress != c.want.Network.Egress || !slices.Equal(got.Network.Allow, c.want.Network.Allow) || !slices.Equal(got.Network.Deny, c.want.Network.Deny) {
			t.Errorf("%s: %+v (network %+v), want %+v (network %+v)", c.name, got, got.Network, c.want, c.want.Network)
		}
	}
}

// Every Workspace state is a sandbox state or none.
func TestSandboxStates(t *testing.T) {
	for state, want := range map[string]string{api.WorkspaceCreating: "running", api.WorkspaceStarting: "running", api.WorkspaceAvailable: "running",
		api.WorkspacePausing: "running", api.WorkspaceStopping: "running", api.WorkspacePaused: "paused", api.WorkspaceStopped: "paused",
		api.WorkspaceFailed: "", api.WorkspaceDeleting: ""} {
		got, ok := e2bState(state)
		if got != want || ok != (want != "") {
			t.Errorf("%s: %q %v, want %q", state, got, ok, want)
		}
	}
}

// A sandbox's port is named by the host <port>-<sandboxID>.<domain>, with
// or without the listener's port, whatever the case; other hosts are the
// APIs'.
func TestHostTarget(t *testing.T) {
	for _, c := range []struct {
		host, domain, id string
		port             int
	}{
		{"8000-abc123.e2b.example.com", "e2b.example.com", "abc123", 8000},
		{"8000-ABC123.E2B.example.com", "e2b.example.com", "abc123", 8000},
		{"3000-abc.e2b.localhost:7444", "e2b.localhost:7444", "abc", 3000},
		{"3000-abc.e2b.localhost:7444", "e2b.localhost", "abc", 3000},
		{"49983-abc.e2b.localhost", "e2b.localhost", "abc", 49983},
		{"e2b.example.com", "e2b.example.com", "", 0},
		{"127.0.0.1:7444", "e2b.localhost:7444", "", 0},
		{"x-abc.e2b.example.com", "e2b.example.com", "", 0},
		{"0-abc.e2b.example.com", "e2b.example.com", "", 0},
		{"70000-abc.e2b.example.com", "e2b.example.com", "", 0},
		{"80-a.b.e2b.example.com", "e2b.example.com", "", 0},
		{"8000-abc.e2b.example.com.evil.org", "e2b.example.com", "", 0},
		{"8000-abc.e2b.example.com", "", "", 0},
	} {
		id, port, ok := hostTarget(c.host, c.domain)
		if id != c.id || port != c.port || ok != (c.id != "") {
			t.Errorf("%s under %q: %q %d %v, want %q %d", c.host, c.domain, id, port, ok, c.id, c.port)
		}
	}
}

// A metrics sample from the guest's counters: CPU busy over the two
// readings, memory total less available, the root's blocks.
func TestParseMetrics(t *testing.T) {
	m, err := parseMetrics("2\n100 1000\n150 1200\n1000000 250000\n4096 1000 400\n")
	if err != nil || m.CPUCount != 2 || m.CPUUsedPct != 25 || m.MemTotal != 1000000<<10 || m.MemUsed != 750000<<10 || m.DiskTotal != 4096*1000 || m.DiskUsed != 4096*600 {
		t.Fatalf("%+v, %v", m, err)
	}
	for _, bad := range []string{"", "2 100 1000", "2 100 1000 150 1200 1 1 4096 1 x", "2 100 1000 150 1200 1 1 4096 1 -1"} {
		if _, err := parseMetrics(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
