package cli

import (
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
)

// WorkspaceCmd groups the Workspace commands.
type WorkspaceCmd struct {
	Create        WorkspaceCreateCmd        `cmd:"" help:"Create a Workspace from a template and start it on a node the scheduler picks (or --node)."`
	Start         WorkspaceStartCmd         `cmd:"" help:"Start a STOPPED or FAILED Workspace (a PAUSED one is resumed); each start gets a new Instance."`
	Stop          WorkspaceStopCmd          `cmd:"" help:"Stop a Workspace; its writable layer is kept. --force ends its Instance without a clean guest stop."`
	Pause         WorkspacePauseCmd         `cmd:"" help:"Save a running Workspace's memory and devices beside its writable layer and end its VM; resume brings it back as it was."`
	Resume        WorkspaceResumeCmd        `cmd:"" help:"Resume a PAUSED Workspace on its node or any node that reaches its pool and can restore it."`
	Delete        WorkspaceDeleteCmd        `cmd:"" help:"Delete a Workspace with its writable layer."`
	Get           WorkspaceGetCmd           `cmd:"" help:"Show one Workspace; the Node line is where it runs."`
	List          WorkspaceListCmd          `cmd:"" help:"List Workspaces (without --all: not the STOPPED ones)."`
	Move          WorkspaceMoveCmd          `cmd:"" help:"Stop a Workspace and start it on another node (no live migration)."`
	SetNetwork    WorkspaceSetNetworkCmd    `cmd:"" name:"set-network" help:"Change a Workspace's network policy (only the items given): stored at once when STOPPED, applied by its node when AVAILABLE."`
	CleanupStatus WorkspaceCleanupStatusCmd `cmd:"" name:"cleanup-status" help:"Show what the latest execution of a Workspace still holds."`
	Logs          WorkspaceLogsCmd          `cmd:"" help:"Show the machine log (guest console, or --vmm the VMM's log) of a Workspace's current or an ended Instance, from the node that keeps it."`
	Exec          WorkspaceExecCmd          `cmd:"" help:"Run a command in a Workspace through the data plane; its exit code becomes kibo's."`
	Terminal      WorkspaceTerminalCmd      `cmd:"" help:"Open an interactive shell in a Workspace."`
	Cp            WorkspaceCpCmd            `cmd:"" help:"Copy a file into or out of a Workspace (WS:PATH names the Workspace side)."`
	PortForward   WorkspacePortForwardCmd   `cmd:"" name:"port-forward" help:"Forward a local TCP port to a port inside a Workspace."`
}

func workspacePath(id string, verb ...string) string {
	p := "/v1/workspaces/" + url.PathEscape(id)
	if len(verb) > 0 {
		p += "/" + verb[0]
	}
	return p
}

// WorkspaceCreateCmd is `workspace create`.
type WorkspaceCreateCmd struct {
	Template  string            `name:"template" help:"Template name (kibotos template list); required unless --from."`
	From      string            `name:"from" placeholder:"WORKSPACE" help:"Fork this PAUSED Workspace: the new one restores its snapshot (copy-on-write of its writable layer and memory) with a new hostname, machine id and random state, on a node that can resume it; template, CPU and memory are the source's. The source stays PAUSED. Not for a Workspace with Volumes."`
	CPU       int               `name:"cpu" help:"Cores (default 1; a fork has its source's)."`
	Memory    string            `name:"memory" help:"Guest memory, e.g. 512MiB or 2GiB (default 512MiB; a fork has its source's)."`
	Label     map[string]string `name:"label" help:"Label KEY=VALUE; repeat for more."`
	Node      string            `name:"node" help:"Place on this node only; never falls back to another."`
	Egress    string            `name:"egress" placeholder:"none|public|NAME" help:"Outbound traffic: none (default), public, or the name of an Egress object."`
	Resolver  string            `name:"resolver" placeholder:"NAME" help:"Resolver object DNS queries go to; default: the deployment resolver."`
	Allow     []string          `name:"allow" placeholder:"CIDR|DOMAIN" help:"With --egress public: the allow list of CIDRs and domains (example.com, *.example.com); repeat or comma-separate. With any allow rule only those are reachable."`
	Deny      []string          `name:"deny" placeholder:"CIDR|DOMAIN" help:"With --egress public: the deny list of CIDRs and domains; repeat or comma-separate. Deny wins over allow."`
	Volume    []string          `name:"volume" placeholder:"VOLUME:/PATH" help:"Attach an existing Volume (name or ID) and mount it at PATH in the guest; repeat for more."`
	NewVolume []string          `name:"new-volume" placeholder:"SIZE:/PATH" help:"Create a Volume of SIZE along with the Workspace, in its node's default pool, mounted at PATH; repeat for more. It outlives the Workspace."`
	CommandID string            `name:"command-id" help:"Idempotency key: a retry with the same key and inputs returns the same Workspace."`
	Quiet     bool              `short:"q" name:"quiet" help:"Print only the new Workspace ID."`
	NoWait    bool              `name:"no-wait" help:"Return once ctrl accepted the Workspace instead of when it is AVAILABLE."`
}

