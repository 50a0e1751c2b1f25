package fsm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
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
	return &logGen{r: rand.New(rand.NewSource(seed)), pools: rand.New(rand.NewSource(seed + 1)), vols: rand.New(rand.NewSource(seed + 2)), tmpls: rand.New(rand.NewSource(seed + 3)), volWeight: 12, ref: ref, now: t0, sessions: map[string][]string{}, inc: map[string]uint64{}}
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
	return out
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

// workspaces lists every Workspace of the reference FSM, by id.
func (g *logGen) workspaces() []api.Workspace {
	var out []api.Workspace
	g.ref.View(func(tx *bolt.Tx) error {
		if l, err := ListWorkspaces(tx, WorkspaceFilter{All: true}, 0, ""); err == nil {
			out = l.Workspaces
		}
		return nil
	})
	return out
}

// workspace picks a Workspace of the reference FSM (pending ones more
// often when pending), or a made-up id with version 0.
func (g *logGen) workspace(pending bool) api.Workspace {
	ws := g.workspaces()
	if pending && g.pct(85) {
		var p []api.Workspace
		for _, w := range ws {
			if w.Pending != nil {
				p = append(p, w)
			}
		}
		if len(p) > 0 {
			return p[g.r.Intn(len(p))]
		}
	}
	if len(ws) == 0 || g.pct(8) {
		return api.Workspace{WorkspaceID: WorkspaceIDFor(fmt.Sprintf("ws-cmd-%d", g.r.Intn(g.seq+1)))}
	}
	return ws[g.r.Intn(len(ws))]
}

func (g *logGen) drawWorkspace(mk func(string, any, *uint64) Entry) Entry {
	switch n := g.r.Intn(20); {
	case n < 5 || n == 19 && g.poolPct(70):
		// Steer towards a schedulable node: a live node that has not
		// acknowledged its overcommit values or reported the default pool
		// gets that first, so that creates are placed now and then.
		if id := g.liveNode(); g.pct(60) {
			var node *api.Node
			g.ref.View(func(tx *bolt.Tx) error { node, _ = GetNode(tx, id); return nil })
			if node != nil && node.Session != nil && node.Session.Alive {
				if node.DrainRequested && g.pct(50) {
					return mk(OpNodeCancelDrain, NodeArgs{NodeID: id}, nil)
				}
				if !node.Overcommit.Acknowledged {
					return mk(OpOvercommitAck, OvercommitAckArgs{NodeID: id, SessionID: node.Session.SessionID,
						Values: api.Multipliers{CPU: node.Overcommit.CPU, Memory: node.Overcommit.Memory}}, nil)
				}
				if node.Report == nil || len(node.Report.Pools) == 0 || !node.Report.Pools[0].Available || node.Session.Clock != nil && node.Session.Clock.Over {
					rep := g.report(id)
					rep.Pools = []api.Pool{{PoolID: DefaultPool, Path: "/srv/p", Available: true}}
					return mk(OpNodeReport, ReportArgs{NodeID: id, SessionID: node.Session.SessionID, Report: rep,
						Clock: &ClockArgs{KernelSync: "synchronized"}}, nil)
				}
				var p *api.StoragePool
				g.ref.View(func(tx *bolt.Tx) error { p, _ = GetStoragePool(tx, api.PrivatePoolID(id)); return nil })
				if p != nil && (p.CapacityBytes == nil || *p.AvailableBytes < 8<<30) {
					return mk(OpPoolSetCapacity, PoolCapacityArgs{PoolID: p.PoolID, CapacityBytes: p.UsedBytes + uint64(256+g.r.Intn(1024))<<30}, nil)
				}
			}
		}
		a := WorkspaceCreateArgs{Template: "kibotos-coding", CPU: api.Milli(1000 * (1 + g.r.Intn(4))), MemoryBytes: uint64(64+g.r.Intn(4096)) << 20}
		switch g.r.Intn(25) {
		case 0:
			a.Template = "Bad Template"
		case 1:
			a.CPU = 1500
		case 2:
			a.MemoryBytes = 1 << 20
		case 3:
			a.Labels = map[string]string{"-bad": "x", "bad-": "y"}
		}
		if g.pct(30) {
			a.Labels = map[string]string{"team": []string{"x", "y"}[g.r.Intn(2)]}
		}
		if g.pct(20) {
			a.NodeID = g.liveNode()
		}
		if g.pct(50) {
			p := g.networkPolicy()
			a.Network = &p
		}
		g.drawMounts(&a)
		e := mk(OpWorkspaceCreate, a, nil)
		if g.pct(95) {
			e.CommandID = fmt.Sprintf("ws-cmd-%d", g.seq)
		}
		return e
	case n < 8:
		w := g.workspace(false)
		a := WorkspaceArgs{WorkspaceID: w.WorkspaceID}
		if g.pct(15) {
			a.NodeID = g.nodeID()
		}
		return mk(OpWorkspaceStart, a, g.expected(w.Version))
	case n < 10:
		w := g.workspace(false)
		return mk(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID, Force: g.pct(30)}, g.expected(w.Version))
	case n < 11:
		w := g.workspace(false)
		return mk(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID}, g.expected(w.Version))
	case n < 13:
		// Mostly running ones: the change that goes through the node.
		w := g.workspace(false)
		if g.pct(75) {
			for _, c := range g.workspaces() {
				if c.State == api.WorkspaceAvailable && c.Pending == nil {
					w = c
					break
				}
			}
		}
		c := g.networkChange()
		for i := 0; i < 3 && (c.Egress == nil || *c.Egress == w.Network.Effective().Egress); i++ {
			c = g.networkChange() // mostly a change, not the policy it has
		}
		if g.pct(30) {
			// Through an Egress object (a new revision when it has one).
			name := egressNames[g.r.Intn(len(egressNames))]
			c = api.NetworkChange{Egress: &name, Allow: &[]string{}, Deny: &[]string{}}
		}
		return mk(OpWorkspaceSetNetwork, WorkspaceNetworkArgs{WorkspaceID: w.WorkspaceID, NetworkChange: c}, g.expected(w.Version))
	default:
		w := g.workspace(true)
		a := WorkspaceResultArgs{WorkspaceID: w.WorkspaceID, Outcome: OutcomeOK}
		if w.Pending != nil {
			a.NodeID, a.CommandID = w.Pending.NodeID, w.Pending.CommandID
		} else {
			a.NodeID, a.CommandID = g.nodeID(), fmt.Sprintf("%s/%d", w.WorkspaceID, g.r.Intn(5))
		}
		if g.pct(5) {
			a.CommandID = fmt.Sprintf("%s/%d", w.WorkspaceID, g.r.Intn(5))
		}
		a.SessionID = g.session(a.NodeID)
		switch x := g.r.Intn(10); {
		case x < 2:
			a.Outcome, a.Error = OutcomeRefused, "memory tight"
			// A leader from LevelRefusalExhausted on, or an older one;
			// drawn from nothing, so the rest of the log stays as it was.
			// (Not in step with CountPlacements, which is g.seq%2.)
			a.RefusalExhausts = g.seq/2%2 == 0
		case x < 4:
			a.Outcome, a.Error = OutcomeFailed, "boom"
		}
		if a.Outcome == OutcomeOK && g.tmplPct(50) {
			a.Platform = platformID("abc"[g.tmpls.Intn(3)])
		}
		if w.Pending != nil && (w.Pending.Kind == api.WSCmdPause || w.Snapshot != nil) {
			// Pause and resume answers, from the Volume source.
			switch y := g.vols.Intn(10); {
			case y < 6:
				a.Snapshot = &api.SnapshotReport{SizeBytes: uint64(1+g.vols.Intn(4)) << 28, Compat: api.SnapshotCompat{InstallationID: "sha256-a",
					QEMUVersion: "7.2.9", Accel: "tcg", CPUModel: "max", MemoryMiB: 256, VCPUs: 1, Devices: []string{"layer", "net"}}}
			case y < 8:
				a.InstanceGone = true
			default:
				a.SnapshotDiscarded = true
			}
		}
		return mk(OpWorkspaceResult, a, nil)
	}
}

