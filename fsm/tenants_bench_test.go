package fsm

import (
	"fmt"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// What namespaces, keys and quotas cost the FSM, each against the same
// work without them in the same run (bench/README.md):
//
//	go test ./fsm -run X -bench 'Tenant' -benchtime 3x

// BenchmarkTenantCreates is BenchmarkPlaceWorkspaces' 10,000 creates on
// 1,000 nodes, once by an operator in default (the reference: the path
// of the build before namespaces) and once by API keys of 100 namespaces
// with quotas: each entry looks its key up, checks the role and the
// namespace and the quota, and keeps the namespace's usage and index.
func BenchmarkTenantCreates(b *testing.B) {
	const nodes, workspaces, batch, namespaces = 1000, 10_000, 64, 100
	for _, keyed := range []bool{false, true} {
		name := "operator"
		if keyed {
			name = "keys-100-namespaces"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				h, _ := placementCluster(b, nodes)
				if keyed {
					tenantSetup(b, h, namespaces)
				}
				b.StartTimer()
				var es []Entry
				for i := range workspaces {
					a := WorkspaceCreateArgs{Template: "kibotos-base", CPU: 1000, MemoryBytes: 1 << 30}
					var opts []entryOpt
					if keyed {
						opts = append(opts, withActor(KeyActor(tenantName(i%namespaces), "app")))
					}
					e := h.entry(OpWorkspaceCreate, a, opts...)
					e.CommandID = fmt.Sprintf("create-%d", i)
					es = append(es, e)
					if len(es) == batch {
						applyAll(b, h, es)
						es = es[:0]
					}
				}
				applyAll(b, h, es)
			}
			b.ReportMetric(float64(b.N*workspaces)/b.Elapsed().Seconds(), "workspaces/s")
		})
	}
}

func tenantName(i int) string { return fmt.Sprintf("tenant-%03d", i) }

// tenantSetup makes n namespaces, each with a sandbox key "app" and a
// quota that 10,000 creates do not reach (so every check runs in full).
func tenantSetup(b *testing.B, h *harness, n int) {
	b.Helper()
	big := uint64(1 << 50)
	var es []Entry
	for i := range n {
		ns := tenantName(i)
		es = append(es,
			h.entry(OpNamespaceCreate, NamespaceArgs{Name: ns}),
			h.entry(OpNamespaceQuota, NamespaceQuotaArgs{Name: ns, Set: api.NamespaceQuota{RunningWorkspaces: &big, CPU: &big, MemoryBytes: &big}}),
			h.entry(OpAPIKeyCreate, APIKeyCreateArgs{Namespace: ns, Name: "app", Role: api.KeyRoleSandbox, KeyID: fmt.Sprintf("%016s", strings.Repeat("k", 13)+fmt.Sprintf("%c%c%c", 'a'+i/26/26%26, 'a'+i/26%26, 'a'+i%26)), SecretHash: strings.Repeat("ab", 32)}))
	}
	applyAll(b, h, es)
}

// BenchmarkTenantList lists 10,000 Workspaces (100 namespaces of 100):
// every one as an operator (the reference) against one namespace's 100
// as its key sees them, and every one filtered to a namespace (the
// filter's own cost).
func BenchmarkTenantList(b *testing.B) {
	const nodes, workspaces, namespaces = 1000, 10_000, 100
	h, _ := placementCluster(b, nodes)
	tenantSetup(b, h, namespaces)
	var es []Entry
	for i := range workspaces {
		e := h.entry(OpWorkspaceCreate, WorkspaceCreateArgs{Namespace: tenantName(i % namespaces), Template: "kibotos-base", CPU: 1000, MemoryBytes: 1 << 30})
		e.CommandID = fmt.Sprintf("create-%d", i)
		es = append(es, e)
		if len(es) == 64 {
			applyAll(b, h, es)
			es = es[:0]
		}
	}
	applyAll(b, h, es)
	one := tenantName(7)
	for _, c := range []struct {
		name string
		f    WorkspaceFilter
		want int
	}{{"all", WorkspaceFilter{All: true}, workspaces}, {"one-namespace", WorkspaceFilter{All: true, Namespace: &one}, workspaces / namespaces}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				var l *api.WorkspaceList
				if err := h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListWorkspaces(tx, c.f, 0, ""); return }); err != nil {
					b.Fatal(err)
				}
				if len(l.Workspaces) != c.want {
					b.Fatalf("listed %d, want %d", len(l.Workspaces), c.want)
				}
			}
		})
	}
}