func (c *WorkspaceCreateCmd) Run(g *Globals) error {
	req, err := c.request()
	if err != nil {
		return err
	}
	var ws api.Workspace
	raw, err := g.call("POST", "/v1/workspaces", req, &ws)
	if err != nil {
		return err
	}
	if !c.NoWait {
		final, err := waitWorkspace(g, ws.WorkspaceID, api.WorkspaceAvailable)
		if err != nil {
			return err
		}
		ws = *final
		raw = nil
	}
	return printWorkspaceResult(g, raw, &ws, c.Quiet, "created")
}

// request is the create request the flags ask for: a fork takes its
// template, CPU and memory from its source.
func (c *WorkspaceCreateCmd) request() (api.WorkspaceCreateRequest, error) {
	req := api.WorkspaceCreateRequest{WriteMeta: writeMeta(c.CommandID, nil), Labels: c.Label, NodeID: c.Node,
		Network: createPolicy(c.Egress, c.Resolver, c.Allow, c.Deny), From: c.From}
	if c.From != "" {
		switch {
		case c.Template != "":
			return req, usagef("--template with --from: a fork runs its source's template; leave --template out")
		case c.CPU != 0 || c.Memory != "":
			return req, usagef("--cpu or --memory with --from: a snapshot restores only into the vCPUs and memory it was saved with; leave them out")
		case len(c.Volume) > 0 || len(c.NewVolume) > 0:
			return req, usagef("--volume or --new-volume with --from: a restored guest must have the devices it was saved with; attach none")
		}
		return req, nil
	}
	if c.Template == "" {
		return req, usagef("--template is required (or --from WORKSPACE to fork a paused one)")
	}
	if c.CPU == 0 {
		c.CPU = 1
	}
	if c.Memory == "" {
		c.Memory = "512MiB"
	}
	mem, err := parseSize(c.Memory)
	if err != nil {
		return req, usagef("--memory %q: %v", c.Memory, err)
	}
	if c.CPU < 0 {
		return req, usagef("--cpu %d: give a whole number of cores of at least 1", c.CPU)
	}
	vols, fresh, err := parseMounts(c.Volume, c.NewVolume)
	if err != nil {
		return req, err
	}
	req.Template, req.CPU, req.MemoryBytes, req.Volumes, req.NewVolumes = c.Template, api.Milli(c.CPU*1000), mem, vols, fresh
	return req, nil
}

// printWorkspaceResult prints the outcome of a write: the ID with -q, the
// API answer with --json, else one line.
func printWorkspaceResult(g *Globals, raw []byte, ws *api.Workspace, quiet bool, verb string) error {
	switch {
	case quiet:
		g.printf("%s\n", ws.WorkspaceID)
	case g.JSON && raw != nil:
		return g.printJSON(raw)
	case g.JSON:
		return printResult(g, ws)
	default:
		where := ""
		if ws.NodeID != "" {
			where = " on node " + ws.NodeID
		}
		g.printf("workspace %s %s: %s%s (version %d)\n", ws.WorkspaceID, verb, ws.State, where, ws.Version)
	}
	return nil
}

