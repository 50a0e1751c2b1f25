// Package metrics is what a member shows Prometheus. Every collector reads
// the member's live state at the scrape (the runtime's Instances, the
// local FSM, Raft), so a figure never drifts from what `kibo` shows and
// nothing has to be counted twice; the registry is served on a loopback
// listener ([metrics] listen) and on the API port for admin certificates.
package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	gometrics "github.com/armon/go-metrics"
	gometricsprom "github.com/armon/go-metrics/prometheus"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/agent/dnsfilter"
	"github.com/kibotos/kibotos/agent/egress"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// Sources are the parts of a member the collectors read; a nil one is a
// role the member does not have.
type Sources struct {
	// Instances lists the node's Instances (nil: the node runs no VMs).
	Instances func() []runtime.InstanceStatus
	// Destroyed counts the records of destroyed Instances the node keeps
	// until ctrl concluded them (nil: none).
	Destroyed func() int
	// FSM is the member's replica (nil on node-only members).
	FSM *fsm.FSM
	// Raft is the member's Raft (nil on node-only members).
	Raft *raft.Raft
	// ControlSessions counts the nodes' control sessions attached to this
	// member (nil on node-only members).
	ControlSessions func() int
	// HostUsage is the node's latest host usage sample (nil: no node).
	HostUsage func() *api.HostUsage
	// Steps are the node runtime's step durations (nil: no runtime).
	Steps *Steps
	// Egress sums the egress process's counters over its generations
	// (ok false: none runs); nil: no runtime.
	Egress func(ctx context.Context) (egress.Stats, bool)
	// EgressByInstance are the egress process's connection counters of
	// each Instance it routes, by Instance id (ok false: none runs).
	EgressByInstance func(ctx context.Context) (map[string]egress.GuestStats, bool)
	// Names are the counters of the node's resolver for domain rules.
	Names func() (dnsfilter.Stats, bool)
	// DataPlane sums the data-plane processes' counters over their
	// generations (nil: no data plane).
	DataPlane func(ctx context.Context) dataplane.Counters
	// Warm lists the node's warm guests by template (nil: no node).
	Warm func() []api.WarmGuests
	// QuotaRefusals are the quota refusals of the writes the member led,
	// by namespace and quota (nil on node-only members).
	QuotaRefusals func() map[[2]string]uint64
}

// Steps are histograms of how long the node runtime's steps took; its
// Observe is the runtime's Config.Observe.
type Steps struct{ h *prometheus.HistogramVec }

// NewSteps makes the histograms: boot (a start until the guest agent
// answers), each named step of a start (runtime.StartSteps) and takeover
// (the runtime's open at node start). The buckets start at a millisecond:
// most steps of a start take a few.
func NewSteps() *Steps {
	return &Steps{h: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kibotos_node_step_seconds",
		Help:    "How long node runtime steps took: boot (a start until the guest agent answers), each completed step of a start by its name (prepare-dirs, launch-unit, await-guest, ...), takeover (opening the runtime at node start, adopting what runs).",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 8, 13, 21, 34, 60},
	}, []string{"step"})}
}

// Observe records one step.
func (s *Steps) Observe(step string, d time.Duration) { s.h.WithLabelValues(step).Observe(d.Seconds()) }

// Registry makes the registry of a member: its collectors plus the Go
// runtime's and the process's.
func Registry(src Sources) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if src.Instances != nil {
		reg.MustRegister(nodeCollector{src.Instances, src.Destroyed})
	}
	if src.FSM != nil {
		reg.MustRegister(ctrlCollector{src.FSM})
		apply := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kibotos_fsm_apply_seconds",
			Help:    "How long this replica took to apply one log entry, by op (an entry's share of its batch's transaction; the commit is not in it).",
			Buckets: []float64{0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1},
		}, []string{"op"})
		reg.MustRegister(apply)
		src.FSM.ObserveApply(func(op string, d time.Duration) { apply.WithLabelValues(op).Observe(d.Seconds()) })
	}
	if src.Raft != nil {
		reg.MustRegister(raftCollector{src.Raft})
		raftTelemetry(reg)
	}
	if src.ControlSessions != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kibotos_control_sessions",
			Help: "Nodes' control sessions attached to this member (the leader holds them all)."},
			func() float64 { return float64(src.ControlSessions()) }))
	}
	if src.HostUsage != nil {
		reg.MustRegister(hostCollector{src.HostUsage})
	}
	if src.Steps != nil {
		reg.MustRegister(src.Steps.h)
	}
	if src.Warm != nil {
		reg.MustRegister(warmCollector{src.Warm})
	}
	if src.QuotaRefusals != nil {
		reg.MustRegister(refusalCollector{src.QuotaRefusals})
	}
	if src.DataPlane != nil {
		reg.MustRegister(dataPlaneCollector{src.DataPlane})
	}
	if src.Egress != nil || src.EgressByInstance != nil || src.Names != nil {
		reg.MustRegister(egressCollector{src.Egress, src.EgressByInstance, src.Names})
	}
	return reg
}

