package cli

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/egress"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/member"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/template"
)

// VersionCmd prints the build.
type VersionCmd struct{}

func (c *VersionCmd) Run(g *Globals) error {
	line := ""
	if v, err := buildinfo.ParseRelease(buildinfo.ReleaseName()); err == nil {
		line = v.Line()
	}
	v := map[string]any{"release": buildinfo.ReleaseName(), "revision": buildinfo.SourceRevision(), "released": buildinfo.Released(),
		"release_line": line, "feature_level": fsm.FeatureLevel}
	if g.JSON {
		return printResult(g, v)
	}
	rel := "unreleased build: on no release line"
	switch {
	case line != "":
		rel = "release line " + line
	case buildinfo.Released():
		rel = "pre-release: on no release line"
	}
	g.printf("kibotos %s (revision %s, %s, feature level %d)\n", buildinfo.ReleaseName(), buildinfo.SourceRevision(), rel, fsm.FeatureLevel)
	return nil
}

func printResult(g *Globals, v any) error {
	return g.printJSONValue(api.ResultBody{Result: v})
}

func (g *Globals) printJSONValue(v any) error {
	raw, err := jsonMarshal(v)
	if err != nil {
		return err
	}
	return g.printJSON(raw)
}

// InitCmd creates a new cluster.
type InitCmd struct {
	Advertise string   `name:"advertise" required:"" help:"HOST:PORT the other members and the CLI reach this member at (gossip uses PORT+1)."`
	NodeID    string   `name:"node-id" help:"Node id of this host (default: the host name)."`
	Roles     []string `name:"roles" default:"ctrl,node" help:"Roles of this member: ctrl, node or ctrl,node."`
}

func (c *InitCmd) Run(g *Globals) error {
	if g.DataDir == "" {
		g.DataDir = SystemDataDir
	}
	if c.NodeID == "" {
		h, err := os.Hostname()
		if err != nil {
			return usagef("no --node-id and no host name: %v", err)
		}
		c.NodeID = strings.ToLower(h)
	}
	id, err := cluster.Init(g.ctx, cluster.InitOptions{DataDir: datadir.Dir(g.DataDir), NodeID: c.NodeID, Advertise: c.Advertise, Roles: c.Roles})
	if err != nil {
		return err
	}
	if g.JSON {
		return printResult(g, map[string]any{"cluster_id": id.ClusterID, "node_id": id.NodeID, "roles": id.Roles, "advertise": id.Advertise, "data_dir": g.DataDir})
	}
	g.printf("Initialized cluster %s: member %s (%s) at %s.\nStart it with: kibotos serve --data-dir %s\n",
		id.ClusterID, id.NodeID, strings.Join(id.Roles, ","), id.Advertise, g.DataDir)
	return nil
}

// JoinCmd enrolls this host.
type JoinCmd struct {
	Advertise string `name:"advertise" required:"" help:"HOST:PORT the other members reach this member at (gossip uses PORT+1)."`
	Grant     string `name:"grant" required:"" help:"Enrollment grant printed by 'kibo enrollment grant'."`
	Member    string `arg:"" name:"member-addr" help:"API address of any member of the cluster."`
}

func (c *JoinCmd) Run(g *Globals) error {
	if g.DataDir == "" {
		g.DataDir = SystemDataDir
	}
	id, err := cluster.Join(g.ctx, cluster.JoinOptions{DataDir: datadir.Dir(g.DataDir), Advertise: c.Advertise, Grant: c.Grant, Member: c.Member})
	if err != nil {
		return err
	}
	if g.JSON {
		return printResult(g, map[string]any{"cluster_id": id.ClusterID, "node_id": id.NodeID, "roles": id.Roles, "advertise": id.Advertise, "data_dir": g.DataDir})
	}
	g.printf("Joined cluster %s as %s (%s) at %s.\nStart it with: kibotos serve --data-dir %s\n",
		id.ClusterID, id.NodeID, strings.Join(id.Roles, ","), id.Advertise, g.DataDir)
	return nil
}

