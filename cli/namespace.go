package cli

import (
	"cmp"
	"net/url"
	"time"

	"github.com/kibotos/kibotos/api"
)

// NamespaceCmd groups the namespace commands (operators).
type NamespaceCmd struct {
	Create      NamespaceCreateCmd      `cmd:"" help:"Create a namespace: a tenant's own Workspaces, Volumes and API keys."`
	List        NamespaceListCmd        `cmd:"" help:"List the namespaces with what each holds."`
	Get         NamespaceGetCmd         `cmd:"" help:"Show a namespace and what it holds."`
	Delete      NamespaceDeleteCmd      `cmd:"" help:"Delete an empty namespace (its API keys go with it)."`
	SetQuota    NamespaceSetQuotaCmd    `cmd:"" name:"set-quota" help:"Bound what a namespace's objects take: running Workspaces, vCPU, memory, Volume and snapshot bytes."`
	SetDefaults NamespaceSetDefaultsCmd `cmd:"" name:"set-defaults" help:"Set the lifetime of a namespace's Workspaces: the timeout they get by default and the longest they may have."`
}

// NamespaceSetDefaultsCmd is `namespace set-defaults`: it replaces the
// namespace's lifetime defaults (those not given are none).
type NamespaceSetDefaultsCmd struct {
	Name       string `arg:"" name:"name"`
	Timeout    string `name:"timeout" aliases:"run-timeout" placeholder:"DURATION" help:"Timeout of a Workspace created without one, e.g. 1h (as workspace create --timeout)."`
	OnTimeout  string `name:"on-timeout" enum:",delete,stop,pause" default:"" help:"Its action at the end: delete (default), stop or pause."`
	MaxTimeout string `name:"max-timeout" aliases:"max-run-timeout" placeholder:"DURATION" help:"The longest timeout a Workspace of the namespace may have, e.g. 24h: none lives without an end."`
	CommandID  string `name:"command-id" help:"Idempotency key."`
}

func (c *NamespaceSetDefaultsCmd) Run(g *Globals) error {
	req := api.NamespaceDefaultsRequest{WriteMeta: writeMeta(c.CommandID, nil), Timeout: c.Timeout, OnTimeout: c.OnTimeout, MaxTimeout: c.MaxTimeout}
	return showNamespace(g, "POST", "/v1/namespaces/"+url.PathEscape(c.Name)+"/defaults", req)
}

// NamespaceSetQuotaCmd is `namespace set-quota`: the bounds given are
// set, those named by --clear lifted, the others kept.
type NamespaceSetQuotaCmd struct {
	Name          string   `arg:"" name:"name"`
	Workspaces    *uint64  `name:"workspaces" help:"Running Workspaces (an Instance: starting, running or stopping)."`
	CPU           *uint64  `name:"cpu" help:"vCPUs of the running Workspaces."`
	Memory        string   `name:"memory" help:"Memory of the running Workspaces, e.g. 64GiB."`
	VolumeBytes   string   `name:"volume-bytes" help:"Size of the Volumes, e.g. 1TiB."`
	SnapshotBytes string   `name:"snapshot-bytes" help:"Snapshots of the paused Workspaces, e.g. 100GiB."`
	Clear         []string `name:"clear" help:"Lift these bounds: workspaces, cpu, memory, volume-bytes, snapshot-bytes (repeat or comma-separate)."`
	CommandID     string   `name:"command-id" help:"Idempotency key."`
}

func (c *NamespaceSetQuotaCmd) Run(g *Globals) error {
	var req api.NamespaceQuotaRequest
	req.WriteMeta = writeMeta(c.CommandID, nil)
	req.Set.RunningWorkspaces = c.Workspaces
	if c.CPU != nil {
		milli := *c.CPU * 1000
		req.Set.CPU = &milli
	}
	for _, size := range []struct {
		flag, v string
		dst     **uint64
	}{{"--memory", c.Memory, &req.Set.MemoryBytes}, {"--volume-bytes", c.VolumeBytes, &req.Set.VolumeBytes}, {"--snapshot-bytes", c.SnapshotBytes, &req.Set.SnapshotBytes}} {
		if size.v == "" {
			continue
		}
		n, err := parseSize(size.v)
		if err != nil {
			return usagef("%s %q: %v", size.flag, size.v, err)
		}
		*size.dst = &n
	}
	names := map[string]string{"workspaces": "running_workspaces", "cpu": "cpu", "memory": "memory", "volume-bytes": "volume_bytes", "snapshot-bytes": "snapshot_bytes"}
	for _, f := range c.Clear {
		field, ok := names[f]
		if !ok {
			return usagef("--clear %q: give workspaces, cpu, memory, volume-bytes or snapshot-bytes", f)
		}
		req.Clear = append(req.Clear, field)
	}
	return showNamespace(g, "POST", "/v1/namespaces/"+url.PathEscape(c.Name)+"/quota", req)
}