// waitWorkspace polls until the Workspace is in want (or gone when want
// is ""), fails on FAILED, and gives up after --timeout (exit 16).
func waitWorkspace(g *Globals, id, want string) (*api.Workspace, error) {
	if want == api.WorkspaceAvailable {
		// A start may first fetch the template or Platform, or the
		// archive it imports: a bar on a terminal while it does.
		stop := g.following("workspace "+id, "", workspacePath(id, "progress"))
		defer stop()
	}
	return pollWorkspace(g, id, func(ws *api.Workspace) (bool, error) {
		switch {
		case ws == nil:
			return want == "", nil
		case ws.State == want:
			return true, nil
		case ws.State == api.WorkspaceFailed:
			return false, failedError(ws)
		}
		return false, nil
	})
}

// failedError is exit 13 with why the Workspace is FAILED; 15
// (resource_exhausted) when the nodes refused to start it and no other
// has room, as for a create or start ctrl can place nowhere.
func failedError(ws *api.Workspace) error {
	msg := "workspace " + ws.WorkspaceID + " is FAILED"
	f := ws.Failure
	if f == nil {
		return exitError{api.ExitFailedPrecondition, msg}
	}
	if f.Reason == api.FailureResourceExhausted {
		return exitError{api.ExitResourceExhausted, "workspace " + ws.WorkspaceID + " has no node to run on (FAILED, " + f.Reason + "): " + f.Message}
	}
	return exitError{api.ExitFailedPrecondition, msg + " (" + f.Reason + "): " + f.Message}
}

// pollWorkspace reads the Workspace until settled says it is done (ws is
// nil once it no longer exists) or fails, and gives up after --timeout
// (exit 16).
func pollWorkspace(g *Globals, id string, settled func(ws *api.Workspace) (bool, error)) (*api.Workspace, error) {
	return pollObject(g, workspacePath(id), func(ws *api.Workspace) uint64 { return ws.Version }, settled, func(ws *api.Workspace) error {
		still := ws.State
		if p := ws.Pending; p != nil && p.Kind == api.WSCmdNetwork {
			still += " with its network change pending on node " + p.NodeID
		}
		return exitError{api.ExitTimedOut, fmt.Sprintf("workspace %s is still %s after %s; it goes on in the background: check with kibo workspace get %s", id, still, g.Timeout, id)}
	})
}

// pollObject reads the object at path until settled says it is done (nil
// once it no longer exists) or fails, and gives up after --timeout with
// timedOut's error. Reads block on the member until the version passes
// the one seen, so a change is seen the moment the member applies it.
func pollObject[T any](g *Globals, path string, version func(*T) uint64, settled func(*T) (bool, error), timedOut func(*T) error) (*T, error) {
	deadline := time.Now().Add(g.Timeout)
	var seen uint64
	for {
		var obj T
		wait := min(time.Until(deadline), 30*time.Second).Round(time.Millisecond)
		get := fmt.Sprintf("%s?wait_version=%d&wait=%s", path, seen, max(wait, 0))
		if seen == 0 {
			get = path
		}
		_, err := g.call("GET", get, nil, &obj)
		cur := &obj
		if api.CodeOf(err) == api.CodeNotFound {
			cur = nil
		} else if err != nil {
			return nil, err
		}
		done, serr := settled(cur)
		switch {
		case serr != nil:
			return nil, serr
		case done:
			return cur, nil
		case cur == nil:
			return nil, err // gone, and the caller waited for something else
		}
		if !time.Now().Before(deadline) {
			return nil, timedOut(cur)
		}
		if g.ctx.Err() != nil {
			return nil, g.ctx.Err()
		}
		seen = version(cur)
	}
}

// WorkspaceStartCmd is `workspace start`.
type WorkspaceStartCmd struct {
	ID              string  `arg:"" name:"workspace"`
	Node            string  `name:"node" help:"Start on this node only; never falls back to another."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Workspace must still be at."`
	NoWait          bool    `name:"no-wait" help:"Return once ctrl accepted the start."`
}

func (c *WorkspaceStartCmd) Run(g *Globals) error {
	return workspaceWrite(g, c.ID, "start", api.WorkspaceWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), NodeID: c.Node}, api.WorkspaceAvailable, c.NoWait, "started")
}