// fileConfig is the TOML file of `serve --config`.
type fileConfig struct {
	DataDir   string `toml:"data_dir"`
	Bind      string `toml:"bind"`
	DataPlane struct {
		Listen string `toml:"listen"`
	} `toml:"dataplane"`
	Storage struct {
		// DefaultPool is where new retained layers go; default "default",
		// the node's private pool under its storage root.
		DefaultPool string           `toml:"default_pool"`
		Pools       []poolFileConfig `toml:"pools"`
		// Pool is the product documentation's spelling of
		// [[storage.pools]]; loadNodeConfig moves it into Pools.
		Pool []poolFileConfig `toml:"pool"`
	} `toml:"storage"`
	Network struct {
		IPv4Pool        string   `toml:"ipv4_pool"`
		IPv6Pool        string   `toml:"ipv6_pool"`
		ManagementCIDRs []string `toml:"management_cidrs"`
		Resolvers       []string `toml:"resolvers"`
		Uplink          string   `toml:"uplink"`
		// EgressWarmConnections is the egress process's warm pool per
		// proxy revision in use (--warm-connections); unset: the default.
		EgressWarmConnections *int `toml:"egress_warm_connections"`
	} `toml:"network"`
	Logs struct {
		// MachineLogsMaxBytes bounds machine-logs/ (ended machines' log
		// tails); default 1 GiB.
		MachineLogsMaxBytes int64 `toml:"machine_logs_max_bytes"`
	} `toml:"logs"`
	Artifacts struct {
		// URL is the cluster's artifact store (file:///absolute/dir or
		// s3://bucket/prefix, the same on every member); none:
		// templates stay where they were built.
		URL string `toml:"url"`
		// Endpoint, Region and CredentialsFile are an s3:// store's:
		// the S3 API's URL (default https://s3.amazonaws.com), its
		// region, and a file (mode 600) holding the keys.
		Endpoint        string `toml:"endpoint"`
		Region          string `toml:"region"`
		CredentialsFile string `toml:"credentials_file"`
		// CAFile is the PEM CA an https endpoint's certificate is
		// checked against instead of the host's trust store.
		CAFile string `toml:"ca_file"`
	} `toml:"artifacts"`
	Metrics struct {
		// Listen is the plain-HTTP /metrics address; default
		// 127.0.0.1:<advertised port+3>, "none" for no listener.
		Listen string `toml:"listen"`
	} `toml:"metrics"`
	// API is the HTTPS listener for applications with API keys (ctrl
	// members only); no listen: none.
	API struct {
		Listen   string  `toml:"listen"`
		CertFile string  `toml:"cert_file"`
		KeyFile  string  `toml:"key_file"`
		Rate     float64 `toml:"rate"`
		Burst    int     `toml:"burst"`
	} `toml:"api"`
	// E2B is the listener of E2B's API (ctrl members only); no listen:
	// none.
	E2B struct {
		Listen       string `toml:"listen"`
		CertFile     string `toml:"cert_file"`
		KeyFile      string `toml:"key_file"`
		Domain       string `toml:"domain"`
		BaseTemplate string `toml:"base_template"`
	} `toml:"e2b"`
	LogLevel  string `toml:"log_level"`
	LogFormat string `toml:"log_format"`
	Resources struct {
		CPU    string `toml:"cpu"`
		Memory string `toml:"memory"`
	} `toml:"resources"`
	// Templates are per-template node settings: [templates.NAME] warm = N
	// keeps N pre-booted, paused guests of the template for creates of
	// cpu cores and memory (default 1 and 512MiB, a create's defaults).
	Templates map[string]struct {
		Warm   int    `toml:"warm"`
		CPU    int    `toml:"cpu"`
		Memory string `toml:"memory"`
	} `toml:"templates"`
}