// NamespaceCreateCmd is `namespace create`.
type NamespaceCreateCmd struct {
	Name      string `arg:"" name:"name" help:"1-63 lower-case letters, digits or '-'."`
	CommandID string `name:"command-id" help:"Idempotency key."`
}

func (c *NamespaceCreateCmd) Run(g *Globals) error {
	var ns api.Namespace
	raw, err := g.call("POST", "/v1/namespaces", api.NamespaceCreateRequest{WriteMeta: writeMeta(c.CommandID, nil), Name: c.Name}, &ns)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("namespace %s created\n", ns.Name)
	g.note("Give it an API key: kibo api-key create NAME --namespace %s --role sandbox\n", ns.Name)
	return nil
}

// NamespaceListCmd is `namespace list`.
type NamespaceListCmd struct {
	Quiet bool `short:"q" name:"quiet" help:"Print only the names."`
}

func (c *NamespaceListCmd) Run(g *Globals) error {
	var out []api.Namespace
	return runList(g, listCall{path: "/v1/namespaces", quiet: c.Quiet, what: "namespaces"}, &out,
		func() ([]string, string) {
			names := make([]string, len(out))
			for i, ns := range out {
				names[i] = ns.Name
			}
			return names, ""
		},
		func() {
			t := newTable(g.stdout, "NAME", "WORKSPACES", "VOLUMES", "API KEYS", "CREATED")
			for _, ns := range out {
				created := "-"
				if !ns.CreatedAt.IsZero() {
					created = stamp(ns.CreatedAt)
				}
				t.row(ns.Name, itoa(ns.Usage.Workspaces), itoa(ns.Usage.Volumes), itoa(ns.Usage.APIKeys), created)
			}
			t.flush()
		})
}

// NamespaceGetCmd is `namespace get`.
type NamespaceGetCmd struct {
	Name string `arg:"" name:"name"`
}

func (c *NamespaceGetCmd) Run(g *Globals) error {
	return showNamespace(g, "GET", "/v1/namespaces/"+url.PathEscape(c.Name), nil)
}

// showNamespace calls the API and shows the namespace it answers.
func showNamespace(g *Globals, method, path string, in any) error {
	var ns api.Namespace
	raw, err := g.call(method, path, in, &ns)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	renderNamespace(g, &ns)
	return nil
}

// renderNamespace shows a namespace with its usage against its quota.
func renderNamespace(g *Globals, ns *api.Namespace) {
	line := kv{g.stdout}.line
	line("Name", "%s", ns.Name)
	if !ns.CreatedAt.IsZero() {
		line("Created", "%s by %s", stamp(ns.CreatedAt), dash(ns.CreatedBy))
	}
	line("Workspaces", "%d", ns.Usage.Workspaces)
	line("Volumes", "%d", ns.Usage.Volumes)
	line("API keys", "%d", ns.Usage.APIKeys)
	if ns.Name != api.DefaultNamespace {
		line("Egress", "%d", ns.Usage.Egress)
		line("Resolvers", "%d", ns.Usage.Resolvers)
	}
	if d := ns.Defaults; d != nil {
		if d.TimeoutSeconds > 0 {
			line("Default timeout", "%s, then %s", time.Duration(d.TimeoutSeconds)*time.Second, cmp.Or(d.OnTimeout, api.TimeoutDelete))
		}
		if d.MaxTimeoutSeconds > 0 {
			line("Max timeout", "%s", time.Duration(d.MaxTimeoutSeconds)*time.Second)
		}
	}
	if ns.Name == api.DefaultNamespace {
		line("Quota", "none (the default namespace is the operators')")
		return
	}
	q := ns.Quota
	if q == nil {
		q = &api.NamespaceQuota{}
	}
	u := ns.Usage.NamespaceResources
	of := func(used string, limit *uint64, format func(uint64) string) string {
		if limit == nil {
			return used + " (no quota)"
		}
		return used + " of " + format(*limit)
	}
	count := func(n uint64) string { return itoa(int(n)) }
	cpu := func(n uint64) string { return api.Milli(n).String() }
	line("Running", "%s", of(itoa(u.RunningWorkspaces), q.RunningWorkspaces, count))
	line("vCPU", "%s", of(u.CPU.String(), q.CPU, cpu))
	line("Memory", "%s", of(formatBytes(u.MemoryBytes), q.MemoryBytes, formatBytes))
	line("Volume bytes", "%s", of(formatBytes(u.VolumeBytes), q.VolumeBytes, formatBytes))
	line("Snapshot bytes", "%s", of(formatBytes(u.SnapshotBytes), q.SnapshotBytes, formatBytes))
}

// NamespaceDeleteCmd is `namespace delete`.
type NamespaceDeleteCmd struct {
	Name      string `arg:"" name:"name"`
	CommandID string `name:"command-id" help:"Idempotency key."`
}

func (c *NamespaceDeleteCmd) Run(g *Globals) error {
	raw, err := g.call("POST", "/v1/namespaces/"+url.PathEscape(c.Name)+"/delete", writeMeta(c.CommandID, nil), nil)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("namespace %s deleted\n", c.Name)
	return nil
}
