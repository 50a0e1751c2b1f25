package runtime

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A guest's launch-time configuration is what it was told since it
// booted: its network (the launch record's, with this node run's DNS)
// and LaunchRecord.Configured, the hostname and mounts. A guest restarts
// inside its VMM (a reboot, or a panic: panic=-1 resets it), whether or
// not a node runs: the first session that finds a new boot id tells it
// all of that again before anything else reaches it (syncGuest).

// Configure tells the running guest of Instance id req, hostname, mounts
// and environment only, and records it: a restart of the guest is told it
// again.
func (rt *Runtime) Configure(ctx context.Context, id string, req guestproto.ConfigureRequest) error {
	if len(req.Interfaces) > 0 || len(req.DNS) > 0 {
		return fmt.Errorf("runtime: instance %s: its network is configured from its network record, not by Configure", id)
	}
	in, err := rt.get(id)
	if err != nil {
		return err
	}
	c, err := rt.Guest(id)
	if err != nil {
		return err
	}
	if err := guestTakes(c.Info(), req); err != nil {
		return fmt.Errorf("runtime: instance %s: %w", id, err)
	}
	if err := c.Configure(ctx, req); err != nil {
		return err
	}
	return rt.recordConfigured(in, req)
}

// recordConfigured adds req, told to the guest of in, to its launch
// record's Configured.
func (rt *Runtime) recordConfigured(in *instance, req guestproto.ConfigureRequest) error {
	if req.Hostname == "" && len(req.Mounts) == 0 && req.Env == nil {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	rec := *in.rec
	rec.Configured = mergeConfigured(rec.Configured, req)
	if err := WriteLaunchRecord(in.paths.Dir, &rec); err != nil {
		return fmt.Errorf("runtime: instance %s: record its configuration: %w", in.id, err)
	}
	in.rec = &rec
	return nil
}

// Finish records that the Staged start of Instance id is done: a node
// restart from now on takes it over as started.
func (rt *Runtime) Finish(id string) error {
	in, err := rt.get(id)
	if err != nil {
		return err
	}
	return rt.finish(in)
}

// finish clears the Unfinished mark of in's launch record.
func (rt *Runtime) finish(in *instance) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.rec.Unfinished {
		return nil
	}
	rec := *in.rec
	rec.Unfinished = false
	if err := WriteLaunchRecord(in.paths.Dir, &rec); err != nil {
		return fmt.Errorf("runtime: instance %s: record its start done: %w", in.id, err)
	}
	in.rec = &rec
	return nil
}

// mergeConfigured is have with req told after it: a hostname replaces
// the one before, a mount replaces one at the same target and otherwise
// comes after those before (a mount under another's target must find
// that one mounted); an environment replaces the one before, as in the
// guest.
func mergeConfigured(have *guestproto.ConfigureRequest, req guestproto.ConfigureRequest) *guestproto.ConfigureRequest {
	out := guestproto.ConfigureRequest{}
	if have != nil {
		out.Hostname, out.Mounts, out.Env = have.Hostname, slices.Clone(have.Mounts), have.Env
	}
	if req.Hostname != "" {
		out.Hostname = req.Hostname
	}
	if req.Env != nil {
		out.Env = slices.Clone(req.Env)
	}
	for _, m := range req.Mounts {
		out.Mounts = slices.DeleteFunc(out.Mounts, func(x guestproto.Mount) bool { return x.Target == m.Target })
		out.Mounts = append(out.Mounts, m)
	}
	return &out
}

// Bounds of a recorded configuration read from a snapshot (a shared
// pool holds it): a hostname as the kernel takes one, mounts as many as a
// Workspace can have.
const (
	maxHostname          = 64
	maxConfiguredMounts  = 256
	maxConfiguredPathLen = 4096
)

// checkConfigured says what is wrong with a recorded configuration, nil
// if nothing.
func checkConfigured(c *guestproto.ConfigureRequest) error {
	if c == nil {
		return nil
	}
	if len(c.Interfaces) > 0 || len(c.DNS) > 0 {
		return errors.New("recorded configuration holds a network: it comes from the network record")
	}
	if len(c.Hostname) > maxHostname || strings.ContainsAny(c.Hostname, "/\x00 ") {
		return fmt.Errorf("recorded hostname %q is not one", c.Hostname)
	}
	if err := api.CheckWorkspaceEnv("recorded configuration", c.Env); err != nil {
		return err
	}
	if len(c.Mounts) > maxConfiguredMounts {
		return fmt.Errorf("recorded configuration has %d mounts, over %d", len(c.Mounts), maxConfiguredMounts)
	}
	for _, m := range c.Mounts {
		if m.Source == "" || len(m.Source) > maxConfiguredPathLen || len(m.Target) > maxConfiguredPathLen ||
			!path.IsAbs(m.Target) || path.Clean(m.Target) != m.Target || len(m.Options) > 16 {
			return fmt.Errorf("recorded mount %q on %q is not one a guest is told", m.Source, m.Target)
		}
	}
	return nil
}

// restarted says whether the guest that answered c is not the one the
// launch record claims: it booted again since.
func restarted(rec *LaunchRecord, c *guestproto.Client) bool {
	return rec.Guest != nil && rec.Guest.BootID != c.Info().BootID
}

// reconfigureRestarted tells a guest that restarted its launch-time
// configuration and then claims it: the launch record names its new boot.
func (rt *Runtime) reconfigureRestarted(ctx context.Context, in *instance, c *guestproto.Client, rec *LaunchRecord) error {
	t0 := time.Now()
	if rec.Network != nil {
		if err := c.Configure(ctx, guestNetwork(rec.Network)); err != nil {
			return fmt.Errorf("configure the restarted guest's network: %w", err)
		}
	}
	if cfg := rec.Configured; cfg != nil {
		if err := c.Configure(ctx, *cfg); err != nil {
			return fmt.Errorf("configure the restarted guest: %w", err)
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	claimed := *in.rec
	claimed.Guest = guestRecord(c.Info())
	if err := WriteLaunchRecord(in.paths.Dir, &claimed); err != nil {
		return fmt.Errorf("record the restarted guest: %w", err)
	}
	in.rec = &claimed
	mounts, env := 0, 0
	if rec.Configured != nil {
		mounts, env = len(rec.Configured.Mounts), len(rec.Configured.Env) // a count: the values may be secrets
	}
	rt.log.Warn("instance guest restarted; reconfigured with the launch-time configuration", "instance_id", in.id,
		"boot_id", claimed.Guest.BootID, "previous_boot_id", rec.Guest.BootID, "network", rec.Network != nil, "mounts", mounts, "env", env,
		"took", time.Since(t0).Round(time.Millisecond))
	return nil
}