// raftTelemetry sends what hashicorp/raft measures itself (commit and
// apply times, append-entries and snapshot durations, as summaries named
// kibotos_raft_*) into reg: raft reports to go-metrics' global sink, so
// one member per process gets them (every production process is one).
func raftTelemetry(reg prometheus.Registerer) {
	sink, err := gometricsprom.NewPrometheusSinkFrom(gometricsprom.PrometheusOpts{Registerer: reg, Expiration: 10 * time.Minute})
	if err != nil {
		return // registered already: an earlier member of this process has it
	}
	cfg := gometrics.DefaultConfig("kibotos")
	cfg.EnableHostname = false
	cfg.EnableRuntimeMetrics = false // the Go collector has them
	cfg.EnableServiceLabel = false
	gometrics.NewGlobal(cfg, sink)
}

// Handler serves reg in the exposition format.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: nil, Timeout: 10 * time.Second})
}

// Serve serves reg on ln (plain HTTP: a loopback address, or the
// operator's choice) at /metrics until ctx ends.
func Serve(ctx context.Context, ln net.Listener, reg *prometheus.Registry, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", Handler(reg))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	// Closed when ctx ends; a Serve that fails first leaves nothing behind.
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	log.Info("metrics listening", "address", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// describe sends a collector's descriptions.
func describe(ch chan<- *prometheus.Desc, ds ...*prometheus.Desc) {
	for _, d := range ds {
		ch <- d
	}
}

// instanceStates are the node's Instance states as the upgrade seed's
// kibotos_node_instances{state="stopped"} spells them; every one is
// exposed, zeros included, so a sum over them is the node's total.
var instanceStates = []runtime.State{runtime.StateStarting, runtime.StateRunning, runtime.StateStopping, runtime.StateStopped, runtime.StateFailed}

var (
	nodeInstances = prometheus.NewDesc("kibotos_node_instances",
		"Instances the node holds, by state.", []string{"state"}, nil)
	guestDenied = prometheus.NewDesc("kibotos_node_guest_denied_packets_total",
		"Packets of an Instance's guest its rule table dropped, since the Instance started.", []string{"instance_id"}, nil)
)

type nodeCollector struct {
	list      func() []runtime.InstanceStatus
	destroyed func() int
}

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) { describe(ch, nodeInstances, guestDenied) }

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[runtime.State]int{}
	for _, st := range c.list() {
		counts[st.State]++
		if st.State != runtime.StateStopped {
			ch <- prometheus.MustNewConstMetric(guestDenied, prometheus.CounterValue, float64(st.DeniedPackets), st.ID)
		}
	}
	for _, s := range instanceStates {
		ch <- prometheus.MustNewConstMetric(nodeInstances, prometheus.GaugeValue, float64(counts[s]), strings.ToLower(string(s)))
	}
	// Destroyed Instances are gone from the runtime; their records wait
	// in the registry until ctrl stored each one's conclusion.
	destroyed := 0
	if c.destroyed != nil {
		destroyed = c.destroyed()
	}
	ch <- prometheus.MustNewConstMetric(nodeInstances, prometheus.GaugeValue, float64(destroyed), "destroyed")
}

var workspaceStates = []string{api.WorkspaceCreating, api.WorkspaceStarting, api.WorkspaceAvailable, api.WorkspaceStopping,
	api.WorkspaceStopped, api.WorkspaceFailed, api.WorkspaceDeleting}

var nodeStatuses = []string{api.NodeReady, api.NodeNotReady, api.NodeDraining, api.NodeDrained, api.NodeIsolated, api.NodeRetired, api.NodeRevoked}

