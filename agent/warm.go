package agent

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/template"
)

// Warm guests ([templates.NAME] warm = N): the node keeps up to N
// pre-booted guests of each such template, their vCPUs stopped, and the
// first start of a Workspace of that template and size adopts one
// instead of booting (runtime/resident.go). A warm guest costs its
// memory and a stopped VMM process while it waits, no CPU; booting one
// costs what a boot costs, one at a time, at the lowest priority, never
// while the host's memory is tight or the node drains. A node process
// keeps only the warm guests it booted: those of an earlier one are
// ended and made again.

// WarmConfig asks for warm guests of one template.
type WarmConfig struct {
	Template  string
	Count     int
	VCPUs     int
	MemoryMiB int
}

// warmRetry is the least time before a template whose warm boot failed
// is tried again (doubling to warmRetryMax).
const (
	warmRetry    = 30 * time.Second
	warmRetryMax = 10 * time.Minute
	warmLook     = 5 * time.Second
)

// warmState is what the node knows of its warm guests, by template.
type warmState struct {
	mu        sync.Mutex
	wake      chan struct{}
	templates map[string]*warmTemplate
}

// warmTemplate is the warm guests of one template: what the report says
// of them, and when a boot may be tried again after a failure (whose
// error is the report's until a boot works).
type warmTemplate struct {
	api.WarmGuests
	retryAt time.Time
	backoff time.Duration
	bootErr string
}

// savedWarmRoot held the warm guests earlier builds saved, a directory
// per template.
func (a *Agent) savedWarmRoot() string { return filepath.Join(a.cfg.DataDir.StorageRoot(), "warm") }

// warmFor is the configuration of a template's warm guests, nil if none.
func (a *Agent) warmFor(tpl string) *WarmConfig {
	for i := range a.cfg.Warm {
		if a.cfg.Warm[i].Template == tpl {
			return &a.cfg.Warm[i]
		}
	}
	return nil
}

// warmSpec is what the warm guests a template's configuration asks for
// are made as now; when they cannot be made (the template or Platform is
// not here), why not instead.
func (a *Agent) warmSpec(w WarmConfig) (runtime.WarmSpec, string) {
	tpl, err := template.Get(a.cfg.DataDir.StorageRoot(), w.Template)
	if err != nil {
		return runtime.WarmSpec{}, fmt.Sprintf("template %s is not on node %s yet", w.Template, a.cfg.NodeID)
	}
	inst, err := a.ownPlatform()
	if err != nil {
		return runtime.WarmSpec{}, err.Error()
	}
	return runtime.WarmSpec{WarmKey: warmKey(tpl, inst.ID, w.VCPUs, w.MemoryMiB), Image: tpl.Image(), Installation: inst, Mounts: TemplateMounts}, ""
}

// warmKey is what a guest of tpl on installation inst at a size is made
// as, for the warm guests made and for the starts that take them alike.
func warmKey(tpl *template.Template, inst string, vcpus, memoryMiB int) runtime.WarmKey {
	return runtime.WarmKey{Template: tpl.Name, TemplateID: tpl.ID, InstallationID: inst, VCPUs: vcpus, MemoryMiB: memoryMiB}
}

// runWarm keeps the configured warm guests until ctx ends.
func (a *Agent) runWarm(ctx context.Context) {
	rt := a.cfg.Runtime
	w := &a.warm
	if rt == nil {
		return
	}
	// Saved warm guests of builds before resident ones.
	if err := os.RemoveAll(a.savedWarmRoot()); err != nil {
		a.log.Warn("saved warm guests of an earlier build not removed", "dir", a.savedWarmRoot(), "err", err)
	}
	// Warm guests end with the node process: no other would adopt them.
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for _, r := range rt.Residents() {
			if err := rt.EndResident(ctx, r); err != nil {
				a.log.Warn("warm guest not ended", "instance_id", r.ID, "err", err)
			}
		}
	}()
	tick := time.NewTicker(warmLook)
	defer tick.Stop()
	for {
		a.endStrayWarm(ctx)
		booted := false
		for _, c := range a.cfg.Warm {
			if ctx.Err() != nil {
				return
			}
			if a.fillWarm(ctx, c) {
				booted = true
			}
		}
		if booted {
			continue // another may be wanted at once
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-w.wake:
		}
	}
}

// endStrayWarm ends the warm guests that are not kept ready: those a
// node process before this one made (taken over with its VMs), and ones
// whose VMM ended. runWarm makes one at a time and not while this runs;
// one still STARTING is ended at a later pass, once it booted.
func (a *Agent) endStrayWarm(ctx context.Context) {
	rt := a.cfg.Runtime
	kept := map[string]bool{}
	for _, r := range rt.Residents() {
		kept[r.ID] = true
	}
	for _, st := range rt.List() {
		if !runtime.IsWarm(st.ID) || kept[st.ID] || st.State == runtime.StateStarting || st.State == runtime.StateStopping {
			continue
		}
		if err := rt.EndResident(ctx, runtime.Resident{ID: st.ID}); err != nil {
			a.log.Warn("warm guest not ended", "instance_id", st.ID, "err", err)
			continue
		}
		a.log.Info("warm guest not kept ready ended", "instance_id", st.ID, "state", st.State)
	}
}

