package fsm

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// Egress and Resolver helpers

const testPassword = "s3cret-pa55word"

var corpArgs = EgressCreateArgs{Name: "corp", SOCKS5: "proxy.corp.example:1080", Username: "kibo", Password: testPassword}

func (h *harness) egress(name string) *api.Egress {
	h.t.Helper()
	var e *api.Egress
	if err := h.f.View(func(tx *bolt.Tx) (err error) { e, err = GetEgress(tx, name); return }); err != nil {
		h.t.Fatalf("get egress %s: %v", name, err)
	}
	return e
}

func (h *harness) resolver(name string) *api.Resolver {
	h.t.Helper()
	var r *api.Resolver
	if err := h.f.View(func(tx *bolt.Tx) (err error) { r, err = GetResolver(tx, name); return }); err != nil {
		h.t.Fatalf("get resolver %s: %v", name, err)
	}
	return r
}

// revisions lists the kept revisions of an Egress.
func (h *harness) revisions(name string) []uint64 {
	h.t.Helper()
	var out []uint64
	h.f.View(func(tx *bolt.Tx) error {
		prefix := []byte(name + "\x00")
		c := tx.Bucket(bucketEgressRevisions).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			var r egressRevision
			if _, err := getJSON(tx, bucketEgressRevisions, k, &r); err != nil {
				h.t.Fatal(err)
			}
			out = append(out, r.Revision)
		}
		return nil
	})
	return out
}

func (h *harness) credentials(node, name string, rev uint64) (*api.EgressCredentials, error) {
	var c *api.EgressCredentials
	err := h.f.View(func(tx *bolt.Tx) (err error) { c, err = EgressCredentials(tx, node, name, rev); return })
	return c, err
}

// withCorp: one node and Egress corp at revision 1.
func withCorp(h *harness) {
	h.t.Helper()
	oneNode(h)
	h.ok(OpEgressCreate, corpArgs)
}

// viaCorp is a create whose policy names Egress corp.
var viaCorp = withNetwork(api.NetworkPolicy{Egress: "corp"})

// noPassword fails when a result carries the password.
func noPassword(t *testing.T, r Result) {
	t.Helper()
	if strings.Contains(string(r.Value), testPassword) || strings.Contains(string(r.Value), `"password"`) {
		t.Errorf("result carries the password: %s", r.Value)
	}
}

func wantEgress(want api.Egress) func(t *testing.T, h *harness, r Result) {
	return func(t *testing.T, h *harness, r Result) {
		t.Helper()
		got := decode[api.Egress](t, r)
		want.CreatedAt, want.UpdatedAt = got.CreatedAt, got.UpdatedAt
		if !reflect.DeepEqual(got, want) {
			t.Errorf("egress %+v\nwant %+v", got, want)
		}
		if stored := h.egress(want.Name); !reflect.DeepEqual(*stored, got) {
			t.Errorf("stored %+v, result %+v", stored, got)
		}
		noPassword(t, r)
	}
}

