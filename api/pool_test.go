package api

import "testing"

// IsDefaultPoolOf agrees with DefaultPoolOf: the private pool for no
// report, an empty or legacy default, else the configured id.
func TestIsDefaultPoolOf(t *testing.T) {
	ids := []string{"node-a:default", "node-b:default", "node-a:defaul", "xnode-a:default", "fast", "default", "", "node-a"}
	for _, r := range []*Report{nil, {}, {DefaultPool: LegacyPrivatePool}, {DefaultPool: "fast"}, {DefaultPool: "node-b:default"}} {
		for _, id := range ids {
			if got, want := IsDefaultPoolOf(id, "node-a", r), id == DefaultPoolOf("node-a", r); got != want {
				t.Errorf("IsDefaultPoolOf(%q, node-a, %+v) = %v, want %v", id, r, got, want)
			}
		}
	}
}