// next draws one entry at the generator's clock.
func (g *logGen) next() Entry {
	if g.tmplPct(3) {
		// Between the other entries, drawing nothing from their source,
		// so they stay what they were.
		return g.drawTemplate()
	}

	g.seq++
	switch {
	case g.pct(3):
		g.now = g.now.Add(time.Duration(1+g.r.Intn(4)) * time.Hour)
	default:
		g.now = g.now.Add(time.Duration(g.r.Intn(90_000)) * time.Millisecond)
	}

	// Reuse a command id: the same inputs (a retry) or different ones.
	if len(g.withID) > 0 && g.pct(10) {
		old := g.withID[g.r.Intn(len(g.withID))]
		if g.pct(70) {
			e := old
			e.IssuedAt = g.now
			e.Actor = fmt.Sprintf("retry-%d", g.r.Intn(3))
			return e
		}
		e := g.draw()
		e.CommandID = old.CommandID
		return e
	}
	e := g.draw()
	if g.pct(25) {
		e.CommandID = fmt.Sprintf("cmd-%d", g.seq)
	}
	if e.CommandID != "" {
		// Every other command as a leader of LevelCommandLog writes it
		// (without drawing: the logs of every seed stay as they were); a
		// retry with other inputs draws a new entry without the flags,
		// so the layouts meet.
		if g.seq%2 == 0 {
			e.CommandDigest, e.CommandLog = true, true
		}
		g.withID = append(g.withID, e)
	}
	return e
}

