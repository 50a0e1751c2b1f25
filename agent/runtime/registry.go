package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// VolumeCommandsFile is the node's record of the Volume, writable layer
// and Template preparation commands it executed, in the registry
// directory beside the ended-Instance records (the process-model seed);
// the node's agent keeps it.
const VolumeCommandsFile = "volume-commands.json"

// RegistryDir is the directory of the ended-Instance records under a
// storage root.
func RegistryDir(storageRoot string) string { return filepath.Join(storageRoot, "runtime", "registry") }

// Ended returns up to max records of ended Instances, oldest first: what
// the node reports so ctrl can store each cleanup conclusion and then
// have the record deleted (ForgetEnded).
func (rt *Runtime) Ended(max int) ([]EndedRecord, error) {
	names, err := os.ReadDir(rt.registryDir)
	if err != nil {
		return nil, fmt.Errorf("runtime: registry %s: %w", rt.registryDir, err)
	}
	var out []EndedRecord
	var errs []error
	for _, e := range names {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".json") || strings.HasPrefix(n, ".") || n == VolumeCommandsFile {
			continue
		}
		r, err := ReadEndedRecord(filepath.Join(rt.registryDir, n))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].EndedAt.Equal(out[j].EndedAt) {
			return out[i].EndedAt.Before(out[j].EndedAt)
		}
		return out[i].InstanceID < out[j].InstanceID
	})
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return out, errors.Join(errs...)
}

// EndedCount is how many ended-Instance records wait in the registry for
// ctrl to conclude them (the upgrade seed's
// kibotos_node_instances{state="destroyed"}); only names are read.
func (rt *Runtime) EndedCount() int {
	names, err := os.ReadDir(rt.registryDir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range names {
		if name := e.Name(); !e.IsDir() && strings.HasSuffix(name, ".json") && !strings.HasPrefix(name, ".") && name != VolumeCommandsFile {
			n++
		}
	}
	return n
}

// ForgetEnded deletes the records of ended Instances once ctrl stored
// their cleanup conclusion. Unknown ids are ignored.
func (rt *Runtime) ForgetEnded(ids []string) error {
	var errs []error
	for _, id := range ids {
		if !idRE.MatchString(id) {
			errs = append(errs, fmt.Errorf("runtime: forget ended instance %q: not an instance id", id))
			continue
		}
		if err := os.Remove(filepath.Join(rt.registryDir, id+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
