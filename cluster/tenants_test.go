package cluster_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// Operators manage namespaces and their keys; names of Volumes are
// unique per namespace; lists show one namespace unless asked for all.
func TestNamespacesThroughTheAPI(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	ctrl := c.WaitLeader()
	c.WaitAllReady()
	ctx := context.Background()
	cl := c.Client(ctrl)
	for _, ns := range []string{"acme", "beta"} {
		if _, err := cl.Do(ctx, "POST", "/v1/namespaces", api.NamespaceCreateRequest{Name: ns}, nil); err != nil {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}
	if _, err := cl.Do(ctx, "POST", "/v1/namespaces", api.NamespaceCreateRequest{Name: "acme"}, nil); api.CodeOf(err) != api.CodeAlreadyExists {
		t.Fatalf("second create of acme: %v, want already_exists", err)
	}
	vols := map[string]string{}
	for _, ns := range []string{"acme", "beta", ""} {
		in := c.Client(ctrl)
		in.Namespace = ns
		var v api.Volume
		if _, err := in.Do(ctx, "POST", "/v1/volumes", api.VolumeCreateRequest{Name: "data", SizeBytes: 64 << 20}, &v); err != nil {
			t.Fatalf("create Volume data in namespace %q: %v", ns, err)
		}
		vols[ns] = v.VolumeID
		var got api.Volume
		if _, err := in.Do(ctx, "GET", "/v1/volumes/data", nil, &got); err != nil || got.VolumeID != v.VolumeID {
			t.Fatalf("get data in namespace %q: %+v %v, want %s", ns, got, err, v.VolumeID)
		}
		var l api.VolumeList
		if _, err := in.Do(ctx, "GET", "/v1/volumes", nil, &l); err != nil || len(l.Volumes) != 1 || l.Volumes[0].VolumeID != v.VolumeID {
			t.Fatalf("list in namespace %q: %+v %v, want only %s", ns, l, err, v.VolumeID)
		}
	}
	all := c.Client(ctrl)
	all.AllNamespaces = true
	var l api.VolumeList
	if _, err := all.Do(ctx, "GET", "/v1/volumes", nil, &l); err != nil || len(l.Volumes) != 3 {
		t.Fatalf("list of every namespace: %+v %v, want 3 Volumes", l, err)
	}
	if _, err := cl.Do(ctx, "POST", "/v1/namespaces/gamma/delete", api.WriteMeta{}, nil); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("delete of an unknown namespace: %v", err)
	}
	if _, err := cl.Do(ctx, "POST", "/v1/namespaces/acme/delete", api.WriteMeta{}, nil); api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "1 Volumes, 0 Egress") {
		t.Fatalf("delete of acme holding a Volume: %v", err)
	}
	var ns api.Namespace
	if _, err := cl.Do(ctx, "GET", "/v1/namespaces/acme", nil, &ns); err != nil || ns.Usage.Volumes != 1 || ns.Usage.VolumeBytes != 64<<20 {
		t.Fatalf("get acme: %+v %v", ns, err)
	}
	limit := uint64(100 << 20)
	if _, err := cl.Do(ctx, "POST", "/v1/namespaces/acme/quota", api.NamespaceQuotaRequest{Set: api.NamespaceQuota{VolumeBytes: &limit}}, &ns); err != nil || ns.Quota == nil || *ns.Quota.VolumeBytes != limit {
		t.Fatalf("set acme's quota: %+v %v", ns, err)
	}
	inAcme := c.Client(ctrl)
	inAcme.Namespace = "acme"
	_, err := inAcme.Do(ctx, "POST", "/v1/volumes", api.VolumeCreateRequest{Name: "more", SizeBytes: 64 << 20}, nil)
	if api.CodeOf(err) != api.CodeResourceExhausted || !strings.Contains(err.Error(), "namespace acme: Volume bytes quota 100.0MiB, 64.0MiB in use, 64.0MiB asked") {
		t.Fatalf("a Volume over acme's quota: %v", err)
	}
	if n := ctrl.Server.QuotaRefusals()[[2]string{"acme", "Volume bytes"}]; n != 1 {
		t.Fatalf("the leader counted %d quota refusals of acme's Volume bytes, want 1", n)
	}

	// Egress objects of the same name in two namespaces, each found in
	// its own.
	for _, ns := range []string{"acme", "beta"} {
		in := c.Client(ctrl)
		in.Namespace = ns
		if _, err := in.Do(ctx, "POST", "/v1/egress", api.EgressCreateRequest{Name: "corp", SOCKS5: "10.0.0." + map[string]string{"acme": "1", "beta": "2"}[ns] + ":1080"}, nil); err != nil {
			t.Fatalf("egress corp in %s: %v", ns, err)
		}
		var eg api.Egress
		if _, err := in.Do(ctx, "GET", "/v1/egress/corp", nil, &eg); err != nil || eg.Namespace != ns || eg.Name != "corp" || !strings.HasPrefix(eg.SOCKS5, "10.0.0."+map[string]string{"acme": "1", "beta": "2"}[ns]) {
			t.Fatalf("egress corp of %s: %+v %v", ns, eg, err)
		}
		var el api.EgressList
		if _, err := in.Do(ctx, "GET", "/v1/egress", nil, &el); err != nil || len(el.Egress) != 1 {
			t.Fatalf("egress of %s: %+v %v, want its one", ns, el, err)
		}
	}
	if _, err := cl.Do(ctx, "GET", "/v1/egress/corp", nil, nil); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("egress corp in default: %v, want not_found", err)
	}
	if _, err := cl.Do(ctx, "GET", "/v1/egress/acme:corp", nil, nil); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("a qualified name given: %v, want invalid_argument", err)
	}

	// A key made by ctrl comes back with its secret, once; listed
	// without it.
	var made struct {
		Key    api.APIKey `json:"api_key"`
		Secret string     `json:"secret"`
	}
	if _, err := cl.Do(ctx, "POST", "/v1/api-keys", api.APIKeyCreateRequest{Name: "app", Namespace: "acme", Role: api.KeyRoleSandbox, TTL: "90d"}, &made); err != nil {
		t.Fatalf("create key: %v", err)
	}
	if id, _, ok := api.ParseKeySecret(made.Secret); !ok || id != made.Key.KeyID || made.Key.ExpiresAt == nil || made.Key.State != api.OperatorActive {
		t.Fatalf("created key %+v with secret %q", made.Key, made.Secret)
	}
	acme := c.Client(ctrl)
	acme.Namespace = "acme"
	var keys []api.APIKey
	raw, err := acme.Do(ctx, "GET", "/v1/api-keys", nil, &keys)
	if err != nil || len(keys) != 1 || keys[0].Name != "app" || strings.Contains(string(raw), "secret") {
		t.Fatalf("keys of acme: %s %v", raw, err)
	}
	if _, err := cl.Do(ctx, "GET", "/v1/api-keys", nil, &keys); err != nil || len(keys) != 0 {
		t.Fatalf("keys of default: %+v %v, want none", keys, err)
	}
	var revoked api.APIKey
	if _, err := acme.Do(ctx, "POST", "/v1/api-keys/app/revoke", api.WriteMeta{}, &revoked); err != nil || revoked.State != api.OperatorRevoked {
		t.Fatalf("revoke: %+v %v", revoked, err)
	}
	for _, bad := range []api.APIKeyCreateRequest{
		{Name: "x", Namespace: "acme", Role: "root"},
		{Name: "x", Namespace: "acme", Role: api.KeyRoleSandbox, TTL: "-1h"},
		{Name: "x", Namespace: "nope", Role: api.KeyRoleSandbox},
	} {
		if _, err := cl.Do(ctx, "POST", "/v1/api-keys", bad, nil); err == nil {
			t.Errorf("key %+v was created", bad)
		}
	}
}
