package cli

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/api"
)

// VolumeCmd groups the Volume commands. A Volume is a block file in a
// storage pool that a Workspace's guest mounts; it outlives the Workspace.
type VolumeCmd struct {
	Create VolumeCreateCmd `cmd:"" help:"Create a Volume in a storage pool (--pool), on a node's default pool (--node), or where the scheduler finds room."`
	List   VolumeListCmd   `cmd:"" help:"List Volumes: state, size, pool, node and the Workspace each is attached to."`
	Get    VolumeGetCmd    `cmd:"" help:"Show one Volume, with an expansion that has not completed."`
	Resize VolumeResizeCmd `cmd:"" help:"Grow a Volume; a running Workspace's guest sees the new size at once."`
	Delete VolumeDeleteCmd `cmd:"" help:"Delete a detached Volume and its file."`
}

func volumePath(ref string, verb ...string) string {
	p := "/v1/volumes/" + url.PathEscape(ref)
	if len(verb) > 0 {
		p += "/" + verb[0]
	}
	return p
}

// VolumeCreateCmd is `volume create`.
type VolumeCreateCmd struct {
	WaitFlags
	Name      string `arg:"" name:"name" help:"Name: 1-63 lowercase letters, digits, '.' or '-'."`
	Size      string `name:"size" required:"" help:"Size, such as 10GiB (whole MiB, 16MiB to 16TiB)."`
	Pool      string `name:"pool" help:"Storage pool (kibo storage-pool list); default: the node's default pool."`
	Node      string `name:"node" help:"Node that makes the file; with --pool one of its members."`
	CommandID string `name:"command-id" help:"Idempotency key: a retry with the same key and inputs returns the same Volume."`
	Quiet     bool   `short:"q" name:"quiet" help:"Print only the new Volume's ID."`
	NoWait    bool   `name:"no-wait" help:"Return once ctrl accepted the Volume instead of when it is AVAILABLE."`
}

func (c *VolumeCreateCmd) Run(g *Globals) error {
	size, err := parseSize(c.Size)
	if err != nil {
		return usagef("volume %s: --size %q: %v", c.Name, c.Size, err)
	}
	var v api.Volume
	req := api.VolumeCreateRequest{WriteMeta: writeMeta(c.CommandID, nil), Name: c.Name, SizeBytes: size, PoolID: c.Pool, NodeID: c.Node}
	raw, err := g.call("POST", "/v1/volumes", req, &v)
	if err != nil {
		return err
	}
	if !c.NoWait {
		final, err := pollVolume(g, v.VolumeID, func(v *api.Volume) (bool, error) {
			switch {
			case v == nil:
				return false, fmt.Errorf("volume %s is gone", c.Name)
			case v.State == api.VolumeFailed:
				return false, exitError{api.ExitFailedPrecondition, fmt.Sprintf("volume %s is FAILED: %s; delete it with kibo volume delete %s", v.Name, v.Error, v.Name)}
			}
			return v.State == api.VolumeAvailable, nil
		})
		if err != nil {
			return err
		}
		v, raw = *final, nil
	}
	return printVolumeResult(g, raw, &v, c.Quiet, "created")
}

// printVolumeResult prints the outcome of a write like
// printWorkspaceResult does for Workspaces.
func printVolumeResult(g *Globals, raw []byte, v *api.Volume, quiet bool, verb string) error {
	switch {
	case quiet:
		g.printf("%s\n", v.VolumeID)
	case g.JSON && raw != nil:
		return g.printJSON(raw)
	case g.JSON:
		return printResult(g, v)
	default:
		g.printf("volume %s (%s) %s: %s, %s in pool %s (version %d)\n", v.Name, v.VolumeID, verb, v.State, formatBytes(v.SizeBytes), v.PoolID, v.Version)
	}
	return nil
}

// pollVolume reads the Volume until settled says it is done (v is nil
// once it no longer exists) and gives up after --timeout (exit 16).
func pollVolume(g *Globals, ref string, settled func(v *api.Volume) (bool, error)) (*api.Volume, error) {
	return pollObject(g, volumePath(ref), func(v *api.Volume) uint64 { return v.Version }, settled, func(v *api.Volume) error {
		still := v.State
		if p := v.Pending; p != nil {
			still += fmt.Sprintf(" with its %s pending on node %s", p.Kind, p.NodeID)
		}
		return exitError{api.ExitTimedOut, fmt.Sprintf("volume %s is still %s after %s; it goes on in the background: check with kibo volume get %s", ref, still, g.Timeout, ref)}
	})
}