// poolFileConfig is one [[storage.pools]] table.
type poolFileConfig struct {
	ID     string `toml:"id"`
	Path   string `toml:"path"`
	Shared bool   `toml:"shared"`
	// Capacity is refused: it is ctrl's attribute of the pool
	// (earlier releases read it from here).
	Capacity any `toml:"capacity"`
}

// warmFrom is [templates.NAME]'s warm guests, by template name.
func warmFrom(path string, fc fileConfig) ([]agent.WarmConfig, error) {
	var out []agent.WarmConfig
	for _, name := range slices.Sorted(maps.Keys(fc.Templates)) {
		t := fc.Templates[name]
		w, err := warmConfig(name, t.Warm, t.CPU, t.Memory)
		if err != nil {
			return nil, api.Errorf(api.CodeInvalidArgument, "configuration file %s: [templates.%s] %v", path, name, err)
		}
		out = append(out, w)
	}
	return out, nil
}

// warmConfig checks one template's warm guests; cpu 0 and memory "" are
// a create's defaults.
func warmConfig(name string, count, cpu int, memory string) (agent.WarmConfig, error) {
	w := agent.WarmConfig{Template: name, Count: count, VCPUs: cmp.Or(cpu, 1)}
	mem, err := parseSize(cmp.Or(memory, "512MiB"))
	switch {
	case api.ValidTemplateName(name) != nil:
		return w, api.ValidTemplateName(name)
	case count < 0 || count > api.MaxWarmGuests:
		return w, fmt.Errorf("warm = %d: want 0 to %d", count, api.MaxWarmGuests)
	case cpu < 0:
		return w, fmt.Errorf("cpu = %d: want whole cores, at least 1", cpu)
	case err != nil:
		return w, fmt.Errorf("memory %q: %v", memory, err)
	case mem%(1<<20) != 0 || mem < 64<<20:
		return w, fmt.Errorf("memory %q: want whole MiB, at least 64MiB", memory)
	}
	w.MemoryMiB = int(mem >> 20)
	return w, nil
}

// ServeCmd runs a member.
type ServeCmd struct {
	Config          string        `name:"config" type:"existingfile" help:"TOML configuration file (data_dir, bind, log_level, [resources] cpu and memory, [dataplane] listen, [network] ipv4_pool, ipv6_pool, management_cidrs, resolvers and uplink, [metrics] listen, [api] listen, cert_file, key_file, rate and burst, [logs] machine_logs_max_bytes, [artifacts] url, endpoint, region, credentials_file and ca_file, [storage] default_pool, [[storage.pools]] (or [[storage.pool]]) id, path, shared, and [templates.NAME] warm, cpu, memory)."`
	Bind            string        `name:"bind" help:"Listen address (default: the advertised address)."`
	DataPlaneListen string        `name:"dataplane-listen" help:"Data-plane address HOST:PORT (exec, terminal, cp, port-forward); default: the advertised host, port+2."`
	LogLevel        string        `name:"log-level" default:"info" enum:"debug,info,warn,error" help:"Log level."`
	LogFormat       string        `name:"log-format" default:"text" enum:"text,json" help:"Log format of the member and of the data-plane and egress processes it starts: text, or json (one object per line, for journald or Vector)."`
	Systemd         string        `name:"systemd" default:"auto" enum:"auto,host,private,none" help:"Service manager for VMM units: auto (the host's systemd when PID 1 is systemd, else none), host, private (started by this process; VMs end with it) or none."`
	Accel           string        `name:"accel" default:"auto" enum:"auto,kvm,tcg" help:"QEMU accelerator: auto picks KVM when it is usable (not PVM), else TCG."`
	TestTimings     bool          `name:"test-timings" hidden:"" help:"Tight Raft and session timings (tests)."`
	ClockSkew       time.Duration `name:"test-clock-skew" hidden:"" help:"Pretend the host clock is off by this much (tests)."`
	ClockSkewFile   string        `name:"test-clock-skew-file" hidden:"" help:"Pretend the host clock is off by the duration this file holds, read again every second (the fault harness steps a clock with it)."`
	SystemdOutlives bool          `name:"test-systemd-outlives" hidden:"" help:"With --systemd private: the private systemd outlives this process and the next start attaches to it, as kibotos dev's does, so VMs outlive a killed member and are taken over as under the host's systemd (tests)."`
}