// workspaceWrite posts a write and waits for the state it leads to.
func workspaceWrite(g *Globals, id, verb string, req api.WorkspaceWriteRequest, want string, noWait bool, done string) error {
	var ws api.Workspace
	raw, err := g.call("POST", workspacePath(id, verb), req, &ws)
	if err != nil {
		return err
	}
	if !noWait {
		final, err := waitWorkspace(g, id, want)
		if err != nil {
			return err
		}
		if final == nil { // deleted
			if g.JSON {
				return printResult(g, map[string]string{"workspace_id": id, "state": "DELETED"})
			}
			g.printf("workspace %s deleted\n", id)
			return nil
		}
		ws, raw = *final, nil
	}
	return printWorkspaceResult(g, raw, &ws, false, done)
}

// WorkspaceStopCmd is `workspace stop`.
type WorkspaceStopCmd struct {
	ID              string  `arg:"" name:"workspace"`
	Force           bool    `name:"force" help:"End the Instance without a clean guest stop (data not confirmed on disk); also for FAILED Workspaces."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Workspace must still be at."`
	NoWait          bool    `name:"no-wait" help:"Return once ctrl accepted the stop."`
}

func (c *WorkspaceStopCmd) Run(g *Globals) error {
	return workspaceWrite(g, c.ID, "stop", api.WorkspaceWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), Force: c.Force}, api.WorkspaceStopped, c.NoWait, "stopped")
}

// WorkspaceDeleteCmd is `workspace delete`.
type WorkspaceDeleteCmd struct {
	ID              string  `arg:"" name:"workspace"`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Workspace must still be at."`
	NoWait          bool    `name:"no-wait" help:"Return once ctrl accepted the delete."`
}

func (c *WorkspaceDeleteCmd) Run(g *Globals) error {
	return workspaceWrite(g, c.ID, "delete", api.WorkspaceWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion)}, "", c.NoWait, "deleting")
}

// WorkspaceGetCmd is `workspace get`.
type WorkspaceGetCmd struct {
	ID   string `arg:"" name:"workspace"`
	Wide bool   `name:"wide" help:"Add the current Instance."`
}

func (c *WorkspaceGetCmd) Run(g *Globals) error {
	var ws api.Workspace
	raw, err := g.call("GET", workspacePath(c.ID), nil, &ws)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	renderWorkspace(g.stdout, &ws, c.Wide)
	return nil
}