// VolumeListCmd is `volume list`.
type VolumeListCmd struct {
	Pool      string `name:"pool" help:"Only the Volumes of this storage pool."`
	Workspace string `name:"workspace" help:"Only the Volumes attached to this Workspace."`
	PageSize  int    `name:"page-size" default:"0" help:"Volumes per page (0: all)."`
	PageToken string `name:"page-token" help:"Continue after a previous page."`
	Wide      bool   `name:"wide" help:"Add the ID, MOUNT, HELD and VERSION columns."`
	Quiet     bool   `short:"q" name:"quiet" help:"Print only the Volume IDs."`
}

func (c *VolumeListCmd) Run(g *Globals) error {
	q := url.Values{}
	if c.Pool != "" {
		q.Set("pool", c.Pool)
	}
	if c.Workspace != "" {
		q.Set("workspace", c.Workspace)
	}
	path := "/v1/volumes"
	var out api.VolumeList
	return runList(g, listCall{path: path, filter: q, size: c.PageSize, token: c.PageToken, quiet: c.Quiet, what: "Volumes"}, &out,
		func() ([]string, string) {
			ids := make([]string, len(out.Volumes))
			for i, v := range out.Volumes {
				ids[i] = v.VolumeID
			}
			return ids, out.NextPageToken
		},
		func() {
			header := []string{"NAME", "STATE", "SIZE", "POOL", "NODE", "WORKSPACE"}
			if c.Wide {
				header = append([]string{"ID"}, append(header, "MOUNT", "HELD", "VERSION")...)
			}
			t := newTable(g.stdout, g.namespaceFirst("NAMESPACE", header)...)
			for i := range out.Volumes {
				v := &out.Volumes[i]
				row := []string{v.Name, volumeState(v), formatBytes(v.SizeBytes), dash(v.PoolID), dash(v.NodeID), dash(v.WorkspaceID)}
				if c.Wide {
					row = append([]string{v.VolumeID}, append(row, dash(v.MountPath), strconv.FormatBool(v.Held), strconv.FormatUint(v.Version, 10))...)
				}
				t.row(g.namespaceFirst(api.ShownNamespace(v.Namespace), row)...)
			}
			t.flush()
		})
}

// volumeState is the STATE column: the state, with a resize that has not
// completed.
func volumeState(v *api.Volume) string {
	if x := v.Expansion; x != nil {
		if x.FilesystemPending {
			return v.State + "(filesystem-grow-pending)"
		}
		return v.State + "(expanding)"
	}
	return v.State
}

// VolumeGetCmd is `volume get`.
type VolumeGetCmd struct {
	Volume string `arg:"" name:"volume" help:"Volume name or ID."`
}