// loadNodeConfig reads the node's configuration file (none: defaults)
// and the data directory it and the flags name.
func loadNodeConfig(g *Globals, path string) (fileConfig, datadir.Dir, error) {
	var fc fileConfig
	if path != "" {
		md, err := toml.DecodeFile(path, &fc)
		if err != nil {
			return fc, "", api.Errorf(api.CodeInvalidArgument, "configuration file %s: %v", path, err)
		}
		// A misspelt key would otherwise take its default without a
		// word: a pool the node never declares, a network it never has.
		if und := md.Undecoded(); len(und) > 0 {
			var keys []string
			for _, k := range und {
				// An unknown table's own keys add nothing to its name.
				if len(keys) > 0 && strings.HasPrefix(k.String(), keys[len(keys)-1]+".") {
					continue
				}
				keys = append(keys, k.String())
			}
			what, it := "unknown key", "it"
			if len(keys) > 1 {
				what, it = "unknown keys", "them"
			}
			return fc, "", api.Errorf(api.CodeInvalidArgument, "configuration file %s: %s %s: correct or delete %s (kibotos serve --help lists the keys)", path, what, strings.Join(keys, ", "), it)
		}
		// Both spellings in one file are more likely a half-done edit
		// than two lists meant to be joined.
		if len(fc.Storage.Pool) > 0 && len(fc.Storage.Pools) > 0 {
			return fc, "", api.Errorf(api.CodeInvalidArgument, "configuration file %s: both [[storage.pool]] and [[storage.pools]]: declare every pool under one of the two", path)
		}
		fc.Storage.Pools = append(fc.Storage.Pools, fc.Storage.Pool...)
		fc.Storage.Pool = nil
	}
	dir := g.DataDir
	if dir == "" {
		dir = fc.DataDir
	}
	if dir == "" {
		dir = SystemDataDir
	}
	return fc, datadir.Dir(dir), nil
}

// poolsFrom is [[storage.pools]]; a capacity key, which earlier releases
// read, is refused: a pool's capacity is ctrl's.
func poolsFrom(path string, fc fileConfig) ([]agent.PoolConfig, error) {
	var pools []agent.PoolConfig
	for _, p := range fc.Storage.Pools {
		if p.Capacity != nil {
			return nil, api.Errorf(api.CodeInvalidArgument, "configuration file %s: storage pool %s: capacity is no longer a node setting, pool capacity is ctrl's: delete the capacity line and set it with kibo storage-pool set-capacity %s SIZE", path, p.ID, p.ID)
		}
		pools = append(pools, agent.PoolConfig{ID: p.ID, Path: p.Path, Shared: p.Shared})
	}
	return pools, nil
}