func (g *logGen) draw() Entry {
	mk := func(op string, args any, v *uint64) Entry {
		e := makeEntry(g.now, op, args)
		e.ExpectedVersion = v
		e.Actor = "op"
		// Every other placing entry counts its placements (without
		// drawing: the logs of every seed stay as they were).
		e.CountPlacements = CountsPlacements(op) && g.seq%2 == 0
		return e
	}
	if g.seq == 1 && g.pct(90) {
		return mk(OpBootstrap, BootstrapArgs{ClusterID: "cluster-1", NodeID: ctrlID, Roles: []string{"ctrl", "node"}, Address: "10.0.0.1:7000"}, nil)
	}
	if g.pct(30) {
		return g.drawWorkspace(mk)
	}
	if g.pct(6) {
		return g.drawObject(mk)
	}
	if g.poolPct(4) {
		return g.drawPool(mk)
	}
	if g.volPct(g.volWeight) {
		return g.drawVolume(mk)
	}
	if g.volPct(4) {
		w := g.workspace(false)
		if g.volPct(80) {
			for _, c := range g.workspaces() {
				if c.State == api.WorkspaceAvailable && c.Pending == nil {
					w = c
					break
				}
			}
		}
		return mk(OpWorkspacePause, WorkspaceArgs{WorkspaceID: w.WorkspaceID}, g.expected(w.Version))
	}
	if g.volPct(2) {
		// A member's feature level, as the leader records it.
		e := mk(OpMemberLevel, MemberLevelArgs{NodeID: []string{ctrlID, "node-01", "bad id"}[g.vols.Intn(3)], Level: g.vols.Intn(4), Release: "v0.2.0"}, nil)
		e.IgnoreUnknown = true
		return e
	}
	id := g.nodeID()
	switch w := g.r.Intn(100); {
	case w < 2:
		cluster := "cluster-x"
		if g.pct(30) {
			cluster = ""
		}
		return mk(OpBootstrap, BootstrapArgs{ClusterID: cluster, NodeID: id, Roles: g.roles(), Address: "a"}, nil)
	case w < 10:
		ttl := time.Duration(g.r.Intn(3*3600)) * time.Second
		if g.pct(10) {
			ttl = -ttl
		}
		return mk(OpEnrollmentGrant, GrantArgs{NodeID: id, Roles: g.roles(), SecretHash: g.secret(id), TTL: ttl}, nil)
	case w < 18:
		if g.pct(60) {
			id = g.pendingNode()
		}
		return mk(OpEnrollmentConsume, ConsumeArgs{NodeID: id, SecretHash: g.secret(id), Address: fmt.Sprintf("10.0.1.%d:7000", g.r.Intn(4))}, nil)
	case w < 20:
		return mk(OpEnrollmentRevoke, NodeArgs{NodeID: id}, nil)
	case w < 35:
		sess := fmt.Sprintf("s-%d-%d", g.seq, g.r.Intn(1000))
		g.sessions[id] = append(g.sessions[id], sess)
		addr := ""
		if g.pct(30) {
			addr = fmt.Sprintf("10.0.2.%d:7000", g.r.Intn(4))
		}
		return mk(OpSessionOpen, SessionOpenArgs{NodeID: id, SessionID: sess, Incarnation: g.incarnation(id), Release: "v0.2." + fmt.Sprint(g.r.Intn(3)), Revision: "r", Address: addr}, nil)
	case w < 41:
		if g.pct(50) {
			id = g.liveNode()
		}
		return mk(OpSessionClose, SessionCloseArgs{NodeID: id, SessionID: g.session(id), Reason: "lost"}, nil)
	case w < 58:
		if g.pct(70) {
			id = g.liveNode()
		}
		a := ReportArgs{NodeID: id, SessionID: g.session(id), Report: g.report(id)}
		if g.pct(30) {
			idle := float64(g.r.Intn(100)) / 100
			a.HostUsage = &api.HostUsage{SampledAt: g.now, CPUIdle: &idle}
		}
		if g.pct(40) {
			a.Clock = &ClockArgs{OffsetNS: int64(g.r.Intn(80)-40) * int64(time.Second), UncertaintyNS: int64(g.r.Intn(2000)) * int64(time.Millisecond), KernelSync: "synchronized"}
		}
		g.endedRecords(&a)
		return mk(OpNodeReport, a, nil)
	case w < 65:
		return mk(OpNodeDrain, NodeArgs{NodeID: id}, g.expected(g.nodeVersion(id)))
	case w < 69:
		return mk(OpNodeCancelDrain, NodeArgs{NodeID: id}, g.expected(g.nodeVersion(id)))
	case w < 74:
		return mk(OpNodeIsolate, NodeArgs{NodeID: id}, g.expected(g.nodeVersion(id)))
	case w < 76:
		return mk(OpNodeRetire, NodeArgs{NodeID: id}, g.expected(g.nodeVersion(id)))
	case w < 80:
		a := OvercommitDefaultArgs{}
		if g.pct(60) {
			m := g.multiplier()
			a.CPU = &m
		}
		if g.pct(60) {
			m := g.multiplier()
			a.Memory = &m
		}
		return mk(OpOvercommitSetDefault, a, g.expected(g.defaultVersion()))
	case w < 88:
		return mk(OpOvercommitSet, OvercommitSetArgs{NodeID: id, CPU: g.change(), Memory: g.change()}, g.expected(g.nodeVersion(id)))
	case w < 93:
		if g.pct(70) {
			id = g.liveNode()
		}
		vals := api.Multipliers{CPU: 1000, Memory: 1000}
		g.ref.View(func(tx *bolt.Tx) error {
			if n, err := GetNode(tx, id); err == nil && g.pct(70) {
				vals = api.Multipliers{CPU: n.Overcommit.CPU, Memory: n.Overcommit.Memory}
			}
			return nil
		})
		return mk(OpOvercommitAck, OvercommitAckArgs{NodeID: id, SessionID: g.session(id), Values: vals}, nil)
	case w < 95:
		return mk(OpCommandsExpire, CommandsExpireArgs{Before: g.now.Add(-time.Duration(g.r.Intn(6*3600)) * time.Second)}, nil)
	case w < 97:
		// Without IgnoreUnknown an unknown op halts the batch
		// (TestUnknownOpHalts); a replica of this release skips these.
		e := mk("node.teleport", NodeArgs{NodeID: id}, nil)
		e.IgnoreUnknown = true
		return e
	default:
		ops := allOps
		raws := []string{`{`, `[]`, `{"node_id":1}`, `null`, `{}`, `{"node_id":"node-a","cpu":"x"}`, `{"before":"yesterday"}`}
		return mk(ops[g.r.Intn(len(ops))], json.RawMessage(raws[g.r.Intn(len(raws))]), nil)
	}
}

// drawPool draws a storage-pool op: capacities (some out of range, some
// below what is used) and declare-lost, mostly of pools that still have
// members (refused), sometimes of one whose nodes are gone.
func (g *logGen) drawPool(mk func(string, any, *uint64) Entry) Entry {
	var pools []api.StoragePool
	g.ref.View(func(tx *bolt.Tx) error {
		if l, err := ListStoragePools(tx, 0, ""); err == nil {
			pools = l.Pools
		}
		return nil
	})
	id := "nowhere"
	var version uint64
	if len(pools) > 0 && g.poolPct(90) {
		p := pools[g.pools.Intn(len(pools))]
		id, version = p.PoolID, p.Version
	} else if g.poolPct(50) {
		id = "Bad Pool"
	}
	if g.poolPct(70) {
		// Mostly room for many layers, now and then too little or none.
		size := uint64(64+g.pools.Intn(1024)) << 30
		switch {
		case g.poolPct(5):
			size = uint64(g.pools.Intn(8)) << 30
		case g.poolPct(5):
			size = api.MaxPoolCapacity + 1
		}
		return mk(OpPoolSetCapacity, PoolCapacityArgs{PoolID: id, CapacityBytes: size}, g.expected(version))
	}
	return mk(OpPoolDeclareLost, PoolDeclareLostArgs{PoolID: id, ConfirmDataLost: g.poolPct(90)}, g.expected(version))
}