func renderWorkspace(w io.Writer, ws *api.Workspace, wide bool) {
	line := kv{w}.line
	line("ID", "%s", ws.WorkspaceID)
	line("State", "%s", ws.State)
	if f := ws.Failure; f != nil {
		if f.Stage != "" {
			line("Failure", "%s at %s: %s (%s)", f.Reason, f.Stage, f.Message, stamp(f.At))
		} else {
			line("Failure", "%s: %s (%s)", f.Reason, f.Message, stamp(f.At))
		}
	}
	line("Template", "%s", ws.Template)
	if ws.ForkedFrom != "" {
		line("Forked from", "%s", ws.ForkedFrom)
	}
	if ws.Platform != "" {
		line("Platform", "%s", ws.Platform)
	}
	line("CPU", "%s", ws.CPU)
	line("Memory", "%s", formatBytes(ws.MemoryBytes))
	line("Labels", "%s", dash(labelsColumn(ws.Labels)))
	pol := ws.Network.Effective()
	line("Egress", "%s", egressColumn(pol))
	resolver := pol.Resolver
	if resolver == "" {
		resolver = "default"
	}
	line("Resolver", "%s", resolver)
	line("Allow", "%s", dash(strings.Join(pol.Allow, ",")))
	line("Deny", "%s", dash(strings.Join(pol.Deny, ",")))
	if ws.GuestNotResponding {
		line("Guest", "not responding (the node retries and reconfigures it once it answers; if it never does: kibo workspace stop --force %s, then start)", ws.WorkspaceID)
	}
	if d := ws.Denied; d != nil {
		line("Denied packets", "%d (reported %s)", d.Packets, stamp(d.ReportedAt))
	}
	line("Node", "%s", dash(ws.NodeID))
	if wide {
		line("Instance", "%s", dash(ws.InstanceID))
	}
	layer := "-"
	if l := ws.Layer; l != nil {
		layer = fmt.Sprintf("pool %s of node %s", api.LayerPoolID(l), l.NodeID)
		switch {
		case l.Lost:
			layer = fmt.Sprintf("lost with pool %s (declare-lost): delete the Workspace", api.LayerPoolID(l))
		case l.Held:
			layer += " (in use)"
		}
		if l.SizeBytes > 0 {
			layer += ", up to " + formatBytes(l.SizeBytes)
		}
	}
	line("Writable layer", "%s", layer)
	if s := ws.Snapshot; s != nil {
		switch {
		case s.Discarded:
			line("Snapshot", "discarded by a stop; its files in pool %s go with the next start or the delete", s.PoolID)
		case s.From != "":
			line("Snapshot", "of workspace %s (%s in pool %s, taken at %s): the first start restores it", s.From, formatBytes(s.SizeBytes), s.PoolID, stamp(s.TakenAt))
		default:
			line("Snapshot", "%s in pool %s, taken on node %s at %s (QEMU %s, %s, %d MiB)", formatBytes(s.SizeBytes), s.PoolID, s.NodeID, stamp(s.TakenAt), s.Compat.QEMUVersion, s.Compat.Accel, s.Compat.MemoryMiB)
		}
	}
	if e := ws.LastError; e != nil {
		line("Last error", "%s failed at %s: %s", e.Reason, stamp(e.At), e.Message)
	}
	label := "Volumes"
	for _, m := range ws.Volumes {
		line(label, "%s at %s (%s)", m.Name, m.Path, m.VolumeID)
		label = "" // one label for the list
	}
	if p := ws.DeleteWaitsForPool; p != "" {
		line("Delete waits", "for a node that reaches pool %s to remove the files (the node comes back, the pool's disk moves to another host, or kibo storage-pool declare-lost %s)", p, p)
	}
	if p := ws.Pending; p != nil {
		line("Pending", "%s on node %s since %s", p.Kind, p.NodeID, stamp(p.IssuedAt))
		if p.Network != nil {
			line("Requested", "%s", policySummary(p.Network.Effective()))
		}
	}
	if c := ws.NetworkChange; c != nil && c.Outcome != "ok" {
		line("Network change", "failed on node %s at %s: %s", c.NodeID, stamp(c.At), c.Error)
	}
	if ws.StopUnconfirmed {
		line("Last stop", "not confirmed to have reached disk")
	}
	line("Version", "%d", ws.Version)
	line("Created", "%s", stamp(ws.CreatedAt))
	line("Updated", "%s", stamp(ws.UpdatedAt))
}

func labelsColumn(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}

// WorkspaceListCmd is `workspace list`.
type WorkspaceListCmd struct {
	State     []string          `name:"state" help:"Only these states (repeat or comma-separate)."`
	Label     map[string]string `name:"label" help:"Only Workspaces with label KEY=VALUE; repeat: all must match."`
	Pool      string            `name:"pool" help:"Only Workspaces whose writable layer is in this storage pool (kibo storage-pool list)."`
	Node      string            `name:"node" help:"Only the Workspaces executing on this node (not combinable with filters)."`
	Instance  string            `name:"instance" help:"Only the Workspace executing with this Instance (not combinable with filters)."`
	All       bool              `name:"all" help:"Include STOPPED Workspaces, and read every page."`
	Quiet     bool              `short:"q" name:"quiet" help:"Print only Workspace IDs, one per line."`
	Wide      bool              `name:"wide" help:"Add the INSTANCE and NODE columns."`
	PageSize  int               `name:"page-size" default:"100" help:"Workspaces per page."`
	PageToken string            `name:"page-token" help:"Continue after a previous page."`
}