func (c *ServeCmd) Run(g *Globals) error {
	fc, dir, err := loadNodeConfig(g, c.Config)
	if err != nil {
		return err
	}
	bind := c.Bind
	if bind == "" {
		bind = fc.Bind
	}
	level := c.LogLevel
	if fc.LogLevel != "" && level == "info" {
		level = fc.LogLevel
	}
	if fc.Logs.MachineLogsMaxBytes < 0 {
		return usagef("[logs] machine_logs_max_bytes = %d in %s: want a size in bytes (default 1073741824)", fc.Logs.MachineLogsMaxBytes, c.Config)
	}
	format := c.LogFormat
	if fc.LogFormat != "" && format == logText {
		if fc.LogFormat != logText && fc.LogFormat != logJSON {
			return usagef("log_format %q in %s: want text or json", fc.LogFormat, c.Config)
		}
		format = fc.LogFormat
	}
	capacity, err := resourcesFrom(fc)
	if err != nil {
		return err
	}
	timings := cluster.DefaultTimings()
	var deniedReport time.Duration
	if c.TestTimings {
		timings, deniedReport = cluster.TestTimings(), time.Second
	}
	dpListen := c.DataPlaneListen
	if dpListen == "" {
		dpListen = fc.DataPlane.Listen
	}
	network, err := networkFrom(c.Config, fc)
	if err != nil {
		return err
	}
	pools, err := poolsFrom(c.Config, fc)
	if err != nil {
		return err
	}
	store, err := artifactsFrom(c.Config, fc)
	if err != nil {
		return err
	}
	warm, err := warmFrom(c.Config, fc)
	if err != nil {
		return err
	}
	egressWarm, err := egressWarmFrom(c.Config, fc)
	if err != nil {
		return err
	}
	apiConf, err := apiFrom(c.Config, fc)
	if err != nil {
		return err
	}
	e2bConf, err := e2bFrom(c.Config, fc)
	if err != nil {
		return err
	}
	sdMode := c.Systemd
	if c.SystemdOutlives {
		if sdMode != member.SystemdPrivate {
			return usagef("--test-systemd-outlives needs --systemd private, not %s", sdMode)
		}
		sdMode = member.SystemdDev
	}
	return runMember(g, level, member.Options{API: apiConf, E2B: e2bConf, DataDir: dir, Bind: bind, Capacity: capacity, Timings: timings, DeniedReport: deniedReport, ClockSkew: c.ClockSkew, ClockSkewFile: c.ClockSkewFile, LogFormat: format,
		Systemd: sdMode, Accel: qemu.Accel(c.Accel), DataPlaneListen: dpListen, Pools: pools, DefaultPool: fc.Storage.DefaultPool, Network: network,
		MetricsListen: fc.Metrics.Listen, MachineLogsMax: fc.Logs.MachineLogsMaxBytes, Artifacts: store, Warm: warm, EgressWarm: egressWarm})
}

// artifactsFrom is [artifacts], checked (an s3:// store's credentials
// file read): URL "" when there is none.
func artifactsFrom(path string, fc fileConfig) (artifacts.Config, error) {
	a := fc.Artifacts
	c := artifacts.Config{URL: a.URL, Endpoint: a.Endpoint, Region: a.Region, CredentialsFile: a.CredentialsFile, CAFile: a.CAFile}
	if c.URL == "" {
		if c != (artifacts.Config{}) {
			return c, api.Errorf(api.CodeInvalidArgument, "configuration file %s: [artifacts] has no url: give url, or delete the section", path)
		}
		return c, nil
	}
	if err := c.Check(); err != nil {
		return c, api.Errorf(api.CodeInvalidArgument, "configuration file %s: %v", path, err)
	}
	return c, nil
}

// apiFrom is [api], checked; Listen "" when there is none.
func apiFrom(path string, fc fileConfig) (cluster.APIConfig, error) {
	a := fc.API
	c := cluster.APIConfig{Listen: a.Listen, CertFile: a.CertFile, KeyFile: a.KeyFile, Rate: a.Rate, Burst: a.Burst}
	if err := c.Check(); err != nil {
		return c, api.Errorf(api.CodeInvalidArgument, "configuration file %s: %v", path, err)
	}
	return c, nil
}

// e2bFrom is [e2b], checked; Listen "" when there is none. The template
// "base" means is kibotos-base unless base_template says otherwise.
func e2bFrom(path string, fc fileConfig) (cluster.E2BConfig, error) {
	e := fc.E2B
	c := cluster.E2BConfig{Listen: e.Listen, CertFile: e.CertFile, KeyFile: e.KeyFile, Domain: e.Domain, BaseTemplate: cmp.Or(e.BaseTemplate, template.DefaultName)}
	if err := c.Check(); err != nil {
		return c, api.Errorf(api.CodeInvalidArgument, "configuration file %s: %v", path, err)
	}
	return c, nil
}