// volumes lists every Volume of the reference FSM, by id.
func (g *logGen) volumes() []api.Volume {
	var out []api.Volume
	g.ref.View(func(tx *bolt.Tx) error {
		if l, err := ListVolumes(tx, VolumeFilter{}, 0, ""); err == nil {
			out = l.Volumes
		}
		return nil
	})
	return out
}

// volume picks a Volume of the reference FSM (one with a pending command
// when asked and there is one), or a made-up name.
func (g *logGen) volume(pending bool) api.Volume {
	vs := g.volumes()
	if pending {
		var p []api.Volume
		for _, v := range vs {
			if v.Pending != nil {
				p = append(p, v)
			}
		}
		if len(p) > 0 && g.volPct(90) {
			return p[g.vols.Intn(len(p))]
		}
	}
	if len(vs) == 0 || g.volPct(5) {
		return api.Volume{Name: []string{"ghost", "Bad Name", "vol-" + strings.Repeat("a", 26)}[g.vols.Intn(3)]}
	}
	return vs[g.vols.Intn(len(vs))]
}

var volumeNames = []string{"data", "logs", "scratch", "cache"}

// drawMounts now and then gives a create an existing Volume to attach
// (free ones mostly) and a new one to make along, with paths that are
// sometimes bad or overlapping.
func (g *logGen) drawMounts(a *WorkspaceCreateArgs) {
	paths := []string{"/data", "/srv/logs", "/data/sub", "/proc/x", "relative"}
	path := func() string {
		if g.volPct(90) {
			return paths[g.vols.Intn(2)]
		}
		return paths[2+g.vols.Intn(3)]
	}
	if g.volPct(g.volWeight * 2) {
		var free []api.Volume
		for _, v := range g.volumes() {
			if v.WorkspaceID == "" && v.State == api.VolumeAvailable {
				free = append(free, v)
			}
		}
		ref := g.volume(false).Name
		if len(free) > 0 && g.volPct(80) {
			ref = free[g.vols.Intn(len(free))].Name
		}
		a.Volumes = []api.VolumeAttach{{Volume: ref, Path: path()}}
	}
	if g.volPct(g.volWeight * 3 / 2) {
		size := uint64(1+g.vols.Intn(4)) << 30
		if g.volPct(5) {
			size = 1000
		}
		p := path()
		for _, v := range a.Volumes {
			if v.Path == p && g.volPct(90) {
				p = "/srv/new"
			}
		}
		a.NewVolumes = []api.NewVolume{{SizeBytes: size, Path: p}}
	}
}

// drawVolume draws a Volume op: creates in a node's private pool, the
// shared pool or nowhere; resizes up, down and to bad sizes; deletes;
// node answers to pending commands.
func (g *logGen) drawVolume(mk func(string, any, *uint64) Entry) Entry {
	switch x := g.vols.Intn(20); {
	case x < 6:
		a := VolumeCreateArgs{Name: volumeNames[g.vols.Intn(len(volumeNames))], SizeBytes: uint64(1+g.vols.Intn(8)) << 30}
		switch y := g.vols.Intn(10); {
		case y < 3:
			a.PoolID = "shared-nfs"
		case y < 6:
			a.NodeID = g.liveNode()
		case y == 6:
			a.PoolID = []string{"nowhere", "Bad Pool"}[g.vols.Intn(2)]
		case y == 7:
			a.Name = "Bad Name"
		case y == 8:
			a.SizeBytes = uint64(g.vols.Intn(3)) << 19
		}
		e := mk(OpVolumeCreate, a, nil)
		e.CommandID = fmt.Sprintf("vol-cmd-%d", g.vols.Intn(g.seq+1))
		return e
	case x < 10:
		v := g.volume(false)
		size := v.SizeBytes + uint64(1+g.vols.Intn(4))<<30
		switch y := g.vols.Intn(10); {
		case y == 0:
			size = v.SizeBytes / 2
		case y == 1:
			size = v.SizeBytes + 1
		case y == 2:
			size = v.SizeBytes
		}
		return mk(OpVolumeResize, VolumeResizeArgs{Volume: v.Name, SizeBytes: size}, g.expected(v.Version))
	case x < 13:
		v := g.volume(false)
		return mk(OpVolumeDelete, VolumeArgs{Volume: v.Name}, g.expected(v.Version))
	default:
		v := g.volume(true)
		a := VolumeResultArgs{VolumeID: v.VolumeID, Outcome: OutcomeOK}
		if v.Pending != nil {
			a.NodeID, a.CommandID = v.Pending.NodeID, v.Pending.CommandID
		} else {
			a.NodeID, a.CommandID = g.nodeID(), fmt.Sprintf("%s/%d", v.VolumeID, g.vols.Intn(5))
		}
		if a.VolumeID == "" {
			a.VolumeID = "not-a-volume"
		}
		a.SessionID = g.session(a.NodeID)
		switch y := g.vols.Intn(10); {
		case y < 2:
			a.Outcome, a.Error = OutcomeFailed, "disk full"
		case y < 4:
			a.FilesystemPending, a.Error = true, "guest did not answer"
		}
		return mk(OpVolumeResult, a, nil)
	}
}

// applyInBatches applies log in random batch sizes (1..64) drawn from r.
func applyInBatches(r *rand.Rand, f *FSM, log []Entry) []Result {
	return applyBatches(r, f, log, false)
}