// refsProblem checks the reference indexes against the Workspace records
// and that exactly the latest and the referenced revisions are kept.
func refsProblem(tx *bolt.Tx) error {
	wantE, wantR := map[string]bool{}, map[string]bool{}
	var missing []string
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, v []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err != nil {
			return err
		}
		for _, r := range egressRefsOf(w) {
			wantE[string(egressRefKey(r.name, r.rev, w.WorkspaceID))] = true
			if rev, _ := getRevision(tx, r.name, r.rev); rev == nil {
				missing = append(missing, fmt.Sprintf("%s uses egress %s revision %d, which is not kept", w.WorkspaceID, r.name, r.rev))
			}
		}
		for _, n := range resolverRefsOf(w) {
			wantR[string(resolverRefKey(n, w.WorkspaceID))] = true
			if r, _ := getRecord[resolverRecord](tx, bucketResolvers, []byte(n)); r == nil {
				missing = append(missing, fmt.Sprintf("%s uses resolver %s, which does not exist", w.WorkspaceID, n))
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s", strings.Join(missing, "; "))
	}
	gotE, gotR := map[string]bool{}, map[string]bool{}
	tx.Bucket(bucketEgressRefs).ForEach(func(k, _ []byte) error { gotE[string(k)] = true; return nil })
	tx.Bucket(bucketResolverRefs).ForEach(func(k, _ []byte) error { gotR[string(k)] = true; return nil })
	if !reflect.DeepEqual(gotE, wantE) {
		return fmt.Errorf("egress refs %q, want %q", keys(gotE), keys(wantE))
	}
	if !reflect.DeepEqual(gotR, wantR) {
		return fmt.Errorf("resolver refs %q, want %q", keys(gotR), keys(wantR))
	}
	return tx.Bucket(bucketEgressRevisions).ForEach(func(k, v []byte) error {
		name := string(k[:bytes.IndexByte(k, 0)])
		var rev egressRevision
		if _, err := getJSON(tx, bucketEgressRevisions, k, &rev); err != nil {
			return err
		}
		r, err := getRecord[egressRecord](tx, bucketEgress, []byte(name))
		if err != nil {
			return err
		}
		if r == nil {
			return fmt.Errorf("revision %d of egress %s kept after its deletion", rev.Revision, name)
		}
		if r.Revision == rev.Revision {
			if r.SOCKS5 != rev.SOCKS5 || r.Username != rev.Username || r.PasswordSet != (rev.Password != "") {
				return fmt.Errorf("egress %s record %+v differs from its latest revision", name, r)
			}
			return nil
		}
		prefix := append(revisionKey(name, rev.Revision), 0)
		for ref := range wantE {
			if strings.HasPrefix(ref, string(prefix)) {
				return nil
			}
		}
		return fmt.Errorf("revision %d of egress %s (latest %d) is kept though no Workspace uses it", rev.Revision, name, r.Revision)
	})
}

// ---------------------------------------------------------------------------
// egress.create

func TestEgressCreate(t *testing.T) {
	create := func(a EgressCreateArgs) func(h *harness) Entry { return ent(OpEgressCreate, a) }
	with := func(edit func(a *EgressCreateArgs)) EgressCreateArgs {
		a := corpArgs
		edit(&a)
		return a
	}
	socks := func(s string) EgressCreateArgs { return with(func(a *EgressCreateArgs) { a.SOCKS5 = s }) }
	cases := []opCase{
		{name: "with credentials", setup: oneNode, entry: create(corpArgs),
			check: wantEgress(api.Egress{Name: "corp", Revision: 1, SOCKS5: "proxy.corp.example:1080", Username: "kibo", PasswordSet: true, Version: 1})},
		{name: "without credentials", setup: oneNode, entry: create(EgressCreateArgs{Name: "open-1", SOCKS5: "192.0.2.10:1080"}),
			check: wantEgress(api.Egress{Name: "open-1", Revision: 1, SOCKS5: "192.0.2.10:1080", Version: 1})},
		{name: "credentials of 255 bytes", setup: oneNode, entry: create(with(func(a *EgressCreateArgs) {
			a.Username, a.Password = strings.Repeat("u", 255), strings.Repeat("p", 255)
		}))},
		{name: "exists", setup: withCorp, entry: create(with(func(a *EgressCreateArgs) { a.SOCKS5 = "other:1" })), code: api.CodeFailedPrecondition,
			check: says("egress corp already exists (revision 1): change it with kibo egress update corp, or choose another name")},
		{name: "username without password", setup: oneNode, entry: create(with(func(a *EgressCreateArgs) { a.Password = "" })), code: api.CodeInvalidArgument,
			check: says("egress corp: SOCKS5 authentication (RFC 1929) needs both a username and a password")},
		{name: "password without username", setup: oneNode, entry: create(with(func(a *EgressCreateArgs) { a.Username = "" })), code: api.CodeInvalidArgument,
			check: says("needs both a username and a password")},
		{name: "username too long", setup: oneNode, entry: create(with(func(a *EgressCreateArgs) { a.Username = strings.Repeat("u", 256) })), code: api.CodeInvalidArgument,
			check: says("egress corp: the username is 256 bytes: SOCKS5 (RFC 1929) allows at most 255")},
		{name: "password too long", setup: oneNode, entry: create(with(func(a *EgressCreateArgs) { a.Password = strings.Repeat("p", 256) + testPassword })), code: api.CodeInvalidArgument,
			check: func(t *testing.T, h *harness, r Result) {
				says("egress corp: the password is 271 bytes")(t, h, r)
				if strings.Contains(r.Error.Message, testPassword) {
					t.Errorf("error names the password: %s", r.Error.Message)
				}
			}},
		{name: "control character in username", setup: oneNode, entry: create(with(func(a *EgressCreateArgs) { a.Username = "ki\nbo" })), code: api.CodeInvalidArgument,
			check: says("the username holds a control character")},
	}
	for in, want := range map[string]string{
		"PROXY.Corp.Example:01080": "proxy.corp.example:1080",
		"[2001:DB8::10]:1080":      "[2001:db8::10]:1080",
		"[::ffff:192.0.2.1]:1080":  "192.0.2.1:1080",
		"127.0.0.1:9050":           "127.0.0.1:9050",
		"proxy:65535":              "proxy:65535",
	} {
		cases = append(cases, opCase{name: "socks5 " + in, setup: oneNode, entry: create(socks(in)), check: func(t *testing.T, h *harness, r Result) {
			if got := decode[api.Egress](t, r).SOCKS5; got != want {
				t.Errorf("socks5 %q stored as %q, want %q", in, got, want)
			}
		}})
	}
	for _, bad := range []struct{ in, says string }{
		{"proxy.corp.example", "has no port"},
		{"2001:db8::10", "has no port"},
		{"proxy:0", `has port "0"`},
		{"proxy:65536", `has port "65536"`},
		{"proxy:+80", `has port "+80"`},
		{"proxy:http", `has port "http"`},
		{"proxy:", "has no port"},
		{":1080", `has host ""`},
		{"0.0.0.0:1080", "is the unspecified address 0.0.0.0"},
		{"[::]:1080", "is the unspecified address ::"},
		{"224.0.0.1:1080", "is the multicast address"},
		{"[fe80::1%eth0]:1080", "names a zone"},
		{"10.0.0.300:1080", "neither an IP address nor a DNS name"},
		{"pro_xy:1080", "neither an IP address nor a DNS name"},
		{"-proxy:1080", "neither an IP address nor a DNS name"},
		{"[proxy]:1080", "brackets around something other than an IPv6 address"},
		{"2001:db8::10:1080:x", "is not HOST:PORT"},
		{"socks5://proxy:1080", "is not HOST:PORT"},
		{"", "has no port"},
		{strings.Repeat("a", 300) + ":1", "is 302 bytes long: at most 261"},
	} {
		cases = append(cases, opCase{name: "bad socks5 " + bad.in, setup: oneNode, entry: create(socks(bad.in)), code: api.CodeInvalidArgument,
			check: says("egress corp: socks5 address", bad.says)})
	}
	for _, bad := range []struct{ name, says string }{
		{"", `egress name "" is not valid`},
		{"Corp", `egress name "Corp" is not valid: use 1-63 lowercase letters, digits or '-', starting with a letter or digit`},
		{"corp.proxy", "is not valid"},
		{"-corp", "is not valid"},
		{"corp proxy", "is not valid"},
		{strings.Repeat("c", 64), "egress name of 64 bytes is too long"},
		{"none", `egress name "none" is reserved (none, public and default are words of a network policy): choose another name`},
		{"public", "is reserved"},
		{"default", "is reserved"},
	} {
		cases = append(cases, opCase{name: "bad name " + bad.name, setup: oneNode, entry: create(with(func(a *EgressCreateArgs) { a.Name = bad.name })),
			code: api.CodeInvalidArgument, check: says(bad.says)})
	}
	cases = append(cases, opCase{name: "63 bytes", setup: oneNode, entry: create(with(func(a *EgressCreateArgs) { a.Name = strings.Repeat("c", 63) }))})
	runCases(t, cases)
}

// Only revision records hold the password: not the Egress record, not a
// command's stored result.
func TestEgressPasswordOnlyInItsRevision(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.advance(time.Second)
	h.ok(OpEgressCreate, corpArgs, withCommand("eg-1"))
	h.advance(time.Second)
	h.ok(OpEgressUpdate, EgressUpdateArgs{Name: "corp", SOCKS5: str("proxy2:1080")}, withCommand("eg-2"))
	section := ""
	for _, line := range strings.Split(h.dump(), "\n") {
		if strings.HasPrefix(line, "[") {
			section = line
		}
		if strings.Contains(line, testPassword) && section != "[egress_revisions]" {
			t.Errorf("the password is stored in %s: %s", section, line)
		}
	}
	if got := h.revisions("corp"); !reflect.DeepEqual(got, []uint64{2}) {
		t.Errorf("revisions %v kept, want [2]: the first is used by no Workspace", got)
	}
}

// The cluster keeps at most MaxEgressObjects and MaxResolverObjects.
func TestEgressAndResolverCount(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	var es []Entry
	for i := 0; i < api.MaxEgressObjects; i++ {
		es = append(es, h.entry(OpEgressCreate, EgressCreateArgs{Name: fmt.Sprintf("e-%d", i), SOCKS5: "proxy:1080"}))
		es = append(es, h.entry(OpResolverCreate, ResolverCreateArgs{Name: fmt.Sprintf("r-%d", i), Upstreams: []string{"192.0.2.53"}}))
	}
	for i, r := range h.apply(es...) {
		if r.Error != nil {
			t.Fatalf("create %d: %v", i, r.Error)
		}
	}
	h.advance(time.Second)
	if e := h.fail(api.CodeResourceExhausted, OpEgressCreate, EgressCreateArgs{Name: "one-more", SOCKS5: "proxy:1080"}); !strings.Contains(e.Message, "at most 1000 Egress objects") {
		t.Errorf("error %q", e.Message)
	}
	h.fail(api.CodeResourceExhausted, OpResolverCreate, ResolverCreateArgs{Name: "one-more", Upstreams: []string{"192.0.2.53"}})
	h.ok(OpEgressDelete, ObjectArgs{Name: "e-7"})
	h.ok(OpEgressCreate, EgressCreateArgs{Name: "one-more", SOCKS5: "proxy:1080"})
}

// ---------------------------------------------------------------------------
// egress.update

func TestEgressUpdate(t *testing.T) {
	upd := func(a EgressUpdateArgs, opts ...entryOpt) func(h *harness) Entry {
		a.Name = "corp"
		return ent(OpEgressUpdate, a, opts...)
	}
	rev2 := func(want api.Egress) func(t *testing.T, h *harness, r Result) {
		want.Name, want.Revision, want.Version = "corp", 2, 2
		return func(t *testing.T, h *harness, r Result) {
			wantEgress(want)(t, h, r)
			if got := h.revisions("corp"); !reflect.DeepEqual(got, []uint64{2}) {
				t.Errorf("revisions kept %v, want [2]", got)
			}
		}
	}
	creds := func(want api.EgressCredentials) func(t *testing.T, h *harness, r Result) {
		return func(t *testing.T, h *harness, r Result) {
			var got *egressRevision
			h.f.View(func(tx *bolt.Tx) (err error) { got, err = getRevision(tx, "corp", 2); return })
			if got == nil || got.Username != want.Username || got.Password != want.Password || got.SOCKS5 != want.SOCKS5 {
				t.Errorf("revision 2 %+v, want %+v", got, want)
			}
		}
	}
	cases := []opCase{
		{name: "socks5 only: credentials kept", setup: withCorp, entry: upd(EgressUpdateArgs{SOCKS5: str("[2001:db8::7]:1080")}),
			check: func(t *testing.T, h *harness, r Result) {
				rev2(api.Egress{SOCKS5: "[2001:db8::7]:1080", Username: "kibo", PasswordSet: true})(t, h, r)
				creds(api.EgressCredentials{SOCKS5: "[2001:db8::7]:1080", Username: "kibo", Password: testPassword})(t, h, r)
			}},
		{name: "password only", setup: withCorp, entry: upd(EgressUpdateArgs{Password: str("new")}),
			check: creds(api.EgressCredentials{SOCKS5: "proxy.corp.example:1080", Username: "kibo", Password: "new"})},
		{name: "username only", setup: withCorp, entry: upd(EgressUpdateArgs{Username: str("other")}),
			check: creds(api.EgressCredentials{SOCKS5: "proxy.corp.example:1080", Username: "other", Password: testPassword})},
		{name: "clear credentials", setup: withCorp, entry: upd(EgressUpdateArgs{ClearCredentials: true}),
			check: rev2(api.Egress{SOCKS5: "proxy.corp.example:1080"})},
		{name: "credentials for one without", setup: func(h *harness) {
			oneNode(h)
			h.ok(OpEgressCreate, EgressCreateArgs{Name: "corp", SOCKS5: "proxy:1080"})
		}, entry: upd(EgressUpdateArgs{Username: str("u"), Password: str("p")}), check: rev2(api.Egress{SOCKS5: "proxy:1080", Username: "u", PasswordSet: true})},
		{name: "a username alone for one without", setup: func(h *harness) {
			oneNode(h)
			h.ok(OpEgressCreate, EgressCreateArgs{Name: "corp", SOCKS5: "proxy:1080"})
		}, entry: upd(EgressUpdateArgs{Username: str("u")}), code: api.CodeInvalidArgument, check: says("needs both a username and a password")},
		{name: "an empty password", setup: withCorp, entry: upd(EgressUpdateArgs{Password: str("")}), code: api.CodeInvalidArgument,
			check: says("needs both a username and a password", "kibo egress update corp --clear-credentials")},
		{name: "the values it has: no new revision", setup: withCorp,
			entry: upd(EgressUpdateArgs{SOCKS5: str("PROXY.corp.example:1080"), Password: str(testPassword)}), unchanged: true,
			check: func(t *testing.T, h *harness, r Result) {
				if got := decode[api.Egress](t, r); got.Revision != 1 || got.Version != 1 {
					t.Errorf("unchanged update gave %+v", got)
				}
			}},
		{name: "expected version", setup: withCorp, entry: upd(EgressUpdateArgs{SOCKS5: str("p:1")}, withVersion(1)), check: rev2(api.Egress{SOCKS5: "p:1", Username: "kibo", PasswordSet: true})},
		{name: "another version expected", setup: withCorp, entry: upd(EgressUpdateArgs{SOCKS5: str("p:1")}, withVersion(2)), code: api.CodeVersionMismatch,
			check: says("egress corp is at version 1, not the expected 2")},
		{name: "nothing given", setup: withCorp, entry: upd(EgressUpdateArgs{}), code: api.CodeInvalidArgument, check: says("egress corp: give what to change")},
		{name: "clear and a username", setup: withCorp, entry: upd(EgressUpdateArgs{ClearCredentials: true, Username: str("u")}), code: api.CodeInvalidArgument,
			check: says("are exclusive")},
		{name: "bad socks5", setup: withCorp, entry: upd(EgressUpdateArgs{SOCKS5: str("proxy")}), code: api.CodeInvalidArgument, check: says("has no port")},
		{name: "password too long", setup: withCorp, entry: upd(EgressUpdateArgs{Password: str(strings.Repeat("p", 300))}), code: api.CodeInvalidArgument,
			check: says("the password is 300 bytes")},
		{name: "unknown", setup: oneNode, entry: upd(EgressUpdateArgs{SOCKS5: str("p:1")}), code: api.CodeNotFound,
			check: says("egress corp does not exist: check the name with kibo egress list")},
		{name: "bad name", setup: oneNode, entry: ent(OpEgressUpdate, EgressUpdateArgs{Name: "none", SOCKS5: str("p:1")}), code: api.CodeInvalidArgument},
	}
	runCases(t, cases)
}

// ---------------------------------------------------------------------------
// egress.delete and resolver.delete

func TestEgressDelete(t *testing.T) {
	usedBy := func(n int) func(h *harness) {
		return func(h *harness) {
			withCorp(h)
			for i := 0; i < n; i++ {
				h.stopped(fmt.Sprintf("c%02d", i), viaCorp)
			}
		}
	}
	ids := func(n int) []string {
		var out []string
		for i := 0; i < n; i++ {
			out = append(out, WorkspaceIDFor(fmt.Sprintf("c%02d", i)))
		}
		return sorted(out...)
	}
	cases := []opCase{
		{name: "unused", setup: withCorp, entry: ent(OpEgressDelete, ObjectArgs{Name: "corp"}), check: func(t *testing.T, h *harness, r Result) {
			noPassword(t, r)
			if got := decode[api.Egress](t, r); got.Name != "corp" || got.Revision != 1 {
				t.Errorf("result %+v", got)
			}
			h.f.View(func(tx *bolt.Tx) error {
				if _, err := GetEgress(tx, "corp"); api.CodeOf(err) != api.CodeNotFound {
					t.Errorf("get after delete: %v", err)
				}
				return nil
			})
			if got := h.revisions("corp"); len(got) != 0 {
				t.Errorf("revisions kept after delete: %v", got)
			}
			// The name can be used again, from revision 1.
			h.advance(time.Second)
			if e := decode[api.Egress](t, h.ok(OpEgressCreate, corpArgs)); e.Revision != 1 {
				t.Errorf("created again at revision %d", e.Revision)
			}
		}},
		{name: "used by two", setup: usedBy(2), entry: ent(OpEgressDelete, ObjectArgs{Name: "corp"}), code: api.CodeFailedPrecondition,
			check: func(t *testing.T, h *harness, r Result) {
				want := "egress corp is used by workspaces " + strings.Join(ids(2), ", ") + ": " + egressUsersFix
				if r.Error.Message != want {
					t.Errorf("error %q\nwant  %q", r.Error.Message, want)
				}
			}},
		{name: "used by twelve", setup: usedBy(12), entry: ent(OpEgressDelete, ObjectArgs{Name: "corp"}), code: api.CodeFailedPrecondition,
			check: func(t *testing.T, h *harness, r Result) {
				want := "egress corp is used by workspaces " + strings.Join(ids(12)[:10], ", ") + " and 2 more: " + egressUsersFix
				if r.Error.Message != want {
					t.Errorf("error %q\nwant  %q", r.Error.Message, want)
				}
			}},
		{name: "used by a pending change only", setup: func(h *harness) {
			withCorp(h)
			w := h.running("c1", smallWS)
			h.ok(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, api.NetworkChange{Egress: str("corp")}))
		}, entry: ent(OpEgressDelete, ObjectArgs{Name: "corp"}), code: api.CodeFailedPrecondition, check: says("is used by workspaces " + WorkspaceIDFor("c1"))},
		{name: "no longer used", setup: func(h *harness) {
			withCorp(h)
			w := h.stopped("c1", viaCorp)
			h.ok(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, api.NetworkChange{Egress: str("none")}))
		}, entry: ent(OpEgressDelete, ObjectArgs{Name: "corp"})},
		{name: "used by a deleted Workspace", setup: func(h *harness) {
			withCorp(h)
			w := h.stopped("c1", viaCorp)
			h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
			h.answer(w.WorkspaceID, OutcomeOK, "")
		}, entry: ent(OpEgressDelete, ObjectArgs{Name: "corp"})},
		{name: "expected version", setup: withCorp, entry: ent(OpEgressDelete, ObjectArgs{Name: "corp"}, withVersion(1))},
		{name: "another version expected", setup: withCorp, entry: ent(OpEgressDelete, ObjectArgs{Name: "corp"}, withVersion(3)), code: api.CodeVersionMismatch},
		{name: "unknown", setup: oneNode, entry: ent(OpEgressDelete, ObjectArgs{Name: "corp"}), code: api.CodeNotFound},
		{name: "bad name", setup: oneNode, entry: ent(OpEgressDelete, ObjectArgs{Name: "Corp"}), code: api.CodeInvalidArgument},
	}
	runCases(t, cases)
}