func (c *VolumeGetCmd) Run(g *Globals) error {
	var v api.Volume
	raw, err := g.call("GET", volumePath(c.Volume), nil, &v)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	line := func(label, format string, args ...any) {
		g.printf("%-14s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	line("ID", "%s", v.VolumeID)
	line("Name", "%s", v.Name)
	line("Namespace", "%s", api.ShownNamespace(v.Namespace))
	line("State", "%s", v.State)
	line("Size", "%s", formatBytes(v.SizeBytes))
	if x := v.Expansion; x != nil {
		if x.FilesystemPending {
			line("Expansion", "the file is %s; the guest's filesystem grows at its next mount (the online grow did not complete: %s)", formatBytes(x.TargetBytes), dash(x.Reason))
		} else {
			line("Expansion", "to %s, in progress since %s", formatBytes(x.TargetBytes), stamp(x.Since))
		}
	}
	sharing := "standalone"
	if v.Shared {
		sharing = "shared"
	}
	line("Pool", "%s (%s)", dash(v.PoolID), sharing)
	node := dash(v.NodeID)
	if v.Held {
		node += " (in use)"
	}
	line("Node", "%s", node)
	if v.WorkspaceID != "" {
		line("Workspace", "%s at %s", v.WorkspaceID, v.MountPath)
	} else {
		line("Workspace", "-")
	}
	if !v.Made && v.State == api.VolumeCreating && v.Pending == nil {
		line("File", "made by the first start of its Workspace")
	}
	if p := v.Pending; p != nil {
		line("Pending", "%s on node %s since %s", p.Kind, p.NodeID, stamp(p.IssuedAt))
	}
	if p := v.DeleteWaitsForPool; p != "" {
		line("Delete waits", "for a node that reaches pool %s to remove the file (the node comes back, the pool's disk moves to another host, or kibo storage-pool declare-lost %s)", p, p)
	}
	if v.Error != "" {
		line("Error", "%s", v.Error)
	}
	line("Version", "%d", v.Version)
	line("Created", "%s", stamp(v.CreatedAt))
	line("Updated", "%s", stamp(v.UpdatedAt))
	return nil
}

// VolumeResizeCmd is `volume resize`.
type VolumeResizeCmd struct {
	WaitFlags
	Volume          string  `arg:"" name:"volume" help:"Volume name or ID."`
	Size            string  `name:"size" required:"" help:"New size, such as 20GiB: larger than now (a Volume only grows)."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Volume must still be at."`
	NoWait          bool    `name:"no-wait" help:"Return once ctrl accepted the resize instead of when its node completed it."`
}

func (c *VolumeResizeCmd) Run(g *Globals) error {
	size, err := parseSize(c.Size)
	if err != nil {
		return usagef("volume %s: --size %q: %v", c.Volume, c.Size, err)
	}
	var v api.Volume
	raw, err := g.call("POST", volumePath(c.Volume, "resize"), api.VolumeResizeRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), SizeBytes: size}, &v)
	if err != nil {
		return err
	}
	if !c.NoWait && v.Pending != nil {
		final, err := pollVolume(g, v.VolumeID, func(cur *api.Volume) (bool, error) {
			switch {
			case cur == nil:
				return false, fmt.Errorf("volume %s was deleted", c.Volume)
			case cur.Pending != nil && cur.Pending.Kind == api.VolCmdResize:
				return false, nil
			case cur.SizeBytes < size:
				return false, exitError{api.ExitFailedPrecondition, fmt.Sprintf("volume %s was not resized: %s", cur.Name, dash(cur.Error))}
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		v, raw = *final, nil
	}
	if err := printVolumeResult(g, raw, &v, false, "resized"); err != nil || g.JSON {
		return err
	}
	if x := v.Expansion; x != nil && x.FilesystemPending {
		g.note("volume %s: the guest's filesystem grows at its next mount: %s\n", v.Name, dash(x.Reason))
	}
	return nil
}

// VolumeDeleteCmd is `volume delete`.
type VolumeDeleteCmd struct {
	WaitFlags
	Volume          string  `arg:"" name:"volume" help:"Volume name or ID."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Volume must still be at."`
	NoWait          bool    `name:"no-wait" help:"Return once ctrl accepted the delete instead of when the file is gone."`
}

func (c *VolumeDeleteCmd) Run(g *Globals) error {
	var v api.Volume
	raw, err := g.call("POST", volumePath(c.Volume, "delete"), writeMeta(c.CommandID, c.ExpectedVersion), &v)
	if err != nil {
		return err
	}
	if v.DeletedAt == nil && !c.NoWait && v.DeleteWaitsForPool == "" {
		final, err := pollVolume(g, v.VolumeID, func(cur *api.Volume) (bool, error) {
			switch {
			case cur == nil:
				return true, nil
			case cur.State == api.VolumeFailed:
				return false, exitError{api.ExitFailedPrecondition, fmt.Sprintf("volume %s was not deleted: %s; run kibo volume delete %s again", cur.Name, cur.Error, cur.Name)}
			}
			return false, nil
		})
		if err != nil {
			return err
		}
		if final == nil {
			if g.JSON {
				return printResult(g, map[string]string{"volume_id": v.VolumeID, "state": "DELETED"})
			}
			g.printf("volume %s (%s) deleted\n", v.Name, v.VolumeID)
			return nil
		}
	}
	if v.DeletedAt != nil && !g.JSON {
		g.printf("volume %s (%s) deleted\n", v.Name, v.VolumeID)
		return nil
	}
	return printVolumeResult(g, raw, &v, false, "deleting")
}

// parseMounts reads --volume VOL:/path and --new-volume SIZE:/path.
func parseMounts(vols, fresh []string) ([]api.VolumeAttach, []api.NewVolume, error) {
	var att []api.VolumeAttach
	var nv []api.NewVolume
	for _, s := range vols {
		ref, path, ok := strings.Cut(s, ":")
		if !ok || ref == "" || path == "" {
			return nil, nil, usagef("--volume %q: give VOLUME:/mount/path, such as data:/data", s)
		}
		att = append(att, api.VolumeAttach{Volume: ref, Path: path})
	}
	for _, s := range fresh {
		sz, path, ok := strings.Cut(s, ":")
		if !ok || sz == "" || path == "" {
			return nil, nil, usagef("--new-volume %q: give SIZE:/mount/path, such as 10GiB:/data", s)
		}
		size, err := parseSize(sz)
		if err != nil {
			return nil, nil, usagef("--new-volume %q: size %q: %v", s, sz, err)
		}
		nv = append(nv, api.NewVolume{SizeBytes: size, Path: path})
	}
	return att, nv, nil
}