var (
	workspaces = prometheus.NewDesc("kibotos_workspaces",
		"Workspaces in this member's replica, by state.", []string{"state"}, nil)
	nodes = prometheus.NewDesc("kibotos_nodes",
		"Registered nodes in this member's replica, by status.", []string{"status"}, nil)
	clockOffset = prometheus.NewDesc("kibotos_node_clock_offset_seconds",
		"The node's clock minus ctrl's, as last measured over its control session.", []string{"node_id"}, nil)
	poolCapacity = prometheus.NewDesc("kibotos_storage_pool_capacity_bytes",
		"The capacity ctrl set for the storage pool (absent while none is set: the pool takes no new objects).", []string{"pool"}, nil)
	poolUsed = prometheus.NewDesc("kibotos_storage_pool_used_bytes",
		"What the storage pool's objects take of its capacity (retained layers at their template's size, Volumes).", []string{"pool"}, nil)
	placements = prometheus.NewDesc("kibotos_placements_total",
		"Placements of Workspace Instances (create, start, resume, a re-placement after a node refused) counted in the replicated state, so equal on every ctrl member: placed, or refused (no node could take it).",
		[]string{"outcome"}, nil)
	placementRefusals = prometheus.NewDesc("kibotos_placement_refusals_total",
		"Refused placements by each reason that kept a node out (once per refused placement and reason, so the reasons add up to at least the refusals).",
		[]string{"reason"}, nil)
	nsUsed = prometheus.NewDesc("kibotos_namespace_used",
		"What a namespace's objects take of its quota, by resource (running_workspaces, cpu in vCPUs, memory_bytes, volume_bytes, snapshot_bytes; not kept for default).", []string{"namespace", "resource"}, nil)
	nsQuota = prometheus.NewDesc("kibotos_namespace_quota",
		"A namespace's quota, by resource (absent: not bounded).", []string{"namespace", "resource"}, nil)
	nsObjects = prometheus.NewDesc("kibotos_namespace_objects",
		"A namespace's objects, by kind (workspaces, volumes, api_keys).", []string{"namespace", "kind"}, nil)
	nsTimeouts = prometheus.NewDesc("kibotos_namespace_timeouts_total",
		"Timeout actions done to a namespace's Workspaces, by action, counted in the replicated state.", []string{"namespace", "action"}, nil)
	nsRefusals = prometheus.NewDesc("kibotos_namespace_quota_refusals_total",
		"Writes this member led that a namespace's quota refused, by quota.", []string{"namespace", "quota"}, nil)
	scrapeErrors = prometheus.NewDesc("kibotos_metrics_read_errors",
		"1 when this scrape could not read the member's state (the figures above are then missing).", []string{"source"}, nil)
)

type ctrlCollector struct{ f *fsm.FSM }

func (c ctrlCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, workspaces, nodes, clockOffset, poolCapacity, poolUsed, placements, placementRefusals, scrapeErrors, nsUsed, nsQuota, nsObjects, nsTimeouts)
}

func (c ctrlCollector) Collect(ch chan<- prometheus.Metric) {
	var sum fsm.Summary
	err := c.f.View(func(tx *bolt.Tx) (err error) { sum, err = fsm.Summarize(tx); return })
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(scrapeErrors, prometheus.GaugeValue, failed, "fsm")
	if err != nil {
		return
	}
	for _, s := range workspaceStates {
		ch <- prometheus.MustNewConstMetric(workspaces, prometheus.GaugeValue, float64(sum.WorkspacesByState[s]), strings.ToLower(s))
	}
	for _, s := range nodeStatuses {
		ch <- prometheus.MustNewConstMetric(nodes, prometheus.GaugeValue, float64(sum.NodesByStatus[s]), strings.ToLower(s))
	}
	for id, off := range sum.Clocks {
		ch <- prometheus.MustNewConstMetric(clockOffset, prometheus.GaugeValue, float64(off)/1e9, id)
	}
	for _, p := range sum.Pools {
		if p.CapacityBytes != nil {
			ch <- prometheus.MustNewConstMetric(poolCapacity, prometheus.GaugeValue, float64(*p.CapacityBytes), p.PoolID)
		}
		ch <- prometheus.MustNewConstMetric(poolUsed, prometheus.GaugeValue, float64(p.UsedBytes), p.PoolID)
	}
	ch <- prometheus.MustNewConstMetric(placements, prometheus.CounterValue, float64(sum.Placements.Placed), "placed")
	ch <- prometheus.MustNewConstMetric(placements, prometheus.CounterValue, float64(sum.Placements.Refused), "refused")
	for reason, n := range sum.Placements.Refusals {
		ch <- prometheus.MustNewConstMetric(placementRefusals, prometheus.CounterValue, float64(n), reason)
	}
	c.collectNamespaces(ch)
}

