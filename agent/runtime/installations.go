package runtime

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/kibotos/kibotos/vmm/platform"
)

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
	for _, id := range rt.cfg.KeepInstallations {
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