func (c *WorkspaceListCmd) Run(g *Globals) error {
	if c.Node != "" && c.Instance != "" {
		return usagef("--node and --instance are exclusive: give one")
	}
	if (c.Node != "" || c.Instance != "") && (len(c.State) > 0 || len(c.Label) > 0 || c.Pool != "") {
		return usagef("--node and --instance cannot be combined with --state, --label or --pool")
	}
	q := url.Values{}
	for _, s := range c.State {
		q.Add("state", s)
	}
	keys := make([]string, 0, len(c.Label))
	for k := range c.Label {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+c.Label[k])
	}
	if c.Node != "" {
		q.Set("node", c.Node)
	}
	if c.Instance != "" {
		q.Set("instance", c.Instance)
	}
	if c.Pool != "" {
		q.Set("pool", c.Pool)
	}
	if c.All {
		q.Set("all", "true")
	}
	q.Set("page_size", itoa(c.PageSize))
	token := c.PageToken
	var all api.WorkspaceList
	for {
		if token != "" {
			q.Set("page_token", token)
		}
		var page api.WorkspaceList
		raw, err := g.call("GET", "/v1/workspaces?"+q.Encode(), nil, &page)
		if err != nil {
			return err
		}
		if g.JSON && !c.All {
			return g.printJSON(raw)
		}
		all.Workspaces = append(all.Workspaces, page.Workspaces...)
		all.NextPageToken = page.NextPageToken
		if !c.All || page.NextPageToken == "" {
			break
		}
		token = page.NextPageToken
	}
	if g.JSON {
		return printResult(g, all)
	}
	if c.Quiet {
		for _, ws := range all.Workspaces {
			g.printf("%s\n", ws.WorkspaceID)
		}
		return nil
	}
	header := []string{"ID", "STATE", "TEMPLATE", "CPU", "MEMORY", "LABELS"}
	if c.Wide {
		header = append(header, "INSTANCE", "NODE")
	}
	t := newTable(g.stdout, header...)
	for _, ws := range all.Workspaces {
		cols := []string{ws.WorkspaceID, ws.State, ws.Template, ws.CPU.String(), formatBytes(ws.MemoryBytes), dash(labelsColumn(ws.Labels))}
		if c.Wide {
			cols = append(cols, dash(ws.InstanceID), dash(ws.NodeID))
		}
		t.row(cols...)
	}
	t.flush()
	if all.NextPageToken != "" {
		g.note("more Workspaces: --page-token %s\n", all.NextPageToken)
	}
	return nil
}

// WorkspaceCleanupStatusCmd is `workspace cleanup-status`.
type WorkspaceCleanupStatusCmd struct {
	ID string `arg:"" name:"workspace"`
}

func (c *WorkspaceCleanupStatusCmd) Run(g *Globals) error {
	var st api.CleanupStatus
	raw, err := g.call("GET", workspacePath(c.ID, "cleanup-status"), nil, &st)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("Workspace %s, Instance %s, node %s\n", st.WorkspaceID, dash(st.InstanceID), dash(st.NodeID))
	t := newTable(g.stdout, "ITEM", "STATE", "SOURCE", "OBSERVED", "SINCE")
	for _, it := range st.Items {
		obs, since := "-", "-"
		if it.ObservedAt != nil {
			obs = stamp(*it.ObservedAt)
		}
		if it.Since != nil {
			since = stamp(*it.Since)
		}
		t.row(it.Item, it.State, it.Source, obs, since)
	}
	t.flush()
	return nil
}

// WorkspaceMoveCmd is `workspace move`: check, stop, start on the target.
type WorkspaceMoveCmd struct {
	ID        string `arg:"" name:"workspace"`
	Node      string `name:"node" required:"" help:"The node to start it on."`
	CommandID string `name:"command-id" help:"Idempotency key; the stop and the start use it with /stop and /start appended, so a rerun resumes."`
}