// collectNamespaces shows each namespace's objects, usage against its
// quota and timeouts.
func (c ctrlCollector) collectNamespaces(ch chan<- prometheus.Metric) {
	var figs []fsm.NamespaceFigures
	if err := c.f.View(func(tx *bolt.Tx) (err error) { figs, err = fsm.NamespaceMetrics(tx); return }); err != nil {
		ch <- prometheus.MustNewConstMetric(scrapeErrors, prometheus.GaugeValue, 1, "namespaces")
		return
	}
	for _, f := range figs {
		ns := f.Name
		for kind, n := range map[string]int{"workspaces": f.Usage.Workspaces, "volumes": f.Usage.Volumes, "api_keys": f.Usage.APIKeys} {
			ch <- prometheus.MustNewConstMetric(nsObjects, prometheus.GaugeValue, float64(n), ns, kind)
		}
		for action, n := range f.Counters.Timeouts {
			ch <- prometheus.MustNewConstMetric(nsTimeouts, prometheus.CounterValue, float64(n), ns, action)
		}
		if ns == api.DefaultNamespace {
			continue
		}
		u := f.Usage.NamespaceResources
		used := map[string]float64{"running_workspaces": float64(u.RunningWorkspaces), "cpu": float64(u.CPU) / 1000, "memory_bytes": float64(u.MemoryBytes), "volume_bytes": float64(u.VolumeBytes), "snapshot_bytes": float64(u.SnapshotBytes)}
		for r, v := range used {
			ch <- prometheus.MustNewConstMetric(nsUsed, prometheus.GaugeValue, v, ns, r)
		}
		if q := f.Quota; q != nil {
			for r, limit := range map[string]*uint64{"running_workspaces": q.RunningWorkspaces, "cpu": q.CPU, "memory_bytes": q.MemoryBytes, "volume_bytes": q.VolumeBytes, "snapshot_bytes": q.SnapshotBytes} {
				if limit != nil {
					v := float64(*limit)
					if r == "cpu" {
						v /= 1000
					}
					ch <- prometheus.MustNewConstMetric(nsQuota, prometheus.GaugeValue, v, ns, r)
				}
			}
		}
	}
}

// refusalCollector shows the quota refusals of the writes the member led.
type refusalCollector struct {
	n func() map[[2]string]uint64
}

func (c refusalCollector) Describe(ch chan<- *prometheus.Desc) { describe(ch, nsRefusals) }

func (c refusalCollector) Collect(ch chan<- prometheus.Metric) {
	for k, n := range c.n() {
		ch <- prometheus.MustNewConstMetric(nsRefusals, prometheus.CounterValue, float64(n), k[0], k[1])
	}
}

var (
	raftLeader = prometheus.NewDesc("kibotos_raft_leader",
		"1 while this member leads the Raft group.", nil, nil)
	raftIndex = prometheus.NewDesc("kibotos_raft_index",
		"Raft log positions of this member: last (in its log), commit and applied.", []string{"kind"}, nil)
	raftPeers = prometheus.NewDesc("kibotos_raft_voters",
		"Voters in the Raft configuration this member knows.", nil, nil)
)

type raftCollector struct{ r *raft.Raft }

func (c raftCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, raftLeader, raftIndex, raftPeers)
}