func TestListEgressAndResolvers(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	for _, n := range []string{"c", "a", "b"} {
		h.ok(OpEgressCreate, EgressCreateArgs{Name: n, SOCKS5: "proxy:1080", Username: "u", Password: testPassword})
		h.ok(OpResolverCreate, ResolverCreateArgs{Name: n, Upstreams: []string{"192.0.2.53"}})
	}
	h.create("c1", withNetwork(api.NetworkPolicy{Egress: "b", Resolver: "b"}))
	var names []string
	token := ""
	for page := 0; ; page++ {
		var l *api.EgressList
		if err := h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListEgress(tx, nil, 2, token); return }); err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Egress {
			names = append(names, fmt.Sprintf("%s:%d", e.Name, e.Workspaces))
		}
		if token = l.NextPageToken; token == "" {
			break
		}
		if page > 3 {
			t.Fatal("paging does not end")
		}
	}
	if want := []string{"a:0", "b:1", "c:0"}; !reflect.DeepEqual(names, want) {
		t.Errorf("egress pages %v, want %v", names, want)
	}
	var all *api.ResolverList
	h.f.View(func(tx *bolt.Tx) (err error) { all, err = ListResolvers(tx, nil, 0, ""); return })
	if len(all.Resolvers) != 3 || all.NextPageToken != "" || all.Resolvers[1].Workspaces != 1 || all.Resolvers[0].Name != "a" {
		t.Errorf("resolvers %+v", all)
	}
	h.f.View(func(tx *bolt.Tx) error {
		l, _ := ListResolvers(tx, nil, 1, "b")
		if len(l.Resolvers) != 1 || l.Resolvers[0].Name != "c" || l.NextPageToken != "" {
			t.Errorf("page after b: %+v", l)
		}
		return nil
	})
}

// Creates and updates with a command id replay their first result.
func TestEgressIdempotent(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.advance(time.Second)
	e := h.entry(OpEgressCreate, corpArgs, withCommand("eg-1"))
	first := h.expect("", e)
	h.advance(time.Second)
	u := h.entry(OpEgressUpdate, EgressUpdateArgs{Name: "corp", SOCKS5: str("p2:1080")}, withCommand("eg-2"), withVersion(1))
	h.expect("", u)
	h.advance(time.Second)
	retry := e
	retry.IssuedAt = h.now
	if r := h.expectUnchanged(retry); !r.Replayed || string(r.Value) != string(first.Value) {
		t.Errorf("retry %+v, want the first result", r)
	}
	u.IssuedAt = h.now
	h.expectUnchanged(u)
	// The password is an input: another one under the same id is refused.
	other := corpArgs
	other.Password = "another"
	h.fail(api.CodeFailedPrecondition, OpEgressCreate, other, withCommand("eg-1"))
}