// fillWarm ends a template's warm guests of another key, or beyond the
// count, and boots one when fewer than wanted are ready; it says whether
// it booted one.
func (a *Agent) fillWarm(ctx context.Context, c WarmConfig) bool {
	w := &a.warm
	rt := a.cfg.Runtime
	spec, why := a.warmSpec(c)
	ready := 0
	for _, r := range rt.Residents() {
		switch {
		case r.Template != c.Template:
		case why == "" && r.WarmKey != spec.WarmKey || ready >= c.Count:
			// Of another template build, Platform or size (without a
			// key now, the template or Platform unreadable for the
			// moment, none is judged stale), or beyond a lowered count.
			if err := rt.EndResident(ctx, r); err != nil {
				a.log.Warn("warm guest not ended", "instance_id", r.ID, "err", err)
			} else {
				a.log.Info("warm guest ended: of another template build, Platform or size, or beyond the count", "template", c.Template, "instance_id", r.ID)
			}
		default:
			ready++
		}
	}
	w.mu.Lock()
	st := w.templates[c.Template]
	st.Ready, st.Error = ready, truncate(cmp.Or(why, st.bootErr), 1000)
	retryAt := st.retryAt
	w.mu.Unlock()
	if why != "" || ready >= c.Count || time.Now().Before(retryAt) {
		return false
	}
	a.mu.Lock()
	draining := a.draining
	a.mu.Unlock()
	if draining || a.sampler.Latest().MemoryTight {
		return false
	}
	t0 := time.Now()
	r, err := rt.BootResident(ctx, spec)
	w.mu.Lock()
	if err != nil {
		st.backoff = min(max(2*st.backoff, warmRetry), warmRetryMax)
		st.retryAt, st.bootErr = time.Now().Add(st.backoff), err.Error()
		st.Error = truncate(st.bootErr, 1000)
	} else {
		st.backoff, st.retryAt, st.bootErr = 0, time.Time{}, ""
		st.Ready, st.Error = ready+1, ""
	}
	w.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			a.log.Error("warm guest not made", "template", c.Template, "err", err)
		}
		return false
	}
	a.log.Info("warm guest ready", "template", c.Template, "instance_id", r.ID, "ready", ready+1, "wanted", c.Count, "took", time.Since(t0).Round(time.Millisecond))
	return true
}

// warmGuestsFor lists the warm guests ready for the first start of a
// Workspace that would boot spec's template, Platform and size.
func (a *Agent) warmGuestsFor(spec runtime.Spec, tpl *template.Template) []runtime.Resident {
	if a.warmFor(tpl.Name) == nil {
		return nil
	}
	key := warmKey(tpl, spec.Installation.ID, spec.VCPUs, spec.MemoryMiB)
	return slices.DeleteFunc(a.cfg.Runtime.Residents(), func(r runtime.Resident) bool { return r.WarmKey != key })
}

// warmTaken counts a start that adopted a warm guest (or failed to) and
// has another made.
func (a *Agent) warmTaken(name string, started bool) {
	w := &a.warm
	w.mu.Lock()
	if st := w.templates[name]; st != nil {
		st.Ready = max(st.Ready-1, 0)
		if started {
			st.Starts++
		}
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// WarmGuests are the node's warm guests, by template (metrics).
func (a *Agent) WarmGuests() []api.WarmGuests { return a.warmReport() }

// warmReport is the report's list of warm guests, by template.
func (a *Agent) warmReport() []api.WarmGuests {
	w := &a.warm
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []api.WarmGuests
	for _, st := range w.templates {
		out = append(out, st.WarmGuests)
	}
	slices.SortFunc(out, func(x, y api.WarmGuests) int { return strings.Compare(x.Template, y.Template) })
	return out
}

// initWarm checks the configuration and sets up the report's entries.
func (a *Agent) initWarm() error {
	w := &a.warm
	w.wake = make(chan struct{}, 1)
	w.templates = map[string]*warmTemplate{}
	for _, c := range a.cfg.Warm {
		switch {
		case api.ValidTemplateName(c.Template) != nil:
			return fmt.Errorf("warm guests of template %q: %w", c.Template, api.ValidTemplateName(c.Template))
		case w.templates[c.Template] != nil:
			return fmt.Errorf("warm guests of template %s: configured twice", c.Template)
		case c.Count < 0 || c.Count > api.MaxWarmGuests:
			return fmt.Errorf("warm guests of template %s: warm = %d: want 0 to %d", c.Template, c.Count, api.MaxWarmGuests)
		case c.VCPUs < 1 || c.MemoryMiB < 64:
			return fmt.Errorf("warm guests of template %s: %d vCPUs and %d MiB: want at least 1 and 64 MiB", c.Template, c.VCPUs, c.MemoryMiB)
		}
		w.templates[c.Template] = &warmTemplate{WarmGuests: api.WarmGuests{Template: c.Template, Wanted: c.Count, CPU: api.Milli(c.VCPUs * 1000), MemoryBytes: uint64(c.MemoryMiB) << 20}}
	}
	if len(a.cfg.Warm) > api.MaxWarmTemplates {
		return fmt.Errorf("warm guests of %d templates: at most %d", len(a.cfg.Warm), api.MaxWarmTemplates)
	}
	return nil
}

// truncate cuts s to at most n bytes (a report bounds its errors).
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