func (c raftCollector) Collect(ch chan<- prometheus.Metric) {
	leader := 0.0
	if c.r.State() == raft.Leader {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(raftLeader, prometheus.GaugeValue, leader)
	stats := c.r.Stats()
	for kind, key := range map[string]string{"last": "last_log_index", "commit": "commit_index", "applied": "applied_index"} {
		if v, err := strconv.ParseUint(stats[key], 10, 64); err == nil {
			ch <- prometheus.MustNewConstMetric(raftIndex, prometheus.GaugeValue, float64(v), kind)
		}
	}
	if v, err := strconv.Atoi(stats["num_peers"]); err == nil {
		ch <- prometheus.MustNewConstMetric(raftPeers, prometheus.GaugeValue, float64(v+1))
	}
}

var (
	hostGauge = prometheus.NewDesc("kibotos_node_host",
		"The node's host usage as last sampled (every 10 s): vm_cpu_cores, vm_memory_bytes, memory_total_bytes, memory_available_bytes, cpu_idle_ratio, and PSI avg60 ratios; an item that could not be read is absent.",
		[]string{"item"}, nil)
	memoryTight = prometheus.NewDesc("kibotos_node_memory_tight",
		"1 while the host's available memory is tight (below 10%, until above 15%): the node refuses new starts.", nil, nil)
)

type hostCollector struct{ usage func() *api.HostUsage }

func (c hostCollector) Describe(ch chan<- *prometheus.Desc) { describe(ch, hostGauge, memoryTight) }

func (c hostCollector) Collect(ch chan<- prometheus.Metric) {
	u := c.usage()
	if u == nil {
		return
	}
	item := func(name string, v float64) {
		ch <- prometheus.MustNewConstMetric(hostGauge, prometheus.GaugeValue, v, name)
	}
	floats := []struct {
		name string
		v    *float64
	}{{"vm_cpu_cores", u.VMCPUCores}, {"cpu_idle_ratio", u.CPUIdle},
		{"cpu_pressure_some_ratio", u.CPUPressureSome}, {"cpu_pressure_full_ratio", u.CPUPressureFull},
		{"memory_pressure_some_ratio", u.MemoryPressureSome}, {"memory_pressure_full_ratio", u.MemoryPressureFull}}
	for _, f := range floats {
		if f.v != nil {
			item(f.name, *f.v)
		}
	}
	for _, b := range []struct {
		name string
		v    *uint64
	}{{"vm_memory_bytes", u.VMMemoryBytes}, {"memory_total_bytes", u.MemoryTotalBytes}, {"memory_available_bytes", u.MemoryAvailableBytes}} {
		if b.v != nil {
			item(b.name, float64(*b.v))
		}
	}
	tight := 0.0
	if u.MemoryTight {
		tight = 1
	}
	ch <- prometheus.MustNewConstMetric(memoryTight, prometheus.GaugeValue, tight)
}

var (
	egressConns = prometheus.NewDesc("kibotos_node_egress_connections_total",
		"Guest connections through the egress process, summed over its generations (never decreasing across a switch): accepted, refused (no route, too many, draining), failed (the proxy could not be reached or refused), closed (by a drain deadline).",
		[]string{"outcome"}, nil)
	egressInstanceConns = prometheus.NewDesc("kibotos_node_egress_instance_connections_total",
		"An Instance's guest connections through the egress process, by outcome as kibotos_node_egress_connections_total, while the Instance runs (its series ends with it; a guest not yet counted by an egress process of an earlier build shows none).",
		[]string{"instance_id", "outcome"}, nil)
	egressActive = prometheus.NewDesc("kibotos_node_egress_active_connections",
		"Guest connections the egress process carries now.", nil, nil)
	egressWarm = prometheus.NewDesc("kibotos_node_egress_warm_connections",
		"Connections to Egress SOCKS5 servers the egress process holds greeted and authenticated for the next guest connections ([network] egress_warm_connections per revision in use).", nil, nil)
	egressDNS = prometheus.NewDesc("kibotos_node_egress_dns_queries_total",
		"Resolver guests' DNS queries through the egress process: answered, failed (no upstream in time), dropped.", []string{"outcome"}, nil)
	namesDNS = prometheus.NewDesc("kibotos_node_dns_filter_queries_total",
		"DNS queries of guests with domain rules at the node's resolver: answered, refused (a denied or unallowed name, an unknown source), failed, dropped (too many in flight).",
		[]string{"outcome"}, nil)
)

type egressCollector struct {
	egress     func(ctx context.Context) (egress.Stats, bool)
	byInstance func(ctx context.Context) (map[string]egress.GuestStats, bool)
	names      func() (dnsfilter.Stats, bool)
}

func (c egressCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, egressConns, egressInstanceConns, egressActive, egressWarm, egressDNS, namesDNS)
}

