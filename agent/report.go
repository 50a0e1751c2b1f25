package agent

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/template"
)

// watchInstances pushes a full report whenever what the node runs changes,
// so ctrl's counts (drain, placement) do not wait for the next sync.
func (a *Agent) watchInstances(ctx context.Context, first api.Report) {
	a.noteSent(first)
	lastDataPlane := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Without the ended-Instance records: they are read from disk and
		// travel with the report the change triggers anyway.
		a.lookIdle(ctx)
		r := a.buildReport(false)
		a.notePools(r.Pools)
		last, lastPush := a.lastSent()
		changed := r.Instances != last.Instances || r.Allocated != last.Allocated || reportedStates(r) != reportedStates(last) ||
			!slices.Equal(r.Warm, last.Warm)
		// New denied counts alone are pushed, but not more often than
		// the interval: each report is a Raft entry.
		// While an Instance is idle its figure grows every second: it is
		// pushed when the report starts or stops saying an Instance is
		// idle (idle.go: after 30 s of it) and refreshed every
		// idleReportInterval, so ctrl's idle pause trusts a recent
		// report, never one per second.
		if changed || deniedCounts(r) != deniedCounts(last) && time.Since(lastPush) >= a.cfg.DeniedReportInterval ||
			anyIdle(r) && time.Since(lastPush) >= idleReportInterval {
			a.PushReport() // one that fails is tried again at the next tick
		}
		// The seed: the node resends its state to the data plane at least
		// every 15 seconds (a restarted data plane gets it that way).
		// One such push at a time: against a data plane that hangs, a
		// push a second would otherwise pile up behind the last.
		if (time.Since(lastDataPlane) >= 15*time.Second || !a.dataPlaneAlive(ctx) || a.dataTargetsChanged()) && a.dataPushing.CompareAndSwap(false, true) {
			lastDataPlane = time.Now()
			a.bg.spawn(ctx, func(ctx context.Context) {
				defer a.dataPushing.Store(false)
				a.updateDataPlane(ctx)
			})
		}
	}
}

// reportedStates is what of a report is worth a push when it changes: the
// Instances' states (and whether each is idle), the templates and the
// pools' availability (ctrl places nothing that needs an unavailable
// pool). Denied counts, idle seconds and free bytes are not: they change
// all the time and ride along with the next report.
func reportedStates(r api.Report) string {
	var b strings.Builder
	for _, st := range r.InstanceStates {
		fmt.Fprintf(&b, "%s %s %q %t %t;", st.InstanceID, st.State, st.Error, st.GuestNotResponding, st.IdleSeconds > 0)
	}
	for _, p := range r.Pools {
		fmt.Fprintf(&b, "%s %t;", p.PoolID, p.Available)
	}
	fmt.Fprint(&b, r.Templates, r.TemplateBytes, r.TemplateDigests)
	return b.String()
}

// idleReportInterval is how often a report is refreshed while an
// Instance is idle: well within the age of a report ctrl's idle pause
// trusts (fsm/idle.go, 90 s).
const idleReportInterval = 30 * time.Second

// anyIdle says whether the report has an idle Instance.
func anyIdle(r api.Report) bool {
	for _, st := range r.InstanceStates {
		if st.IdleSeconds > 0 {
			return true
		}
	}
	return false
}

// DefaultDeniedReportInterval is Config.DeniedReportInterval's default.
const DefaultDeniedReportInterval = 30 * time.Second

// deniedCounts are a report's denied counts, to tell whether they changed.
func deniedCounts(r api.Report) string {
	var b strings.Builder
	for _, st := range r.InstanceStates {
		fmt.Fprintf(&b, "%s %d;", st.InstanceID, st.DeniedPackets)
	}
	return b.String()
}

