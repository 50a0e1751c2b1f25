package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

func TestRuntimePolicy(t *testing.T) {
	pfx := netip.MustParsePrefix
	for _, c := range []struct {
		name string
		in   api.NetworkPolicy
		eg   *api.TaskEgress
		res  *api.TaskResolver
		want runtime.NetworkPolicy
		err  string
	}{
		{name: "empty is none", in: api.NetworkPolicy{}, want: runtime.NetworkPolicy{Egress: "none"}},
		{name: "none", in: api.NetworkPolicy{Egress: "none"}, want: runtime.NetworkPolicy{Egress: "none"}},
		{name: "public with lists", in: api.NetworkPolicy{Egress: "public", Allow: []string{"10.0.0.0/8", "2001:db8::/32"}, Deny: []string{"10.9.0.0/16"}},
			want: runtime.NetworkPolicy{Egress: "public", Allow: []netip.Prefix{pfx("10.0.0.0/8"), pfx("2001:db8::/32")}, Deny: []netip.Prefix{pfx("10.9.0.0/16")}}},
		{name: "egress object", in: api.NetworkPolicy{Egress: "corp"}, eg: &api.TaskEgress{Name: "corp", Revision: 2, SOCKS5: "10.0.0.9:1080", Credentials: true},
			want: runtime.NetworkPolicy{Egress: "proxy", Proxy: &runtime.EgressProxy{Name: "corp", Revision: 2, SOCKS5: "10.0.0.9:1080", Credentials: true}}},
		{name: "egress object not carried", in: api.NetworkPolicy{Egress: "corp"}, err: "egress corp: the task does not carry it"},
		{name: "egress object of another name", in: api.NetworkPolicy{Egress: "corp"}, eg: &api.TaskEgress{Name: "other", Revision: 1, SOCKS5: "h:1"}, err: "egress corp: the task does not carry it"},
		{name: "resolver object", in: api.NetworkPolicy{Egress: "none", Resolver: "corp-dns"}, res: &api.TaskResolver{Name: "corp-dns", Upstreams: []string{"10.0.0.53:53"}},
			want: runtime.NetworkPolicy{Egress: "none", Resolver: &runtime.ResolverRoute{Name: "corp-dns", Upstreams: []string{"10.0.0.53:53"}}}},
		{name: "resolver object not carried", in: api.NetworkPolicy{Egress: "none", Resolver: "corp-dns"}, err: "resolver corp-dns: the task does not carry it"},
		{name: "domain rules beside CIDRs", in: api.NetworkPolicy{Egress: "public", Allow: []string{"*.example.com", "10.0.0.0/8", "pypi.org"}, Deny: []string{"evil.example.com"}},
			want: runtime.NetworkPolicy{Egress: "public", Allow: []netip.Prefix{pfx("10.0.0.0/8")}, AllowNames: []string{"*.example.com", "pypi.org"}, DenyNames: []string{"evil.example.com"}}},
		{name: "bad rule", in: api.NetworkPolicy{Egress: "public", Deny: []string{"10.0.0.1"}}, err: `deny rule "10.0.0.1" is neither a CIDR nor a domain`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := runtimePolicy(c.in, c.eg, c.res)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v %v, want %+v", got, err, c.want)
			}
		})
	}
}

// A network command is answered like any other: on a node that runs no
// VMs it fails and says why, and a command without a policy is refused
// rather than applied as something else.
func TestExecuteNetworkCommand(t *testing.T) {
	a := &Agent{cfg: Config{NodeID: "node-x"}, log: slog.Default()}
	task := api.WorkspaceTask{WorkspaceID: "ws-1", Command: api.WorkspaceCommand{Kind: api.WSCmdNetwork, CommandID: "ws-1/4", NodeID: "node-x", InstanceID: "inst-1",
		Network: &api.NetworkPolicy{Egress: "public"}}}
	r := a.execute(context.Background(), task)
	if r.Outcome != fsm.OutcomeFailed || r.CommandID != "ws-1/4" || r.WorkspaceID != "ws-1" || !strings.Contains(r.Error, "node node-x runs no VMs") {
		t.Fatalf("result %+v", r)
	}
	a.cfg.Runtime = &runtime.Runtime{} // never reached: the policy is checked first
	task.Command.Network = nil
	if r := a.execute(context.Background(), task); r.Outcome != fsm.OutcomeFailed || !strings.Contains(r.Error, "carries no policy") {
		t.Fatalf("without a policy: %+v", r)
	}
	task.Network = &api.NetworkPolicy{Egress: "none", Resolver: "corp-dns"}
	if r := a.execute(context.Background(), task); r.Outcome != fsm.OutcomeFailed || !strings.Contains(r.Error, "instance inst-1: resolver corp-dns") {
		t.Fatalf("with a Resolver: %+v", r)
	}
}
