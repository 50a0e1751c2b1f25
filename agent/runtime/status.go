package runtime

import (
	"slices"
	"sort"
	"strings"

	"github.com/kibotos/kibotos/vmm/units"
)

// InstanceStatus is what List reports about one Instance.
type InstanceStatus struct {
	ID             string
	Unit           string
	State          State
	Error          string
	InstallationID string
	VCPUs          int
	MemoryMiB      int
	InvocationID   string
	MainPID        uint32
	HostPID        int
	// GuestResponding is false while the guest agent does not answer (after
	// a takeover the node keeps retrying with backoff).
	GuestResponding bool
	Guest           *GuestRecord
	// DeniedPackets are the packets of the guest its rule table dropped
	// by policy, as the node last read them (every Config.DeniedInterval).
	DeniedPackets uint64
	// DataSocket is the host end of the guest agent's data-plane channel
	// (absolute path), for the data-plane process to dial; "" when the
	// backend gives the guest none or this launch of the VMM predates it.
	// The node itself never connects to it.
	DataSocket string
	// LayerPath is the retained writable layer the VMM writes ("" none).
	LayerPath string
	// Volumes are the Volume disks the VMM was launched with.
	Volumes []VolumeDisk
	// Cgroup is the host path of the VMM unit's cgroup ("" unknown), where
	// the node reads the guest's CPU use.
	Cgroup string
}

// all are the Instances now, for a caller that then locks each one alone.
func (rt *Runtime) all() []*instance {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	ins := make([]*instance, 0, len(rt.instances))
	for _, in := range rt.instances {
		ins = append(ins, in)
	}
	return ins
}

// List returns every Instance with its state, sorted by ID.
func (rt *Runtime) List() []InstanceStatus {
	ins := rt.all()
	out := make([]InstanceStatus, 0, len(ins))
	for _, in := range ins {
		out = append(out, rt.statusOf(in))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Owned is List without the warm guests, which no Workspace owns.
func (rt *Runtime) Owned() []InstanceStatus {
	return slices.DeleteFunc(rt.List(), func(st InstanceStatus) bool { return IsWarm(st.ID) })
}

// Status is List for one Instance.
func (rt *Runtime) Status(id string) (InstanceStatus, error) {
	in, err := rt.get(id)
	if err != nil {
		return InstanceStatus{}, err
	}
	return rt.statusOf(in), nil
}

// statusOf is in's status with the host path of its cgroup.
func (rt *Runtime) statusOf(in *instance) InstanceStatus {
	st := in.status()
	if cg := in.controlGroup(); cg != "" && rt.units != nil {
		st.Cgroup = rt.units.CgroupPath(units.Unit{ControlGroup: cg})
	}
	return st
}

// dataSocket is sock if the VMM was launched with it on its command line:
// an Instance launched before the backend had a data channel, and taken
// over since, has none.
func dataSocket(sock string, vmmArgv []string) string {
	if sock == "" {
		return ""
	}
	for _, a := range vmmArgv {
		if strings.Contains(a, sock) {
			return sock
		}
	}
	return ""
}

// controlGroup is the VMM unit's cgroup as systemd names it, "" unknown.
func (in *instance) controlGroup() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	if p := in.rec.Process; p != nil {
		return p.ControlGroup
	}
	return ""
}

func (in *instance) status() InstanceStatus {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := InstanceStatus{
		ID:              in.id,
		Unit:            in.rec.Unit,
		State:           in.state,
		Error:           in.err,
		InstallationID:  in.rec.InstallationID,
		VCPUs:           in.rec.VCPUs,
		MemoryMiB:       in.rec.MemoryMiB,
		GuestResponding: in.guest != nil && in.responding,
		Guest:           in.rec.Guest,
		DeniedPackets:   in.denied.total,
		LayerPath:       in.rec.LayerPath,
		Volumes:         slices.Clone(in.rec.Volumes),
	}
	if p := in.rec.Process; p != nil {
		s.InvocationID, s.MainPID, s.HostPID = p.InvocationID, p.MainPID, p.HostPID
	}
	s.DataSocket = dataSocket(in.paths.DataSocket, in.rec.VMMArgv)
	return s
}