// networkFrom reads [network]; a file without one gives nil (the node
// runs no Workspace that needs a network, and says so when asked to).
func networkFrom(path string, fc fileConfig) (*netpol.Config, error) {
	n := fc.Network
	if n.IPv4Pool == "" && n.IPv6Pool == "" && len(n.ManagementCIDRs) == 0 && len(n.Resolvers) == 0 && n.Uplink == "" {
		return nil, nil
	}
	c, err := netpol.ParseConfig(n.IPv4Pool, n.IPv6Pool, n.ManagementCIDRs, n.Resolvers, n.Uplink)
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "configuration file %s: [network] %s", path, strings.TrimPrefix(err.Error(), "network: "))
	}
	return &c, nil
}

// egressWarmFrom is [network] egress_warm_connections, checked.
func egressWarmFrom(path string, fc fileConfig) (int, error) {
	n := fc.Network.EgressWarmConnections
	if n == nil {
		return egress.DefaultWarmConnections, nil
	}
	if *n < 0 || *n > egress.MaxWarmConnections {
		return 0, api.Errorf(api.CodeInvalidArgument, "configuration file %s: [network] egress_warm_connections = %d: want 0 (none) to %d", path, *n, egress.MaxWarmConnections)
	}
	return *n, nil
}

func resourcesFrom(fc fileConfig) (api.Resources, error) {
	r := agent.DefaultCapacity()
	if fc.Resources.CPU != "" {
		m, err := api.ParseMilli(fc.Resources.CPU)
		if err != nil {
			return r, api.Errorf(api.CodeInvalidArgument, "[resources] cpu %q: %v", fc.Resources.CPU, err)
		}
		r.CPU = m
	}
	if fc.Resources.Memory != "" {
		n, err := parseSize(fc.Resources.Memory)
		if err != nil {
			return r, api.Errorf(api.CodeInvalidArgument, "[resources] memory %q: %v", fc.Resources.Memory, err)
		}
		r.MemoryBytes = n
	}
	return r, nil
}

// parseSize reads "512MiB", "32GiB", "1.5TiB" or a plain byte count.
func parseSize(s string) (uint64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			v, err := strconv.ParseFloat(strings.TrimSuffix(s, u.suffix), 64)
			if err != nil || v < 0 {
				return 0, fmt.Errorf("not a size such as 512MiB or 32GiB")
			}
			return uint64(v * u.mult), nil
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a size such as 512MiB or 32GiB")
	}
	return v, nil
}

// StatusCmd shows the member and the leader.
type StatusCmd struct{}

func (c *StatusCmd) Run(g *Globals) error {
	var st api.Status
	raw, err := g.call("GET", "/v1/status", nil, &st)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("Cluster:    %s\nMember:     %s (%s) at %s\nRaft:       %s\nLeader:     %s\nRelease:    %s (revision %s)\n",
		st.ClusterID, st.NodeID, strings.Join(st.Roles, ","), st.Advertise, st.RaftState, dash(st.Leader), st.Release, st.Revision)
	return nil
}

// runMember runs the member of o with the process's logger until SIGTERM
// or SIGINT; an isolated or stale node exits 13.
func runMember(g *Globals, level string, o member.Options) error {
	log := newLogger(g.stderr, level, o.LogFormat)
	ctx, stop := signal.NotifyContext(g.ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := member.Run(ctx, log, o)
	if errors.Is(err, agent.ErrIsolated) || errors.Is(err, agent.ErrStale) {
		return exitError{code: api.ExitFailedPrecondition, msg: err.Error()}
	}
	return err
}