// applyBatches applies log in random batches; uncached drops the
// placement cache's candidate list before each, as if every batch ran on
// a freshly started replica.
func applyBatches(r *rand.Rand, f *FSM, log []Entry, uncached bool) []Result {
	var out []Result
	for len(log) > 0 {
		n := 1 + r.Intn(64)
		if n > len(log) {
			n = len(log)
		}
		if uncached {
			f.cache.invalidate()
		}
		out = append(out, f.Apply(log[:n])...)
		log = log[n:]
	}
	return out
}

func mustDump(t testing.TB, f *FSM) string {
	t.Helper()
	b, err := f.Dump()
	if err != nil {
		t.Fatalf("dump: %v", err)
	}
	return string(b)
}

func resultJSON(r Result) string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func compareResults(t *testing.T, what string, log []Entry, got, want []Result) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d results, want %d", what, len(got), len(want))
	}
	bad := 0
	for i := range want {
		if g, w := resultJSON(got[i]), resultJSON(want[i]); g != w {
			t.Errorf("%s: entry %d (%s %s): result\n %s\nwant\n %s", what, i, log[i].Op, log[i].Args, g, w)
			if bad++; bad > 5 {
				t.FailNow()
			}
		}
	}
}

const propertyEntries = 2000

func TestPropertyReplicasAgree(t *testing.T) {
	// Seeds of 1000 and above draw Volume-heavy logs.
	seeds := []int64{1, 4, 3, 42, 1234, 99991, 1001, 1003}
	if testing.Short() {
		seeds = []int64{1, 4, 1003}
	}
	var mu sync.Mutex
	okByOp := map[string]int{}
	t.Run("seeds", func(t *testing.T) {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
				t.Parallel()
				a := openFSM(t)
				g := newLogGen(seed, a)
				if seed >= 1000 && seed < 1100 {
					g.volWeight = 35
				}
				mid := propertyEntries / 2
				snapAt := 0 // the log's length at the snapshot (answers add entries)
				var (
					log      []Entry
					resA     []Result
					snapshot bytes.Buffer
					chk      = newInvariantChecker(t)
				)
				for i := 0; i < propertyEntries; i++ {
					if i == mid {
						snapAt = len(log)
						if err := a.Snapshot(&snapshot); err != nil {
							t.Fatalf("snapshot: %v", err)
						}
					}
					for _, e := range g.nextWithAnswers() {
						before := withoutClock(mustDump(t, a))
						r := a.Apply([]Entry{e})[0]
						chk.check(i, e, r, before, a)
						log = append(log, e)
						resA = append(resA, r)
						if r.Error == nil && !r.Replayed && handlers[e.Op] != nil {
							mu.Lock()
							okByOp[e.Op]++
							mu.Unlock()
						}
					}
				}
				finalA := mustDump(t, a)
				chk.summary()
				checkSummarize(t, a)

				// B: the same log in random batches.
				b := openFSM(t)
				resB := applyInBatches(rand.New(rand.NewSource(seed*7+1)), b, log)
				compareResults(t, "batched replica", log, resB, resA)
				if d := mustDump(t, b); d != finalA {
					t.Fatalf("batched replica state differs:\n%s", diffLines(finalA, d))
				}

				// D: the same, its candidate list rebuilt for every batch:
				// what the cache keeps changes no decision.
				d := openFSM(t)
				resD := applyBatches(rand.New(rand.NewSource(seed*7+3)), d, log, true)
				compareResults(t, "replica without a kept candidate list", log, resD, resA)
				if dump := mustDump(t, d); dump != finalA {
					t.Fatalf("replica without a kept candidate list differs:\n%s", diffLines(finalA, dump))
				}

				// C: restored from A's snapshot at mid, then the rest of the log.
				c := openFSM(t)
				c.Apply([]Entry{makeEntry(t0, OpBootstrap, BootstrapArgs{ClusterID: "other", NodeID: "junk", Roles: []string{"node"}})})
				if err := c.Restore(bytes.NewReader(snapshot.Bytes())); err != nil {
					t.Fatalf("restore: %v", err)
				}
				resC := applyInBatches(rand.New(rand.NewSource(seed*7+2)), c, log[snapAt:])
				compareResults(t, "restored replica", log[snapAt:], resC, resA[snapAt:])
				if d := mustDump(t, c); d != finalA {
					t.Fatalf("restored replica state differs:\n%s", diffLines(finalA, d))
				}
			})
		}
	})
	t.Logf("successful applies by op over all seeds: %v", okByOp)
	if t.Failed() {
		return
	}
	for _, op := range allOps {
		if okByOp[op] == 0 {
			t.Errorf("the random logs never applied %s successfully: the generator no longer covers it", op)
		}
	}
}

// invariantChecker checks properties that hold after every entry.
type invariantChecker struct {
	t        *testing.T
	versions map[string]uint64 // last registration_version seen per node
	results  map[string]Result // first successful result per command id
	counts   map[string]int
	// last version seen per Workspace id
	wsVersions map[string]uint64
}

func newInvariantChecker(t *testing.T) *invariantChecker {
	return &invariantChecker{t: t, versions: map[string]uint64{}, results: map[string]Result{}, counts: map[string]int{}, wsVersions: map[string]uint64{}}
}