// buildReport is the node's report: capacity, what its Instances hold
// (CPU, memory, retained layers, Volumes), pools; a full one (withEnded,
// sent by sendReport only) also the ended-Instance records.
func (a *Agent) buildReport(withEnded bool) api.Report {
	r := api.Report{
		Capacity:    a.cfg.Capacity,
		Pools:       []api.Pool{poolStatus(api.PrivatePoolID(a.cfg.NodeID), DefaultPoolPath(a.cfg.DataDir))},
		DefaultPool: api.NormalizePoolID(a.cfg.NodeID, a.cfg.DefaultPool),
	}
	for _, p := range a.cfg.Pools {
		st := poolStatus(p.ID, p.Path)
		st.Shared = p.Shared
		r.Pools = append(r.Pools, st)
	}
	if dp := a.cfg.DataPlane; dp != nil {
		r.DataPlaneAddress = dp.Address()
	}
	l := a.templateNames()
	r.Templates, r.TemplateBytes, r.TemplateDigests = l.names, l.sizes, l.digests
	if withEnded {
		// Full reports only: the watcher's look every second needs none.
		r.Resume = a.resumeInfo()
	}
	r.Warm = a.warmReport()
	if withEnded {
		// ctrl stores the cleanup conclusion of each, then has it deleted.
		r.Ended, r.EndedComplete = a.endedReport()
	}
	if rt := a.cfg.Runtime; rt != nil {
		for _, st := range rt.Owned() {
			r.InstanceStates = append(r.InstanceStates, api.InstanceState{InstanceID: st.ID, State: string(st.State), Error: st.Error, DeniedPackets: st.DeniedPackets,
				OOMKilled:          st.State == runtime.StateFailed && st.Error == runtime.ErrOOMKilled,
				GuestNotResponding: st.State == runtime.StateRunning && !st.GuestResponding})
			if st.State == runtime.StateRunning {
				r.InstanceStates[len(r.InstanceStates)-1].IdleSeconds = a.idle.reported(st.ID, time.Now())
			}
			if st.State == runtime.StateStopped {
				continue // a stopped Instance holds no CPU or memory
			}
			// A FAILED Instance still holds its reservations until destroyed.
			r.Instances++
			r.Allocated.CPU += api.Milli(st.VCPUs * 1000)
			r.Allocated.MemoryBytes += uint64(st.MemoryMiB) << 20
			// So does it its objects: drain waits for them too.
			r.Volumes += len(st.Volumes)
			if st.LayerPath != "" {
				r.RetainedLayers++
			}
		}
	}
	// Ready warm guests hold their memory until a start adopts one as a
	// Workspace's: placement must not count it free.
	for _, w := range r.Warm {
		r.Allocated.MemoryBytes += uint64(w.Ready) * w.MemoryBytes
	}
	if a.cfg.AdjustReport != nil {
		a.cfg.AdjustReport(&r)
	}
	return r
}

// templateNames lists the templates built on this node (ctrl places a
// Workspace only where its template is). The list is read again only when
// the templates directory changed: a build or delete renames or removes
// an entry there, and the report watcher asks every second.
func (a *Agent) templateNames() localTemplates {
	root := a.cfg.DataDir.StorageRoot()
	st, statErr := os.Stat(template.Dir(root))
	a.mu.Lock()
	// Listed again at least every 10 s anyway: a file system with coarse
	// timestamps can hide a change made in the second of the last listing.
	if statErr == nil && st.ModTime().Equal(a.templatesMod) && time.Since(a.templatesListed) < 10*time.Second {
		l := a.templates
		a.mu.Unlock()
		return l
	}
	a.mu.Unlock()
	ts, err := template.List(root)
	if err != nil && len(ts) == 0 {
		a.log.Debug("templates not listed", "err", err)
	}
	var l localTemplates
	for _, t := range ts {
		if len(l.names) == 0 || l.names[len(l.names)-1] != t.Name { // sorted by name
			l.names = append(l.names, t.Name)
		}
		// A new layer goes over the latest build; charge the largest.
		if t.ImageBytes > 0 {
			if l.sizes == nil {
				l.sizes = map[string]uint64{}
			}
			l.sizes[t.Name] = max(l.sizes[t.Name], uint64(t.ImageBytes))
		}
		if t.ImageDigest != "" && !slices.Contains(l.digests, t.ImageDigest) && len(l.digests) < api.MaxNodeTemplateDigests {
			l.digests = append(l.digests, t.ImageDigest)
		}
	}
	if statErr == nil && err == nil {
		a.mu.Lock()
		a.templates, a.templatesMod, a.templatesListed = l, st.ModTime(), time.Now()
		a.mu.Unlock()
	}
	return l
}

// localTemplates is what a report says of the node's templates: names,
// image sizes, and the digests of the images it holds verified copies of
// (published or fetched through the artifact store).
type localTemplates struct {
	names   []string
	sizes   map[string]uint64
	digests []string
}

// PushReport sends a full report now instead of at the next sync, as the
// node does when what it holds changes. It reports whether a session took it.
func (a *Agent) PushReport() bool {
	a.mu.Lock()
	send := a.send
	a.mu.Unlock()
	if send == nil {
		return false
	}
	return a.sendReport(send, nil) == nil
}

// noteSent records r as the last report a session took.
func (a *Agent) noteSent(r api.Report) {
	a.sent.Lock()
	a.sent.report, a.sent.at = r, time.Now()
	a.sent.Unlock()
}

// lastSent is the last report a session took and when.
func (a *Agent) lastSent() (api.Report, time.Time) {
	a.sent.Lock()
	defer a.sent.Unlock()
	return a.sent.report, a.sent.at
}

// HostUsage is the latest host usage sample, nil before the first.
func (a *Agent) HostUsage() *api.HostUsage { return a.hostUsage() }

// hostUsage is the latest sample, nil before the first.
func (a *Agent) hostUsage() *api.HostUsage {
	u := api.HostUsage(a.sampler.Latest())
	if u.SampledAt.IsZero() {
		return nil
	}
	return &u
}
