package fsm

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

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
		g.drawTimeout(&a)
		g.drawIdleTimeout(&a)
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
