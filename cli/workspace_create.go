package cli

import (
	"time"

	"github.com/kibotos/kibotos/api"
)

// WorkspaceCreateCmd is `workspace create`.
type WorkspaceCreateCmd struct {
	Template  string            `name:"template" help:"Template name (kibotos template list); required unless --from."`
	From      string            `name:"from" placeholder:"WORKSPACE" help:"Fork this PAUSED Workspace: the new one restores its snapshot (copy-on-write of its writable layer and memory) with a new hostname, machine id and random state, on a node that can resume it; template, CPU and memory are the source's. The source stays PAUSED. Not for a Workspace with Volumes."`
	CPU       int               `name:"cpu" help:"Cores (default 1; a fork has its source's)."`
	Memory    string            `name:"memory" help:"Guest memory, e.g. 512MiB or 2GiB (default 512MiB; a fork has its source's)."`
	Label     map[string]string `name:"label" help:"Label KEY=VALUE; repeat for more."`
	Env       []string          `name:"env" sep:"none" placeholder:"NAME=VALUE" help:"Environment variable of every process in the Workspace (exec, terminal, E2B commands); repeat for more. NAME alone: its value here, which keeps it out of shell history. A command's own --env wins over it. Values may be secrets: workspace get lists the names only. A fork has its source's."`
	Node      string            `name:"node" help:"Place on this node only; never falls back to another."`
	Egress    string            `name:"egress" placeholder:"none|public|NAME" help:"Outbound traffic: none (default), public, or the name of an Egress object."`
	Resolver  string            `name:"resolver" placeholder:"NAME" help:"Resolver object DNS queries go to; default: the deployment resolver."`
	Allow     []string          `name:"allow" placeholder:"CIDR|DOMAIN" help:"With --egress public: the allow list of CIDRs and domains (example.com, *.example.com); repeat or comma-separate. With any allow rule only those are reachable."`
	Deny      []string          `name:"deny" placeholder:"CIDR|DOMAIN" help:"With --egress public: the deny list of CIDRs and domains; repeat or comma-separate. Deny wins over allow."`
	Volume    []string          `name:"volume" placeholder:"VOLUME:/PATH" help:"Attach an existing Volume (name or ID) and mount it at PATH in the guest; repeat for more."`
	NewVolume []string          `name:"new-volume" placeholder:"SIZE:/PATH" help:"Create a Volume of SIZE along with the Workspace, in its node's default pool, mounted at PATH; repeat for more. It outlives the Workspace."`
	// --timeout is the lifetime, as in E2B's SDK; --wait-timeout bounds
	// the wait (other commands' --timeout). run-timeout: the name of
	// earlier builds.
	Timeout     string        `name:"timeout" aliases:"run-timeout" placeholder:"DURATION" help:"End every start and resume this long after it (e.g. 30m, 2h) with --on-timeout; kibo workspace set-timeout changes it. Default: the namespace's (kibo namespace set-defaults), else no end."`
	WaitTimeout time.Duration `name:"wait-timeout" default:"10m" help:"How long to wait until it is AVAILABLE before giving up (exit 16); the create goes on in the background."`
	OnTimeout   string        `name:"on-timeout" placeholder:"delete|stop|pause" help:"What ctrl does at the end: delete (the default; its Volumes stay), stop, or pause."`
	AutoResume  bool          `name:"auto-resume" help:"When PAUSED, an exec, terminal, cp or port-forward resumes it first and waits until it is AVAILABLE."`
	IdleTimeout string        `name:"idle-timeout" placeholder:"DURATION" help:"Pause it once it had no exec, terminal, cp or port-forward connection and its guest's CPU stayed under 5% of a vCPU this long (e.g. 10m); with --auto-resume the next connection resumes it. Default: never."`
	CommandID   string        `name:"command-id" help:"Idempotency key: a retry with the same key and inputs returns the same Workspace."`
	Quiet       bool          `short:"q" name:"quiet" help:"Print only the new Workspace ID."`
	NoWait      bool          `name:"no-wait" help:"Return once ctrl accepted the Workspace instead of when it is AVAILABLE."`
}

// AfterApply hands --wait-timeout to the wait loop (Globals.Timeout).
func (c *WorkspaceCreateCmd) AfterApply(g *Globals) error {
	g.Timeout = c.WaitTimeout
	return nil
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
	var err error
	if req.Timeout, req.OnTimeout, err = createTimeout(c.Timeout, c.OnTimeout); err != nil {
		return req, err
	}
	req.AutoResume = c.AutoResume
	if req.Env, err = execEnv("--env", c.Env); err != nil {
		return req, err
	}
	if req.IdleTimeout, err = idleTimeoutFlag(c.IdleTimeout); err != nil {
		return req, err
	}
	if c.From != "" {
		switch {
		case c.Template != "":
			return req, usagef("--template with --from: a fork runs its source's template; leave --template out")
		case c.CPU != 0 || c.Memory != "":
			return req, usagef("--cpu or --memory with --from: a snapshot restores only into the vCPUs and memory it was saved with; leave them out")
		case len(c.Volume) > 0 || len(c.NewVolume) > 0:
			return req, usagef("--volume or --new-volume with --from: a restored guest must have the devices it was saved with; attach none")
		case len(c.Env) > 0:
			return req, usagef("--env with --from: a fork has its source's environment, which its restored guest holds; leave --env out")
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
