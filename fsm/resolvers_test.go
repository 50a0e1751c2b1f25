package fsm

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// resolver.create and resolver.delete

func TestResolverCreate(t *testing.T) {
	create := func(ups ...string) func(h *harness) Entry {
		return ent(OpResolverCreate, ResolverCreateArgs{Name: "corp-dns", Upstreams: ups})
	}
	wantUps := func(want ...string) func(t *testing.T, h *harness, r Result) {
		return func(t *testing.T, h *harness, r Result) {
			got := decode[api.Resolver](t, r)
			if !reflect.DeepEqual(got.Upstreams, want) || got.Version != 1 || got.Name != "corp-dns" || !got.CreatedAt.Equal(h.now) {
				t.Errorf("resolver %+v, want upstreams %q", got, want)
			}
			if stored := h.resolver("corp-dns"); !reflect.DeepEqual(*stored, got) {
				t.Errorf("stored %+v, result %+v", stored, got)
			}
		}
	}
	eight := make([]string, 9)
	for i := range eight {
		eight[i] = fmt.Sprintf("192.0.2.%d", i+1)
	}
	cases := []opCase{
		{name: "every form", setup: oneNode, entry: create("192.0.2.53", "192.0.2.54:5353", "2001:db8::53", "[2001:db8::54]", "[2001:db8::55]:5353", "DNS.corp.example", "dns2.corp.example:5353"),
			check: wantUps("192.0.2.53:53", "192.0.2.54:5353", "[2001:db8::53]:53", "[2001:db8::54]:53", "[2001:db8::55]:5353", "dns.corp.example:53", "dns2.corp.example:5353")},
		{name: "each once", setup: oneNode, entry: create("192.0.2.53", "192.0.2.53:53", "192.0.2.54"), check: wantUps("192.0.2.53:53", "192.0.2.54:53")},
		{name: "eight", setup: oneNode, entry: create(eight[:8]...)},
		{name: "nine", setup: oneNode, entry: create(eight...), code: api.CodeInvalidArgument, check: says("resolver corp-dns: 9 upstreams given: give 1-8")},
		{name: "none", setup: oneNode, entry: create(), code: api.CodeInvalidArgument, check: says("0 upstreams given")},
		{name: "bad address", setup: oneNode, entry: create("192.0.2.53", "10.0.0.300"), code: api.CodeInvalidArgument,
			check: says(`resolver corp-dns: upstream "10.0.0.300" has host "10.0.0.300", which is neither an IP address nor a DNS name`, "port 53 when none is given")},
		{name: "bad port", setup: oneNode, entry: create("192.0.2.53:0"), code: api.CodeInvalidArgument, check: says(`has port "0"`)},
		{name: "unspecified", setup: oneNode, entry: create("0.0.0.0"), code: api.CodeInvalidArgument, check: says("unspecified")},
		{name: "too long", setup: oneNode, entry: create(strings.Repeat("a", 1000)), code: api.CodeInvalidArgument, check: says("an upstream is 1000 bytes long")},
		{name: "exists", setup: func(h *harness) {
			oneNode(h)
			h.ok(OpResolverCreate, ResolverCreateArgs{Name: "corp-dns", Upstreams: []string{"192.0.2.53"}})
		}, entry: create("192.0.2.54"), code: api.CodeFailedPrecondition, check: says("resolver corp-dns already exists (upstreams 192.0.2.53:53)")},
		{name: "reserved name", setup: oneNode, entry: ent(OpResolverCreate, ResolverCreateArgs{Name: "default", Upstreams: []string{"192.0.2.53"}}), code: api.CodeInvalidArgument,
			check: says(`resolver name "default" is reserved`)},
		{name: "bad name", setup: oneNode, entry: ent(OpResolverCreate, ResolverCreateArgs{Name: "dns_1", Upstreams: []string{"192.0.2.53"}}), code: api.CodeInvalidArgument,
			check: says(`resolver name "dns_1" is not valid`)},
	}
	runCases(t, cases)
}

func TestResolverDelete(t *testing.T) {
	withDNS := func(h *harness) {
		oneNode(h)
		h.ok(OpResolverCreate, ResolverCreateArgs{Name: "corp-dns", Upstreams: []string{"192.0.2.53"}})
	}
	cases := []opCase{
		{name: "unused", setup: withDNS, entry: ent(OpResolverDelete, ObjectArgs{Name: "corp-dns"}), check: func(t *testing.T, h *harness, r Result) {
			h.f.View(func(tx *bolt.Tx) error {
				if _, err := GetResolver(tx, "corp-dns"); api.CodeOf(err) != api.CodeNotFound {
					t.Errorf("get after delete: %v", err)
				}
				return nil
			})
		}},
		{name: "used", setup: func(h *harness) {
			withDNS(h)
			h.create("c1", withNetwork(api.NetworkPolicy{Resolver: "corp-dns"}))
		}, entry: ent(OpResolverDelete, ObjectArgs{Name: "corp-dns"}), code: api.CodeFailedPrecondition,
			check: says("resolver corp-dns is used by workspaces " + WorkspaceIDFor("c1") + ": change their network policy first (kibo workspace set-network WS --resolver default")},
		{name: "another version expected", setup: withDNS, entry: ent(OpResolverDelete, ObjectArgs{Name: "corp-dns"}, withVersion(2)), code: api.CodeVersionMismatch},
		{name: "unknown", setup: oneNode, entry: ent(OpResolverDelete, ObjectArgs{Name: "corp-dns"}), code: api.CodeNotFound,
			check: says("resolver corp-dns does not exist: check the name with kibo resolver list")},
	}
	runCases(t, cases)
}