func (c *invariantChecker) check(i int, e Entry, r Result, before string, f *FSM) {
	t := c.t
	t.Helper()
	after := withoutClock(mustDump(t, f))
	changed := after != before
	switch {
	case r.Error != nil:
		c.counts["failed"]++
		if changed && (!e.CountPlacements || withoutPlacementCounts(after) != withoutPlacementCounts(before)) {
			t.Fatalf("entry %d %s %s failed with %v but changed the state (besides counting placements)", i, e.Op, e.Args, r.Error)
		}
		if r.Value != nil || r.Replayed {
			t.Fatalf("entry %d: failed result %+v", i, r)
		}
		if r.Error.Code == "" || r.Error.Message == "" {
			t.Fatalf("entry %d: error without code or message: %+v", i, r.Error)
		}
	case r.Replayed:
		c.counts["replayed"]++
		if changed {
			t.Fatalf("entry %d: replay of %s changed the state", i, e.CommandID)
		}
		if first, ok := c.results[e.CommandID]; !ok || !bytes.Equal(first.Value, r.Value) {
			t.Fatalf("entry %d: replay of %s gave %s, first result %s", i, e.CommandID, r.Value, first.Value)
		}
	default:
		c.counts["ok"]++
		if e.CommandID != "" && handlers[e.Op] != nil {
			c.results[e.CommandID] = r
		}
		if handlers[e.Op] == nil && (changed || !reflect.DeepEqual(r, Result{})) {
			t.Fatalf("entry %d: ignored unknown op gave %+v (changed %v)", i, r, changed)
		}
	}

	var nodes []api.Node
	f.View(func(tx *bolt.Tx) error {
		l, err := ListNodes(tx, 0, "")
		if err != nil {
			t.Fatalf("list nodes: %v", err)
		}
		nodes = l.Nodes
		return nil
	})
	seen := map[string]bool{}
	for _, n := range nodes {
		seen[n.NodeID] = true
		if err := ValidNodeID(n.NodeID); err != nil {
			t.Fatalf("entry %d: stored node with invalid id %q", i, n.NodeID)
		}
		if prev, ok := c.versions[n.NodeID]; ok && n.RegistrationVersion < prev {
			t.Fatalf("entry %d (%s): node %s registration_version went back from %d to %d", i, e.Op, n.NodeID, prev, n.RegistrationVersion)
		}
		c.versions[n.NodeID] = n.RegistrationVersion
		live := n.Session != nil && n.Session.Alive
		if (n.Retired || n.Isolated || n.Admission != api.Admitted) && live {
			t.Fatalf("entry %d: node %s is %s with a live session", i, n.NodeID, n.Status)
		}
		if n.Isolated && n.IsolatedIncarnation > n.LastIncarnation {
			t.Fatalf("entry %d: node %s isolated incarnation %d > last %d", i, n.NodeID, n.IsolatedIncarnation, n.LastIncarnation)
		}
		if n.Overcommit == nil || n.Overcommit.CPU < 0 || n.Overcommit.CPU > api.MaxMultiplier || n.Overcommit.Memory < 0 || n.Overcommit.Memory > api.MaxMultiplier {
			t.Fatalf("entry %d: node %s overcommit %+v", i, n.NodeID, n.Overcommit)
		}
		if (n.Report == nil) != (n.Schedulable == nil) {
			t.Fatalf("entry %d: node %s schedulable without report", i, n.NodeID)
		}
		// A session's check at every ping says what GetNode says.
		want := SessionCheck{Admitted: n.Admission == api.Admitted && !n.Retired, Overcommit: *n.Overcommit}
		if n.Session != nil {
			want.SessionID = n.Session.SessionID
		}
		var got SessionCheck
		f.View(func(tx *bolt.Tx) (err error) { got, err = GetSessionCheck(tx, n.NodeID); return })
		if got != want {
			t.Fatalf("entry %d: node %s session check %+v, GetNode says %+v", i, n.NodeID, got, want)
		}
	}
	for id := range c.versions {
		if !seen[id] {
			t.Fatalf("entry %d: node %s disappeared", i, id)
		}
	}
	c.checkWorkspaces(i, e, f, nodes)
	c.checkVolumes(i, e, f, nodes)
}

// checkVolumes checks the Volume records against their state machine.
func (c *invariantChecker) checkVolumes(i int, e Entry, f *FSM, nodes []api.Node) {
	t := c.t
	t.Helper()
	byID := map[string]api.Node{}
	for _, n := range nodes {
		byID[n.NodeID] = n
	}
	var vs []api.Volume
	f.View(func(tx *bolt.Tx) error {
		l, err := ListVolumes(tx, VolumeFilter{}, 0, "")
		if err != nil {
			t.Fatalf("list volumes: %v", err)
		}
		vs = l.Volumes
		return nil
	})
	for _, v := range vs {
		bad := func(why string) {
			t.Fatalf("entry %d (%s %s): volume %s %s: %s\n%+v\npending %+v expansion %+v", i, e.Op, e.Args, v.Name, v.State, why, v, v.Pending, v.Expansion)
		}
		if api.ValidVolumeName(v.Name) != nil && !strings.HasPrefix(v.Name, "ws-") {
			bad("invalid name")
		}
		if v.PoolID == "" && v.Made {
			bad("made without a pool")
		}
		if p := v.Pending; p != nil {
			if n, ok := byID[p.NodeID]; !ok || n.Retired || n.Isolated {
				bad("command pending on a node that can never answer")
			}
			want := map[string]string{api.VolCmdCreate: api.VolumeCreating, api.VolCmdResize: api.VolumeAvailable, api.VolCmdDelete: api.VolumeDeleting}[p.Kind]
			if v.State != want {
				bad("pending " + p.Kind + " in the wrong state")
			}
			if (p.Kind == api.VolCmdResize) != (v.Expansion != nil && !v.Expansion.FilesystemPending) {
				bad("a resize in progress without its expansion, or the other way round")
			}
		}
		switch v.State {
		case api.VolumeCreating:
			if v.Made || (v.Pending == nil && v.WorkspaceID == "" && v.PoolID == "") {
				bad("creating, yet made or nowhere to be made")
			}
		case api.VolumeDeleting:
			if (v.Pending == nil) == (v.DeleteWaitsForPool == "") || v.WorkspaceID != "" {
				bad("deleting without exactly one of a command and a wait, or attached")
			}
		case api.VolumeAvailable, api.VolumeFailed, api.VolumeLost:
			if v.State == api.VolumeLost && (v.Held || v.Pending != nil) {
				bad("lost yet held or waiting for a node")
			}
		default:
			bad("unknown state")
		}
		if v.SizeBytes < api.MinVolumeSize || v.SizeBytes > api.MaxVolumeSize || v.SizeBytes%api.VolumeSizeUnit != 0 {
			bad("size out of range")
		}
	}
}

