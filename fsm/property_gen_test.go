package fsm

import (
	"fmt"
	"math/rand"
	"sort"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// logGen draws a random command log. It reads the reference FSM (the one
// that applies the log one entry at a time) to make some arguments
// plausible — current expected versions, live session ids — and draws
// others wrong on purpose. The log, once drawn, is a fixed input for the
// other replicas.
type logGen struct {
	r        *rand.Rand
	pools    *rand.Rand // storage-pool draws only (see poolPct)
	vols     *rand.Rand // Volume draws only (see volPct)
	tmpls    *rand.Rand // template catalog draws only (see tmplPct)
	opers    *rand.Rand // operator credential draws only (drawOperator)
	cas      *rand.Rand // CA rotation draws only (ca_test.go)
	tenants  *rand.Rand // namespace and API key draws only (drawTenant)
	lifes    *rand.Rand // Workspace lifetime draws only (lifetimes_test.go)
	idles    *rand.Rand // idle pause draws only (idle_test.go)
	ref      *FSM
	now      time.Time
	seq      int
	sessions map[string][]string // session ids opened per node id
	inc      map[string]uint64   // highest incarnation drawn per node id
	withID   []Entry             // entries that carried a command id
	// volWeight is the percentage of entries drawn as Volume ops (and
	// steers creates towards Volumes): the Volume-heavy logs raise it.
	volWeight int
}

func newLogGen(seed int64, ref *FSM) *logGen {
	return &logGen{r: rand.New(rand.NewSource(seed)), pools: rand.New(rand.NewSource(seed + 1)), vols: rand.New(rand.NewSource(seed + 2)), tmpls: rand.New(rand.NewSource(seed + 3)), opers: rand.New(rand.NewSource(seed + 4)), cas: rand.New(rand.NewSource(seed + 5)), tenants: rand.New(rand.NewSource(seed + 6)), lifes: rand.New(rand.NewSource(seed + 7)), idles: rand.New(rand.NewSource(seed + 8)), volWeight: 12, ref: ref, now: t0, sessions: map[string][]string{}, inc: map[string]uint64{}}
}

func (g *logGen) pct(p int) bool { return g.r.Intn(100) < p }

// poolPct draws from the storage-pool source: pool draws do not shift
// the rest of the log, so its shape (and coverage) stays what it was.
func (g *logGen) poolPct(p int) bool { return g.pools.Intn(100) < p }

// volPct draws from the Volume source, for the same reason as poolPct.
func (g *logGen) volPct(p int) bool { return g.vols.Intn(100) < p }

// tmplPct draws from the template catalog source, for the same reason.
func (g *logGen) tmplPct(p int) bool { return g.tmpls.Intn(100) < p }

// tmplDigest draws an image digest, now and then not one.
func (g *logGen) tmplDigest() string {
	if g.tmplPct(5) {
		return "sha256:NOT-HEX"
	}
	return testDigest("abc"[g.tmpls.Intn(3)])
}

// drawTemplate draws a publish or a delete: of a known node or not, a name, digest,
// size and format mostly valid, with or without an expected version.
func (g *logGen) drawTemplate() Entry {
	if g.tmplPct(20) {
		return g.drawTransfer()
	}
	if g.tmplPct(50) {
		return g.drawPlatform()
	}
	a := TemplatePublishArgs{TemplateImage: api.TemplateImage{Name: []string{"kibotos-coding", "debian-12", "Bad Name"}[g.tmpls.Intn(3)], TemplateID: "sha256-" + strings.Repeat("e", 64),
		Digest: g.tmplDigest(), SizeBytes: int64(g.tmpls.Intn(4)) << 30, ImageFormat: []string{api.ImageFormatExt4, api.ImageFormatExt4, "raw"}[g.tmpls.Intn(3)]},
		NodeID: []string{ctrlID, "node-01", "node-02", "bad/id"}[g.tmpls.Intn(4)]}
	var v *uint64
	if g.tmplPct(30) {
		n := uint64(g.tmpls.Intn(3))
		v = &n
	}
	op, args := OpTemplatePublish, any(a)
	if g.tmplPct(30) {
		op, args = OpTemplateDelete, ObjectArgs{Name: a.Name}
	}
	e := makeEntry(g.now, op, args)
	e.ExpectedVersion, e.Actor = v, "op"
	return e
}

// drawPlatform draws a publish, approval or withdrawal of one of three
// Platforms (two of kernel series 6.1), now and then with bad input.
func (g *logGen) drawPlatform() Entry {
	c := "abc"[g.tmpls.Intn(3)]
	a := platformArgs(c, map[byte]string{'a': "6.1.0-28-cloud-amd64", 'b': "6.1.0-30-cloud-amd64", 'c': "6.12.9-cloud-amd64"}[c])
	a.NodeID = []string{ctrlID, "node-01", "node-02", "bad/id"}[g.tmpls.Intn(4)]
	if g.tmplPct(5) {
		a.KernelSeries = "9.9"
	}
	op, args := OpPlatformPublish, any(a)
	switch x := g.tmpls.Intn(10); {
	case x < 4:
		op, args = OpPlatformApprove, ObjectArgs{Name: a.PlatformID}
	case x < 6:
		op, args = OpPlatformWithdraw, ObjectArgs{Name: a.PlatformID}
	}
	e := makeEntry(g.now, op, args)
	e.Actor = "op"
	return e
}

// nextWithAnswers is next, then (now and then) a node's answer to an
// export in flight, as a node gives it soon after: one holds its
// Workspace's stops, starts and deletes. The answers are entries on top
// of the others, so those stay what they were.
func (g *logGen) nextWithAnswers() []Entry {
	out := []Entry{g.next()}
	if g.exporting() && g.tmplPct(50) {
		out = append(out, g.drawTransfer())
	}
	if g.opers.Intn(100) < 3 {
		out = append(out, g.drawOperator())
	}
	if g.cas.Intn(100) < 3 {
		out = append(out, g.drawCARotation())
	}
	if g.tenants.Intn(100) < 4 {
		out = append(out, g.drawTenant())
	}
	if g.lifes.Intn(100) < 6 {
		out = append(out, g.drawLifetime())
	}
	if g.idles.Intn(100) < 8 {
		out = append(out, g.drawIdle()...)
	}
	return out
}

// drawTenant draws a namespace's create or delete, an API key's create
// or revoke, or a Volume create or delete by a key, over two namespaces
// and a bad name, from its own source so the rest of the log stays what
// it was.
func (g *logGen) drawTenant() Entry {
	t := g.tenants
	ns := []string{"acme", "beta", "Bad_Name"}[t.Intn(3)]
	key := []string{"app", "admin"}[t.Intn(2)]
	var op string
	var args any
	actor := "op"
	switch x := t.Intn(100); {
	case x < 25:
		op, args = OpNamespaceCreate, NamespaceArgs{Name: ns}
	case x < 30:
		op, args = OpNamespaceDelete, NamespaceArgs{Name: ns}
	case x < 35:
		n := uint64(t.Intn(3)) << 30
		op, args = OpNamespaceQuota, NamespaceQuotaArgs{Name: ns, Set: api.NamespaceQuota{VolumeBytes: &n}}
	case x < 38:
		op, args = OpNamespaceDefaults, NamespaceDefaultsArgs{Name: ns, Defaults: api.NamespaceDefaults{TimeoutSeconds: int64(t.Intn(3)) * 600, MaxTimeoutSeconds: int64(t.Intn(3)) * 1200}}
	case x < 60:
		role := map[string]string{"app": api.KeyRoleSandbox, "admin": api.KeyRoleNamespaceAdmin}[key]
		op, args = OpAPIKeyCreate, APIKeyCreateArgs{Namespace: ns, Name: key, Role: role, KeyID: strings.Repeat(string(rune('a'+t.Intn(26))), api.KeyIDLen), SecretHash: strings.Repeat("cd", 32), TTL: time.Duration(t.Intn(3)) * time.Hour}
	case x < 66:
		op, args = OpAPIKeyRevoke, APIKeyArgs{Namespace: ns, Name: key}
		actor = []string{"op", KeyActor(ns, "admin")}[t.Intn(2)]
	case x < 72:
		op, args = OpAPIKeyUsed, APIKeyUsedArgs{KeyIDs: []string{strings.Repeat(string(rune('a'+t.Intn(26))), api.KeyIDLen)}}
	case x < 90:
		op, args, actor = OpVolumeCreate, VolumeCreateArgs{Name: []string{"data", "logs"}[t.Intn(2)], SizeBytes: 512 << 20}, KeyActor(ns, key)
	default:
		op, args, actor = OpVolumeDelete, VolumeArgs{Volume: "data"}, KeyActor(ns, key)
	}
	e := makeEntry(g.now, op, args)
	e.Actor = actor
	if op == OpVolumeCreate {
		e.CommandID = "tenant-" + strconv.Itoa(t.Int())
	}
	return e
}

// drawOperator draws an issue or a revoke of one of three operator
// names, now and then with a lifetime out of bounds, from its own source
// so the rest of the log stays what it was.
func (g *logGen) drawOperator() Entry {
	name := []string{"alice", "bob", "Bad Name"}[g.opers.Intn(3)]
	op, args := OpOperatorIssue, any(OperatorIssueArgs{Name: name, KeyFingerprint: strings.Repeat("ab", 32), TTL: []time.Duration{time.Hour, OperatorMaxTTL, time.Minute}[g.opers.Intn(3)]})
	if g.opers.Intn(100) < 40 {
		op, args = OpOperatorRevoke, OperatorArgs{Name: name}
	}
	e := makeEntry(g.now, op, args)
	e.Actor = "op"
	return e
}

// exporting says whether a Transfer is EXPORTING in the reference FSM.
func (g *logGen) exporting() bool {
	found := false
	g.ref.View(func(tx *bolt.Tx) error {
		l, err := ListTransfers(tx, 0, "")
		if err != nil {
			return err
		}
		for _, tr := range l.Transfers {
			found = found || tr.State == api.TransferExporting
		}
		return nil
	})
	return found
}

// drawTransfer draws an export of a Workspace (STOPPED ones most often),
// the exporting node's answer to one in flight, or a delete.
func (g *logGen) drawTransfer() Entry {
	var stopped, all []api.Workspace
	for _, w := range g.workspaces() {
		all = append(all, w)
		if w.State == api.WorkspaceStopped {
			// Exports of running ones are TestTransferExport's: here
			// they held too many stops for the log's balance.
			stopped = append(stopped, w)
		}
	}
	var transfers []api.Transfer
	g.ref.View(func(tx *bolt.Tx) error {
		if l, err := ListTransfers(tx, 0, ""); err == nil {
			transfers = l.Transfers
		}
		return nil
	})
	pick := func(ws []api.Workspace) string {
		if len(ws) == 0 {
			return "ws-none"
		}
		return ws[g.tmpls.Intn(len(ws))].WorkspaceID
	}
	var exporting []api.Transfer
	for _, tr := range transfers {
		if tr.State == api.TransferExporting {
			exporting = append(exporting, tr)
		}
	}
	var op string
	var args any
	switch x := g.tmpls.Intn(10); {
	case len(exporting) > 0:
		// Answer soon: an export holds its Workspace's starts and deletes.
		tr := exporting[g.tmpls.Intn(len(exporting))]
		a := TransferResultArgs{TransferID: tr.TransferID, NodeID: tr.NodeID, Outcome: OutcomeOK, Digest: testDigest('a'), SizeBytes: 1 << 20}
		if g.tmplPct(30) {
			a.Outcome, a.Digest, a.SizeBytes, a.Error = OutcomeFailed, "", 0, "boom"
		}
		op, args = OpTransferResult, a
		if g.tmplPct(50) {
			total := int64(1+g.tmpls.Intn(8)) << 20
			op, args = OpTransferProgress, TransferProgressArgs{TransferID: tr.TransferID, NodeID: tr.NodeID, TransferProgress: api.TransferProgress{DoneBytes: total / 2, TotalBytes: total}}
		}
	case x < 5 || len(transfers) == 0:
		id := pick(stopped)
		if g.tmplPct(20) {
			id = pick(all)
		}
		op, args = OpTransferExport, TransferExportArgs{WorkspaceID: id, Namespace: []string{"default", "default", "Bad"}[g.tmpls.Intn(3)]}
	default:
		op, args = OpTransferDelete, ObjectArgs{Name: transfers[g.tmpls.Intn(len(transfers))].TransferID}
	}
	e := makeEntry(g.now, op, args)
	e.Actor, e.CommandID = "op", fmt.Sprintf("tr-cmd-%d", g.tmpls.Intn(1<<30))
	return e
}

// nodeID draws a node id from a handful that slides as the log goes on:
// retirement is terminal, so later parts of the log need fresh ids.
func (g *logGen) nodeID() string {
	switch {
	case g.pct(3):
		return []string{"bad id", "", "-x"}[g.r.Intn(3)]
	case g.pct(12):
		return ctrlID
	default:
		return fmt.Sprintf("node-%02d", g.seq/300+g.r.Intn(5))
	}
}

// liveNode picks a node with a live session (reading the reference FSM), or
// any node id when there is none.
func (g *logGen) liveNode() string {
	var ids []string
	g.ref.View(func(tx *bolt.Tx) error {
		m, _ := LiveSessions(tx)
		for id := range m {
			ids = append(ids, id)
		}
		return nil
	})
	if len(ids) == 0 {
		return g.nodeID()
	}
	sort.Strings(ids) // the log must depend on the seed only
	return ids[g.r.Intn(len(ids))]
}

// pendingNode picks a node id with a grant that is still pending.
func (g *logGen) pendingNode() string {
	var ids []string
	g.ref.View(func(tx *bolt.Tx) error {
		gs, _ := ListGrants(tx, g.now)
		for _, gr := range gs {
			if gr.State == api.GrantPending {
				ids = append(ids, gr.NodeID)
			}
		}
		return nil
	})
	if len(ids) == 0 {
		return g.nodeID()
	}
	return ids[g.r.Intn(len(ids))]
}

func (g *logGen) roles() []string {
	switch g.r.Intn(10) {
	case 0:
		return nil
	case 1:
		return []string{"admin"}
	case 2:
		return []string{"node", "node"}
	case 3, 4:
		return []string{"ctrl", "node"}
	case 5:
		return []string{"ctrl"}
	default:
		return []string{"node"}
	}
}

func (g *logGen) secret(id string) string {
	if g.pct(15) {
		return "wrong-" + id
	}
	return secretOf(id)
}

func (g *logGen) nodeVersion(id string) uint64 {
	var v uint64
	g.ref.View(func(tx *bolt.Tx) error {
		if n, err := GetNode(tx, id); err == nil {
			v = n.RegistrationVersion
		}
		return nil
	})
	return v
}

func (g *logGen) defaultVersion() uint64 {
	var v uint64
	g.ref.View(func(tx *bolt.Tx) error {
		d, _ := GetOvercommitDefault(tx)
		v = d.Version
		return nil
	})
	return v
}

// expected draws an expected version: none, the current one, or a wrong one.
func (g *logGen) expected(cur uint64) *uint64 {
	var v uint64
	switch n := g.r.Intn(10); {
	case n < 4:
		return nil
	case n < 8:
		v = cur
	case n == 8:
		v = cur + 1
	default:
		v = uint64(g.r.Intn(4))
		if cur > 0 && g.pct(50) {
			v = cur - 1
		}
	}
	return &v
}

// session draws a session id: usually the node's live one, else one opened
// earlier or a made-up one.
func (g *logGen) session(id string) string {
	if g.pct(65) {
		var live string
		g.ref.View(func(tx *bolt.Tx) error {
			m, _ := LiveSessions(tx)
			live = m[id]
			return nil
		})
		if live != "" {
			return live
		}
	}
	ss := g.sessions[id]
	if len(ss) == 0 || g.pct(20) {
		return fmt.Sprintf("s-%d", g.r.Intn(1000))
	}
	if g.pct(80) {
		return ss[len(ss)-1]
	}
	return ss[g.r.Intn(len(ss))]
}

func (g *logGen) incarnation(id string) uint64 {
	cur := g.inc[id]
	switch g.r.Intn(10) {
	case 0, 1, 2:
		cur++
	case 3:
		if cur > 0 {
			return cur - 1
		}
	case 4:
		return uint64(g.r.Intn(5))
	}
	g.inc[id] = cur
	return cur
}

func (g *logGen) multiplier() api.Milli {
	ms := []api.Milli{0, 1, 500, 900, 1000, 1000, 1500, 2500, 4000, 16000, 16001, -1000, 20000, -1}
	return ms[g.r.Intn(len(ms))]
}

func (g *logGen) change() *MultiplierChange {
	switch g.r.Intn(4) {
	case 0:
		return nil
	case 1:
		return &MultiplierChange{Default: true}
	default:
		return &MultiplierChange{Value: g.multiplier()}
	}
}

func (g *logGen) report(id string) api.Report {
	r := api.Report{
		Capacity:       api.Resources{CPU: api.Milli(1000 * (1 + g.r.Intn(64))), MemoryBytes: uint64(1+g.r.Intn(256)) << 30},
		Allocated:      api.Resources{CPU: api.Milli(g.r.Intn(8000)), MemoryBytes: uint64(g.r.Intn(1 << 20))},
		Instances:      g.r.Intn(3) * g.r.Intn(2),
		Volumes:        g.r.Intn(2) * g.r.Intn(2),
		RetainedLayers: g.r.Intn(2) * g.r.Intn(2) * g.r.Intn(2),
	}
	if g.pct(85) {
		r.Pools = []api.Pool{{PoolID: DefaultPool, Path: "/srv/p", Available: g.pct(90)}}
		// Now and then a shared pool too, declared one way or the other.
		if g.poolPct(30) {
			r.Pools = append(r.Pools, api.Pool{PoolID: "shared-nfs", Path: "/srv/nfs", Available: g.poolPct(90), Shared: g.poolPct(85)})
		}
	}
	if g.volPct(70) {
		r.Resume = &api.ResumeInfo{QEMUVersion: []string{"7.2.9", "7.2.9", "8.0.0"}[g.vols.Intn(3)], Accel: "tcg", CPUModel: "max", Installations: []string{"sha256-a"}}
	}
	if g.tmplPct(40) {
		r.TemplateDigests = []string{g.tmplDigest()}
	}
	if g.pct(90) {
		r.Templates = testTemplates
		if g.poolPct(80) {
			r.TemplateBytes = map[string]uint64{"kibotos-coding": uint64(1+g.pools.Intn(8)) << 30}
		}
	}
	// Now and then an Instance of this node (or another) ended on its own.
	if ws := g.workspaces(); len(ws) > 0 && g.pct(15) {
		w := ws[g.r.Intn(len(ws))]
		inst := w.InstanceID
		if inst == "" || g.pct(20) {
			inst = instanceIDFor(w.WorkspaceID, uint64(g.r.Intn(3)))
		}
		r.InstanceStates = []api.InstanceState{{InstanceID: inst, State: []string{"FAILED", "FAILED", "RUNNING"}[g.r.Intn(3)], Error: "ended"}}
	}
	return r
}

// endedRecords adds ended-Instance records to a report now and then: of
// the Workspaces' latest or earlier Instances and of made-up ones, in the
// form of the levels before rounds or as a round (due or not, complete or
// not).
func (g *logGen) endedRecords(a *ReportArgs) {
	if !g.pct(30) {
		return
	}
	a.Rounds, a.Round = g.pct(70), g.pct(60)
	a.Report.EndedComplete = a.Round && g.pct(70)
	ws := g.workspaces()
	for range g.r.Intn(4) {
		inst := fmt.Sprintf("inst-made-up-%d", g.r.Intn(3))
		if len(ws) > 0 && g.pct(80) {
			w := ws[g.r.Intn(len(ws))]
			inst = instanceIDFor(w.WorkspaceID, w.Instances-uint64(g.r.Intn(2)))
		}
		a.Report.Ended = append(a.Report.Ended, api.EndedInstance{InstanceID: inst, EndedAt: g.now.Add(-time.Second), How: "stopped"})
	}
}

// networkPolicy draws a policy, valid more often than not: rules that
// normalize (an address, host bits, a duplicate), and now and then a bad
// CIDR or domain, an unknown Egress or lists without public egress.
func (g *logGen) networkPolicy() api.NetworkPolicy {
	rules := []string{"10.0.0.0/8", "10.1.2.3", "192.168.7.1/16", "2001:db8::1/32", "10.0.0.0/8", "0.0.0.0/0", "*.Example.com", "pypi.org."}
	bad := []string{"10.0.0.300", "*.com", "fe80::1%eth0", "", "10.0.0.0/33"}
	pick := func() []string {
		var out []string
		for i := g.r.Intn(4); i > 0; i-- {
			if g.pct(8) {
				out = append(out, bad[g.r.Intn(len(bad))])
			} else {
				out = append(out, rules[g.r.Intn(len(rules))])
			}
		}
		return out
	}
	p := api.NetworkPolicy{Egress: []string{"", api.EgressNone, api.EgressPublic, api.EgressPublic, api.EgressPublic}[g.r.Intn(5)]}
	switch {
	case g.pct(30):
		p.Egress = egressNames[g.r.Intn(len(egressNames))]
	case g.pct(3):
		p.Egress = "Bad Egress"
	}
	if g.pct(20) {
		p.Resolver = resolverNames[g.r.Intn(len(resolverNames))]
	}
	if p.Egress == api.EgressPublic || g.pct(10) {
		p.Allow, p.Deny = pick(), pick()
	}
	return p
}

// Names of the Egress and Resolver objects the logs create, use and
// delete; the last of each is never created.
var (
	egressNames   = []string{"corp", "edge", "never"}
	resolverNames = []string{"corp-dns", "dns2", "never-dns"}
)

// drawObject draws a write of an Egress or Resolver object, now and then
// with a bad name or address, credentials of one side only, or a stale
// expected version.
func (g *logGen) drawObject(mk func(string, any, *uint64) Entry) Entry {
	egress := egressNames[g.r.Intn(len(egressNames)-1)]
	resolver := resolverNames[g.r.Intn(len(resolverNames)-1)]
	switch {
	case g.pct(3):
		egress, resolver = []string{"none", "Bad", ""}[g.r.Intn(3)], "default"
	case g.pct(3):
		egress, resolver = egressNames[len(egressNames)-1], resolverNames[len(resolverNames)-1]
	}
	socks5 := []string{"proxy.corp.example:1080", "192.0.2.10:1080", "[2001:db8::10]:1080", "PROXY:1080", "proxy", "0.0.0.0:1"}[g.r.Intn(6)]
	var version uint64
	var rversion uint64
	g.ref.View(func(tx *bolt.Tx) error {
		if e, err := GetEgress(tx, egress); err == nil {
			version = e.Version
		}
		if r, err := GetResolver(tx, resolver); err == nil {
			rversion = r.Version
		}
		return nil
	})
	switch x := g.r.Intn(20); {
	case x < 5:
		a := EgressCreateArgs{Name: egress, SOCKS5: socks5}
		if g.pct(60) {
			a.Username, a.Password = "user", fmt.Sprintf("pw-%d", g.r.Intn(3))
		}
		if g.pct(5) {
			a.Password = ""
		}
		return mk(OpEgressCreate, a, nil)
	case x < 11:
		a := EgressUpdateArgs{Name: egress}
		if g.pct(50) {
			a.SOCKS5 = &socks5
		}
		if g.pct(40) {
			pw := fmt.Sprintf("pw-%d", g.r.Intn(3))
			a.Password = &pw
		}
		if g.pct(15) {
			u := []string{"user", "other", ""}[g.r.Intn(3)]
			a.Username = &u
		}
		a.ClearCredentials = g.pct(10)
		return mk(OpEgressUpdate, a, g.expected(version))
	case x < 13:
		return mk(OpEgressDelete, ObjectArgs{Name: egress}, g.expected(version))
	case x < 18:
		ups := []string{"192.0.2.53", "dns.corp.example:5353", "[2001:db8::53]", "10.0.0.300", "192.0.2.53:53"}
		a := ResolverCreateArgs{Name: resolver}
		for i := g.r.Intn(4); i >= 0; i-- {
			a.Upstreams = append(a.Upstreams, ups[g.r.Intn(len(ups))])
		}
		return mk(OpResolverCreate, a, nil)
	default:
		return mk(OpResolverDelete, ObjectArgs{Name: resolver}, g.expected(rversion))
	}
}

// networkChange draws a set-network: some items of a drawn policy.
func (g *logGen) networkChange() api.NetworkChange {
	p := g.networkPolicy()
	var c api.NetworkChange
	if g.pct(80) {
		c.Egress = &p.Egress
	}
	if g.pct(10) {
		c.Resolver = &p.Resolver
	}
	if g.pct(60) {
		c.Allow = &p.Allow
	}
	if g.pct(40) {
		c.Deny = &p.Deny
	}
	return c
}