func (c *WorkspaceMoveCmd) Run(g *Globals) error {
	var ws api.Workspace
	if _, err := g.call("GET", workspacePath(c.ID), nil, &ws); err != nil {
		return err
	}
	var target api.Node
	if _, err := g.call("GET", nodePath(c.Node), nil, &target); err != nil {
		return err
	}
	if ws.State == api.WorkspaceAvailable && ws.NodeID == c.Node {
		return printWorkspaceResult(g, nil, &ws, false, "already on the target")
	}
	// Check: every object must be in a pool the target reaches.
	if err := c.checkReach(g, &ws, &target); err != nil {
		return err
	}
	stopID, startID := "", ""
	if c.CommandID != "" {
		stopID, startID = c.CommandID+"/stop", c.CommandID+"/start"
	}
	if ws.State == api.WorkspaceAvailable || ws.State == api.WorkspaceStopping {
		if _, err := g.call("POST", workspacePath(c.ID, "stop"), api.WorkspaceWriteRequest{WriteMeta: writeMeta(stopID, nil)}, nil); err != nil {
			return err
		}
		if _, err := waitWorkspace(g, c.ID, api.WorkspaceStopped); err != nil {
			return err
		}
	}
	var started api.Workspace
	if _, err := g.call("POST", workspacePath(c.ID, "start"), api.WorkspaceWriteRequest{WriteMeta: writeMeta(startID, nil), NodeID: c.Node}, &started); err != nil {
		return fmt.Errorf("%w; the Workspace is no longer running: start it again with kibo workspace start %s --node %s", err, c.ID, c.Node)
	}
	final, err := waitWorkspace(g, c.ID, api.WorkspaceAvailable)
	if err != nil {
		return fmt.Errorf("%w; start it again with kibo workspace start %s --node %s", err, c.ID, c.Node)
	}
	return printWorkspaceResult(g, nil, final, false, "moved")
}

// movedObject is one object of a Workspace a move checks.
type movedObject struct {
	what, pool string
	shared     bool
	maker      string // the node that made it (and alone uses a standalone pool)
}

// checkReach refuses a move whose target cannot use one of the
// Workspace's objects (its layer, its Volumes): the target must report
// the object's pool available, and the pool must be shared or have moved
// there (its old host retired or isolated), as ctrl's placement will
// require; an object being resized or deleted is not moved.
func (c *WorkspaceMoveCmd) checkReach(g *Globals, ws *api.Workspace, target *api.Node) error {
	var objs []movedObject
	if l := ws.Layer; l != nil {
		if l.Lost {
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s: its writable layer was in pool %s, which was declared lost; the Workspace is unchanged", c.ID, api.LayerPoolID(l))}
		}
		objs = append(objs, movedObject{what: "its writable layer", pool: api.LayerPoolID(l), shared: l.Shared, maker: l.NodeID})
	}
	for _, m := range ws.Volumes {
		var v api.Volume
		if _, err := g.call("GET", volumePath(m.VolumeID), nil, &v); err != nil {
			return err
		}
		what := "its volume " + v.Name
		switch {
		case v.State == api.VolumeLost:
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s: %s was in pool %s, which was declared lost; the Workspace is unchanged", c.ID, what, v.PoolID)}
		case v.Pending != nil:
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s: %s has a %s in progress on node %s; move it once that completed; the Workspace is unchanged", c.ID, what, v.Pending.Kind, v.Pending.NodeID)}
		case !v.Made && ws.Layer == nil:
			continue // made where the Workspace first starts
		}
		objs = append(objs, movedObject{what: what, pool: v.PoolID, shared: v.Shared, maker: v.NodeID})
	}
	for _, o := range objs {
		if o.maker == c.Node {
			continue
		}
		refuse := func(why string) error {
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s: %s is in pool %s, %s; the Workspace is unchanged", c.ID, o.what, o.pool, why)}
		}
		if !poolAvailable(target, o.pool) {
			return refuse("which node " + c.Node + " does not report available")
		}
		if o.shared {
			continue
		}
		var p api.StoragePool
		if _, err := g.call("GET", poolPath(o.pool), nil, &p); err != nil {
			return err
		}
		for _, m := range p.Nodes {
			if m.NodeID != o.maker {
				continue
			}
			var maker api.Node
			if _, err := g.call("GET", nodePath(o.maker), nil, &maker); err != nil {
				return err
			}
			if !maker.Isolated {
				return refuse("a standalone pool of node " + o.maker + ", which only it can use while it is a member")
			}
		}
	}
	return nil
}

func poolAvailable(n *api.Node, id string) bool {
	if n.Report == nil {
		return false
	}
	for _, p := range n.Report.Pools {
		if p.PoolID == id && p.Available {
			return true
		}
	}
	return false
}