// checkWorkspaces checks the Workspace records against their state machine
// and the node index against the records.
func (c *invariantChecker) checkWorkspaces(i int, e Entry, f *FSM, nodes []api.Node) {
	t := c.t
	t.Helper()
	byID := map[string]api.Node{}
	for _, n := range nodes {
		byID[n.NodeID] = n
	}
	var ws []api.Workspace
	f.View(func(tx *bolt.Tx) error {
		if err := indexProblem(tx); err != nil {
			t.Fatalf("entry %d (%s %s): %v", i, e.Op, e.Args, err)
		}
		l, err := ListWorkspaces(tx, WorkspaceFilter{All: true}, 0, "")
		if err != nil {
			t.Fatalf("list workspaces: %v", err)
		}
		ws = l.Workspaces
		return nil
	})
	// A deleted Workspace's id comes back when its create's command id is
	// used again after the record expired: versions restart then.
	present := map[string]bool{}
	for _, w := range ws {
		present[w.WorkspaceID] = true
	}
	for id := range c.wsVersions {
		if !present[id] {
			delete(c.wsVersions, id)
		}
	}
	for _, w := range ws {
		bad := func(why string) {
			t.Fatalf("entry %d (%s %s): workspace %s %s: %s\n%+v\nlayer %+v pending %+v", i, e.Op, e.Args, w.WorkspaceID, w.State, why, w, w.Layer, w.Pending)
		}
		if prev, ok := c.wsVersions[w.WorkspaceID]; ok && w.Version < prev {
			bad("version went back")
		}
		c.wsVersions[w.WorkspaceID] = w.Version
		running := w.InstanceID != ""
		if running != (w.NodeID != "") {
			bad("node and instance not set together")
		}
		if running && w.InstanceID != instanceIDFor(w.WorkspaceID, w.Instances) {
			bad("instance id is not the latest execution's")
		}
		held := w.Layer != nil && w.Layer.Held
		if running && (!held || w.Layer.NodeID != w.NodeID) {
			bad("an execution without its layer held on its node")
		}
		if !running && held {
			bad("layer held without an execution")
		}
		wantKind := map[string][]string{
			api.WorkspaceCreating: {api.WSCmdStart}, api.WorkspaceStarting: {api.WSCmdStart},
			api.WorkspaceStopping: {api.WSCmdStop, api.WSCmdStopForce}, api.WorkspaceDeleting: {api.WSCmdDelete},
			api.WorkspacePausing: {api.WSCmdPause},
		}[w.State]
		if s := w.Snapshot; s != nil {
			if w.Layer == nil || s.PoolID != api.LayerPoolID(w.Layer) || s.Compat.Check() != nil {
				bad("a snapshot away from its layer, or without its compatibility")
			}
			if (w.State == api.WorkspaceAvailable || w.State == api.WorkspacePausing || w.State == api.WorkspaceCreating) || (w.State == api.WorkspacePaused && s.Discarded) {
				bad("a snapshot in a state that has none, or a PAUSED one discarded")
			}
		} else if w.State == api.WorkspacePaused {
			bad("PAUSED without a snapshot")
		}
		switch {
		case w.State == api.WorkspaceAvailable && w.Pending != nil:
			// A running Workspace waits only for a policy change, which
			// leaves its state as it is.
			if w.Pending.Kind != api.WSCmdNetwork || w.Pending.Network == nil {
				bad("AVAILABLE with a pending command other than a network change")
			}
		case wantKind == nil && w.Pending != nil:
			bad("pending command in a settled state")
		case w.State == api.WorkspaceDeleting && w.Pending == nil:
			// No node can remove its files yet: it waits for a pool member.
			if w.DeleteWaitsForPool == "" || w.Layer == nil || api.LayerPoolID(w.Layer) != w.DeleteWaitsForPool {
				bad("DELETING without a command, not waiting for its layer's pool")
			}
		case wantKind != nil && (w.Pending == nil || !containsString(wantKind, w.Pending.Kind)):
			bad("no pending command of the right kind")
		}
		if w.DeleteWaitsForPool != "" && (w.State != api.WorkspaceDeleting || w.Pending != nil) {
			bad("waits for a pool member while not a delete without a command")
		}
		switch w.State {
		case api.WorkspaceCreating, api.WorkspaceStarting, api.WorkspaceAvailable, api.WorkspaceStopping, api.WorkspacePausing:
			if !running {
				bad("no execution")
			}
		case api.WorkspacePaused:
			if running || w.Failure != nil || w.Pending != nil {
				bad("paused with an execution, a failure or a command")
			}
		case api.WorkspaceStopped:
			if running || w.Failure != nil {
				bad("stopped with an execution or a failure")
			}
		case api.WorkspaceFailed:
			if w.Failure == nil {
				bad("failed without a reason")
			}
		case api.WorkspaceDeleting:
		default:
			bad("unknown state")
		}
		// A stored policy is always one create or set-network accepted:
		// normalized, with lists only for public egress.
		if w.Network == nil || w.Network.Egress == "" || (w.Network.Egress != api.EgressPublic && (len(w.Network.Allow) > 0 || len(w.Network.Deny) > 0)) {
			bad(fmt.Sprintf("network policy %+v", w.Network))
		}
		if p := w.Pending; p != nil {
			if want := layerNode(&w); p.NodeID != want || p.InstanceID != w.InstanceID {
				bad("pending command not for the current execution or layer node")
			}
			if n, ok := byID[p.NodeID]; !ok || n.Retired || n.Isolated {
				bad("command pending on a node that can never answer")
			}
		}
	}
}