func (c egressCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label)
	}
	// A scrape is where these calls start (Collect takes no context):
	// bounded, so a hung egress process cannot hold the scrape.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c.byInstance != nil {
		if by, ok := c.byInstance(ctx); ok {
			for id, st := range by {
				for _, o := range []struct {
					outcome string
					v       uint64
				}{{"accepted", st.Accepted}, {"refused", st.Refused}, {"failed", st.Failed}, {"closed", st.Closed}} {
					ch <- prometheus.MustNewConstMetric(egressInstanceConns, prometheus.CounterValue, float64(o.v), id, o.outcome)
				}
			}
		}
	}
	if c.egress != nil {
		st, ok := c.egress(ctx)
		if ok {
			counter(egressConns, st.Accepted, "accepted")
			counter(egressConns, st.Refused, "refused")
			counter(egressConns, st.Failed, "failed")
			counter(egressConns, st.Closed, "closed")
			ch <- prometheus.MustNewConstMetric(egressActive, prometheus.GaugeValue, float64(st.Active))
			ch <- prometheus.MustNewConstMetric(egressWarm, prometheus.GaugeValue, float64(st.Warm))
			counter(egressDNS, st.DNSAnswered, "answered")
			counter(egressDNS, st.DNSFailed, "failed")
			counter(egressDNS, st.DNSDropped, "dropped")
		}
	}
	if c.names != nil {
		if st, ok := c.names(); ok {
			counter(namesDNS, st.Answered, "answered")
			counter(namesDNS, st.Refused, "refused")
			counter(namesDNS, st.Failed, "failed")
			counter(namesDNS, st.Dropped, "dropped")
		}
	}
}

var (
	dpConns = prometheus.NewDesc("kibotos_node_dataplane_connections_total",
		"Client connections the data plane accepted (exec, terminal, cp, port-forward), summed over its processes: an exited one's still count.", nil, nil)
	dpRefused = prometheus.NewDesc("kibotos_node_dataplane_refusals_total",
		"Data-plane connections refused before a session, by code (malformed, forged, expired, wrong_node, no_target, unavailable, stopping).", []string{"code"}, nil)
	dpBytes = prometheus.NewDesc("kibotos_node_dataplane_bytes_total",
		"Stream bytes the data plane relayed: in (client to guest), out (guest to client).", []string{"direction"}, nil)
)

type dataPlaneCollector struct {
	totals func(ctx context.Context) dataplane.Counters
}

func (c dataPlaneCollector) Describe(ch chan<- *prometheus.Desc) {
	describe(ch, dpConns, dpRefused, dpBytes)
}

func (c dataPlaneCollector) Collect(ch chan<- prometheus.Metric) {
	// Collect takes no context: the scrape is the root, bounded.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t := c.totals(ctx)
	ch <- prometheus.MustNewConstMetric(dpConns, prometheus.CounterValue, float64(t.Connections))
	for _, code := range dataplane.RefusalCodes {
		ch <- prometheus.MustNewConstMetric(dpRefused, prometheus.CounterValue, float64(t.Refused[code]), code)
	}
	ch <- prometheus.MustNewConstMetric(dpBytes, prometheus.CounterValue, float64(t.BytesIn), "in")
	ch <- prometheus.MustNewConstMetric(dpBytes, prometheus.CounterValue, float64(t.BytesOut), "out")
}

var (
	warmGuests = prometheus.NewDesc("kibotos_node_warm_guests",
		"The node's warm guests of a template ([templates.NAME] warm): ready (paused, waiting for a create) and wanted.", []string{"template", "state"}, nil)
	warmStarts = prometheus.NewDesc("kibotos_node_warm_starts_total",
		"Workspace starts that adopted a warm guest of the template instead of booting, since the node started.", []string{"template"}, nil)
)

type warmCollector struct{ list func() []api.WarmGuests }

func (c warmCollector) Describe(ch chan<- *prometheus.Desc) { describe(ch, warmGuests, warmStarts) }

func (c warmCollector) Collect(ch chan<- prometheus.Metric) {
	for _, w := range c.list() {
		ch <- prometheus.MustNewConstMetric(warmGuests, prometheus.GaugeValue, float64(w.Ready), w.Template, "ready")
		ch <- prometheus.MustNewConstMetric(warmGuests, prometheus.GaugeValue, float64(w.Wanted), w.Template, "wanted")
		ch <- prometheus.MustNewConstMetric(warmStarts, prometheus.CounterValue, float64(w.Starts), w.Template)
	}
}
