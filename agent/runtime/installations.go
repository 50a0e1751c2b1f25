package runtime

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/vmm/platform"
)

// ErrInstallationUnavailable ends the error of an Instance whose runtime
// installation this build cannot keep (process-model seed).
const ErrInstallationUnavailable = "compatible runtime installation unavailable"

// release is the build release installations are judged against.
func (rt *Runtime) release() string {
	if rt.cfg.Release != nil {
		return *rt.cfg.Release
	}
	return buildinfo.Release
}

// InstallationProblem says why a node of release whose own Platform is
// ownID cannot keep the runtime installation in dir: it is missing or
// broken, a file's digest differs from installation.json, or its guest
// agent is of a release outside what the build drives. "" when it can.
func InstallationProblem(dir, ownID, release string) string {
	in, err := platform.Load(dir)
	if err != nil {
		return err.Error()
	}
	if err := in.Verify(); err != nil {
		return err.Error()
	}
	if err := platform.Drivable(in, ownID, release); err != nil {
		return fmt.Sprintf("platform %s: %v", in.ID, err)
	}
	return ""
}

// installationChecks are InstallationProblem of the installations the
// launch records of running Instances name, each computed once and in
// parallel: dir -> why not ("" when kept).
type installationChecks struct {
	done    chan struct{}
	results map[string]string
}

// startInstallationChecks starts checking the installation of every
// launch record that says its VMM runs. Records it cannot read are left
// to takeover, which reports them.
func (rt *Runtime) startInstallationChecks() *installationChecks {
	c := &installationChecks{done: make(chan struct{}), results: map[string]string{}}
	dirs := map[string]bool{}
	ents, _ := os.ReadDir(rt.instancesDir)
	for _, e := range ents {
		rec, err := ReadLaunchRecord(filepath.Join(rt.instancesDir, e.Name(), LaunchRecordFile))
		if err == nil && rec.Process != nil && rec.Stopped == nil && rec.InstallationDir != "" {
			dirs[rec.InstallationDir] = true
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for dir := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			why := InstallationProblem(dir, rt.cfg.OwnInstallation, rt.release())
			mu.Lock()
			c.results[dir] = why
			mu.Unlock()
		}()
	}
	go func() {
		wg.Wait()
		close(c.done)
	}()
	return c
}

// installationFailures judges the installations of the running Instances
// among verdicts, each installation once: dir -> why not ("" when kept).
func (rt *Runtime) installationFailures(verdicts []verdict) map[string]string {
	out := map[string]string{}
	if c := rt.installations; c != nil {
		<-c.done
		maps.Copy(out, c.results)
	}
	for _, v := range verdicts {
		dir := v.rec.InstallationDir
		if _, seen := out[dir]; seen || dir == "" || (v.state != StateRunning && v.state != StateStarting) {
			continue
		}
		out[dir] = InstallationProblem(dir, rt.cfg.OwnInstallation, rt.release())
	}
	return out
}

// removeUnusedInstallations deletes runtime installations that no Instance
// record references and the caller did not ask to keep. It runs after
// takeover: an Instance that failed its takeover keeps its record, so its
// installation stays for the operator's stop --force and restart.
func (rt *Runtime) removeUnusedInstallations() {
	dir := platform.InstallationsDir(rt.cfg.StorageRoot)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return // no installations yet
	}
	used := map[string]bool{}
	for _, id := range append(rt.cfg.KeepInstallations, rt.cfg.OwnInstallation) {
		used[id] = true
	}
	rt.mu.Lock()
	for _, in := range rt.instances {
		in.mu.Lock()
		if in.rec != nil {
			used[in.rec.InstallationID] = true
			used[filepath.Base(in.rec.InstallationDir)] = true
		}
		in.mu.Unlock()
	}
	rt.mu.Unlock()
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, "sha256-") || used[name] {
			continue // temp build dirs and caches belong to their builders
		}
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			rt.log.Warn("unused runtime installation not removed", "installation", name, "err", err)
			continue
		}
		rt.log.Info("unused runtime installation removed", "installation", name)
	}
}