func (c *invariantChecker) summary() {
	c.t.Logf("outcomes: %v, nodes: %v", c.counts, c.versions)
	if c.counts["ok"] < propertyEntries/5 || c.counts["failed"] < propertyEntries/20 || c.counts["replayed"] == 0 {
		c.t.Errorf("generator drew an unbalanced log: %v", c.counts)
	}
}

func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			out = append(out, fmt.Sprintf("line %d:\n- %s\n+ %s", i+1, a, b))
			if len(out) > 5 {
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// ---------------------------------------------------------------------------
// Snapshot and restore

func TestRestoreRefusesNewerSchema(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	before := h.dump()

	path := filepath.Join(t.TempDir(), "newer.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], SchemaVersion+1)
		if err := tx.Bucket(bucketMeta).Put(keySchemaVersion, v[:]); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keyClusterID, []byte("from-the-future"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	snap, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	err = h.f.Restore(bytes.NewReader(snap))
	if err == nil || !strings.Contains(err.Error(), "schema version") {
		t.Fatalf("restore of a newer schema: %v", err)
	}
	if got := h.dump(); got != before {
		t.Fatalf("refused restore changed the state:\n%s", diffLines(before, got))
	}
	// The FSM keeps working on the old state.
	h.advance(time.Second)
	h.report("node-a", "s1", api.Report{})
	if v := h.version("node-a"); v != 3 {
		t.Errorf("version %d", v)
	}
	if _, err := os.Stat(h.f.path + ".restore.tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary restore file left behind: %v", err)
	}

	// The same file with the current schema version is accepted.
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], SchemaVersion)
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, v[:])
	})
	db.Close()
	snap, _ = os.ReadFile(path)
	if err := h.f.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatalf("restore current schema: %v", err)
	}
	h.f.View(func(tx *bolt.Tx) error {
		if id := ClusterID(tx); id != "from-the-future" {
			t.Errorf("cluster id after restore %q", id)
		}
		return nil
	})
}

// writeStateFile builds a bbolt file with every bucket and the given meta
// schema_version value, and returns its bytes.
func writeStateFile(t *testing.T, schemaVersion []byte) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "snap.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, schemaVersion)
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A corrupt schema version record is refused, not a panic.
func TestRestoreRefusesCorruptSchemaVersion(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	before := h.dump()
	for _, v := range [][]byte{{1}, {0, 0, 0, 1}, {}, make([]byte, 9)} {
		if err := h.f.Restore(bytes.NewReader(writeStateFile(t, v))); err == nil {
			t.Errorf("schema version %x accepted", v)
		}
		if got := h.dump(); got != before {
			t.Fatal("refused restore changed the state")
		}
	}
}

func TestRestoreRefusesGarbage(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	before := h.dump()
	for _, snap := range [][]byte{nil, []byte("not a bolt file"), bytes.Repeat([]byte{0xff}, 8192)} {
		if err := h.f.Restore(bytes.NewReader(snap)); err == nil {
			t.Errorf("restore of %d garbage bytes succeeded", len(snap))
		}
		if got := h.dump(); got != before {
			t.Fatalf("refused restore changed the state")
		}
	}
	h.advance(time.Second)
	h.report("node-a", "s1", api.Report{})
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("d"))
	var buf bytes.Buffer
	if err := h.f.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	want := h.dump()
	c := &harness{t: t, f: openFSM(t), now: h.now}
	if err := c.f.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if got := c.dump(); got != want {
		t.Fatalf("restored state differs:\n%s", diffLines(want, got))
	}
	// Command records travel with the snapshot.
	if r := c.expectUnchanged(c.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("d"))); !r.Replayed {
		t.Error("command record lost in the snapshot")
	}
}

// checkSummarize: the counts a metrics scrape reads (Summarize, slim
// records) are the ones the full lists give.
func checkSummarize(t *testing.T, f *FSM) {
	t.Helper()
	err := f.View(func(tx *bolt.Tx) error {
		s, err := Summarize(tx)
		if err != nil {
			return err
		}
		ws, err := ListWorkspaces(tx, WorkspaceFilter{All: true}, 0, "")
		if err != nil {
			return err
		}
		ns, err := ListNodes(tx, 0, "")
		if err != nil {
			return err
		}
		wantWS, wantNodes, wantClocks := map[string]int{}, map[string]int{}, map[string]int64{}
		for _, w := range ws.Workspaces {
			wantWS[w.State]++
		}
		for _, n := range ns.Nodes {
			wantNodes[n.Status]++
			if n.Session != nil && n.Session.Clock != nil {
				wantClocks[n.NodeID] = n.Session.Clock.OffsetNS
			}
		}
		if !reflect.DeepEqual(s.WorkspacesByState, wantWS) || !reflect.DeepEqual(s.NodesByStatus, wantNodes) || !reflect.DeepEqual(s.Clocks, wantClocks) {
			t.Errorf("Summarize %+v; the lists give workspaces %v, nodes %v, clocks %v", s, wantWS, wantNodes, wantClocks)
		}
		ps, err := ListStoragePools(tx, 0, "")
		if err != nil {
			return err
		}
		var wantPools []PoolSummary
		for _, p := range ps.Pools {
			wantPools = append(wantPools, PoolSummary{PoolID: p.PoolID, CapacityBytes: p.CapacityBytes, UsedBytes: p.UsedBytes})
		}
		if !reflect.DeepEqual(s.Pools, wantPools) {
			t.Errorf("Summarize pools %+v; the list gives %+v", s.Pools, wantPools)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// withoutPlacementCounts is a dump without the placement counts, the one
// thing a rejected entry that counts placements may change.
func withoutPlacementCounts(dump string) string { return withoutSection(dump, bucketPlacements) }
