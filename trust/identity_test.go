package trust

import (
	"crypto/rand"
	"crypto/x509"
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestFromCert(t *testing.T) {
	const adm = "admitted=1793534400123456789"
	tests := []struct {
		name string
		uris []string
		want Identity
		err  string // substring; "" means success
	}{
		{name: "member", uris: []string{"kibotos://c1/member/n1?roles=ctrl,node&" + adm},
			want: memberID("n1", RoleCtrl, RoleNode)},
		{name: "admin", uris: []string{"kibotos://c1/admin/n1?" + adm},
			want: Identity{ClusterID: "c1", Kind: KindAdmin, NodeID: "n1", Admitted: admitted}},
		{name: "dataplane", uris: []string{"kibotos://c1/dataplane/n2?" + adm},
			want: Identity{ClusterID: "c1", Kind: KindDataPlane, NodeID: "n2", Admitted: admitted}},
		{name: "other schemes beside", uris: []string{"spiffe://c1/member/x", "kibotos://c1/admin/n1?" + adm},
			want: Identity{ClusterID: "c1", Kind: KindAdmin, NodeID: "n1", Admitted: admitted}},
		{name: "none", uris: nil, err: "carries no kibotos identity"},
		{name: "wrong scheme", uris: []string{"https://c1/member/n1?roles=ctrl&" + adm}, err: "carries no kibotos identity"},
		{name: "two identities", uris: []string{"kibotos://c1/admin/n1?" + adm, "kibotos://c1/admin/n2?" + adm}, err: "two kibotos identities"},
		{name: "no cluster", uris: []string{"kibotos:///member/n1?roles=ctrl&" + adm}, err: "is not kibotos://CLUSTER/KIND/NODE"},
		{name: "no node", uris: []string{"kibotos://c1/member?roles=ctrl&" + adm}, err: "is not kibotos://CLUSTER/KIND/NODE"},
		{name: "empty node", uris: []string{"kibotos://c1/member/?roles=ctrl&" + adm}, err: "is not kibotos://CLUSTER/KIND/NODE"},
		{name: "extra part", uris: []string{"kibotos://c1/member/n1/x?roles=ctrl&" + adm}, err: "is not kibotos://CLUSTER/KIND/NODE"},
		{name: "no path", uris: []string{"kibotos://c1?" + adm}, err: "is not kibotos://CLUSTER/KIND/NODE"},
		{name: "unknown kind", uris: []string{"kibotos://c1/robot/n1?" + adm}, err: `unknown kind "robot"`},
		{name: "empty kind", uris: []string{"kibotos://c1//n1?" + adm}, err: `unknown kind ""`},
		{name: "unknown role", uris: []string{"kibotos://c1/member/n1?roles=ctrl,root&" + adm}, err: `unknown role "root"`},
		{name: "empty role", uris: []string{"kibotos://c1/member/n1?roles=ctrl,&" + adm}, err: `unknown role ""`},
		{name: "role case", uris: []string{"kibotos://c1/member/n1?roles=CTRL&" + adm}, err: `unknown role "CTRL"`},
		{name: "member without roles", uris: []string{"kibotos://c1/member/n1?" + adm}, err: "member certificate without roles"},
		{name: "member with empty roles", uris: []string{"kibotos://c1/member/n1?roles=&" + adm}, err: "member certificate without roles"},
		{name: "no admission time", uris: []string{"kibotos://c1/admin/n1"}, err: `admission time "" is not a number`},
		{name: "admission time not a number", uris: []string{"kibotos://c1/admin/n1?admitted=yesterday"}, err: `admission time "yesterday" is not a number`},
		{name: "admission time overflows", uris: []string{"kibotos://c1/admin/n1?admitted=99999999999999999999"}, err: "is not a number"},
		{name: "admission time fractional", uris: []string{"kibotos://c1/admin/n1?admitted=1.5"}, err: "is not a number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FromCert(withURIs(t, tt.uris...))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("FromCert = %+v, %v; want an error containing %q", got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("FromCert = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// A certificate of a build older than role certificates is told apart by
// errors.Is, which callers use to explain the upgrade.
func TestFromCertNoIdentityIsErrNoIdentity(t *testing.T) {
	_, err := FromCert(withURIs(t))
	if !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("FromCert without URIs: %v, want ErrNoIdentity", err)
	}
	_, err = FromCert(withURIs(t, "kibotos://c1/thing/n1?admitted=1"))
	if errors.Is(err, ErrNoIdentity) {
		t.Fatalf("a malformed identity is reported as a missing one: %v", err)
	}
}

// The URI is the wire form of an identity: what it writes FromCert reads
// back, in the exact form older builds wrote and read.
func TestIdentityURI(t *testing.T) {
	id := memberID("n1", RoleCtrl, RoleNode)
	if got, want := id.URI().String(), "kibotos://c1/member/n1?admitted=1793534400123456789&roles=ctrl%2Cnode"; got != want {
		t.Fatalf("URI = %s, want %s", got, want)
	}
	for _, id := range []Identity{id, {ClusterID: "c1", Kind: KindAdmin, NodeID: "n1", Admitted: admitted}} {
		back, err := FromCert(&x509.Certificate{URIs: []*url.URL{id.URI()}})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, id) {
			t.Fatalf("FromCert(URI(%+v)) = %+v", id, back)
		}
	}
}

func TestIdentityName(t *testing.T) {
	for _, tt := range []struct {
		id   Identity
		want string
	}{
		{Identity{Kind: KindMember, NodeID: "n1"}, "n1"},
		{Identity{Kind: KindDataPlane, NodeID: "n1"}, "n1"},
		{Identity{Kind: KindAdmin, NodeID: "n1"}, "admin@n1"},
		{Identity{Kind: KindOperator, NodeID: "alice"}, "operator:alice"},
	} {
		if got := tt.id.Name(); got != tt.want {
			t.Errorf("Name of %s %s = %q, want %q", tt.id.Kind, tt.id.NodeID, got, tt.want)
		}
	}
}

// FuzzFromCert puts an arbitrary URI SAN into a signed certificate, parses
// it as a peer's would be, and checks that FromCert accepts only well-formed
// identities and reads back what it accepts.
func FuzzFromCert(f *testing.F) {
	for _, s := range []string{
		"kibotos://c1/member/n1?roles=ctrl,node&admitted=1793534400123456789",
		"kibotos://c1/admin/n1?admitted=0",
		"kibotos://c1/dataplane/n1?roles=node&admitted=-5",
		"kibotos://c1/member/n1?admitted=1",
		"kibotos://c1/member/n1?roles=ctrl&roles=root&admitted=1",
		"kibotos://[::1]:80/member/n%2F1?roles=ctrl&admitted=1",
		"kibotos:opaque",
		"kibotos://c1//?admitted=x",
		"https://c1/member/n1",
	} {
		f.Add(s)
	}
	ca := newTestCA(f)
	key, err := NewKey()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		tmpl := &x509.Certificate{SerialNumber: serial(), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), URIs: []*url.URL{u}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
		if err != nil {
			return // x509 refuses to write this URI; no peer can present it
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return // x509 refuses to read this URI back; no handshake gets this far
		}
		id, err := FromCert(c)
		if err != nil {
			return
		}
		switch {
		case id.ClusterID == "" || id.NodeID == "" || strings.Contains(id.NodeID, "/"):
			t.Fatalf("FromCert(%q) accepted an incomplete identity %+v", raw, id)
		case id.Kind != KindMember && id.Kind != KindAdmin && id.Kind != KindOperator && id.Kind != KindDataPlane:
			t.Fatalf("FromCert(%q) accepted kind %q", raw, id.Kind)
		case id.Kind == KindMember && len(id.Roles) == 0:
			t.Fatalf("FromCert(%q) accepted a member without roles", raw)
		}
		for _, r := range id.Roles {
			if r != RoleCtrl && r != RoleNode && r != RoleOperator {
				t.Fatalf("FromCert(%q) accepted role %q", raw, r)
			}
		}
		back, err := FromCert(&x509.Certificate{URIs: []*url.URL{id.URI()}})
		if err != nil || !reflect.DeepEqual(back, id) || !back.Admitted.Equal(id.Admitted) {
			t.Fatalf("FromCert(%q) = %+v, but its URI %s reads back as %+v, %v", raw, id, id.URI(), back, err)
		}
	})
}
