package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/agent/egress"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/member"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/template"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// kiboCommand is how the user runs the CLI: "kibo" when it is on PATH,
// else the path of the kibo next to this executable.
func kiboCommand() string {
	if _, err := exec.LookPath("kibo"); err == nil {
		return "kibo"
	}
	if exe, err := os.Executable(); err == nil {
		alias := filepath.Join(filepath.Dir(exe), "kibo")
		if _, err := os.Stat(alias); err == nil {
			return alias
		}
		return exe
	}
	return "kibotos"
}

func jsonMarshal(v any) (json.RawMessage, error) { return json.Marshal(v) }

// DevCmd groups the dev cluster commands; plain `kibotos dev` is `dev up`.
type DevCmd struct {
	Up   DevUpCmd   `cmd:"" default:"withargs" help:"Run a one-voter cluster with a node on this host in the foreground (the default)."`
	Down DevDownCmd `cmd:"" help:"End every VM of the dev cluster and its private systemd; --purge also removes its data directory."`
}

// DevUpCmd runs a one-voter cluster with a node on this host.
type DevUpCmd struct {
	Advertise string `name:"advertise" default:"127.0.0.1:7480" help:"HOST:PORT of the dev member (gossip uses PORT+1)."`
	NodeID    string `name:"node-id" default:"dev" help:"Node id of the dev member."`
	NoBuild   bool   `name:"no-build" help:"Do not build the Platform and the default template when they are missing."`
	NoDemo    bool   `name:"no-demo" help:"Do not create the demo Workspace when the cluster has none."`
	// DebianTemplate is built with debootstrap (same code as `template
	// build --debootstrap`); the default template stays the busybox one.
	DebianTemplate string `name:"debian-template" placeholder:"NAME" help:"Also build a Debian template of this name (bookworm, minbase, from the host's apt mirror) with debootstrap when it is missing, e.g. kibotos-coding; takes about a minute and needs the Debian package debootstrap. Without it dev builds kibotos-base and kibotos-coding as the same small busybox system."`
	// E2BTemplate is built as the documentation's E2B-style template and
	// is what E2B's "base" means on this dev cluster.
	E2BTemplate string `name:"e2b-template" placeholder:"NAME" help:"Also build the E2B-style template NAME when it is missing (Debian with bash, python3, git, curl and sudo; every exec as the user user, uid 1000, with passwordless sudo: docs/operating/templates-and-platforms.md), and serve it as E2B's template base; takes about a minute and needs debootstrap."`
	// PlatformCache lets several dev clusters (and tests) share one
	// download of the kernel package.
	PlatformCache string `name:"platform-cache-dir" env:"KIBOTOS_PLATFORM_CACHE" help:"Where the kernel package of the Platform is downloaded and unpacked; default: <storage root>/cache/platform."`
	LogFormat     string `name:"log-format" default:"text" enum:"text,json" help:"Log format of the dev member and of the data-plane and egress processes it starts: text, or json (one object per line, for journald or Vector)."`
	// APIListen is serve's [api] listen, on loopback: applications on
	// this host try their API keys there.
	APIListen string `name:"api-listen" default:"127.0.0.1:7443" help:"HOST:PORT of the HTTPS API for applications (API keys), or none; if the default is in use, dev runs without it."`
	// E2BListen is serve's [e2b] listen, on loopback.
	E2BListen string `name:"e2b-listen" default:"127.0.0.1:7444" help:"HOST:PORT of the E2B API (E2B's SDKs with the dev API key), or none; if the default is in use, dev runs without it."`
	// Warm is serve's [templates.NAME] warm = N, at a create's default size.
	Warm map[string]int `name:"warm" placeholder:"TEMPLATE=N" help:"Keep N pre-booted, paused guests of the template, so that a create of it with the default CPU and memory adopts one instead of booting (serve: [templates.NAME] warm = N); repeatable."`
}

// ensureDevArtifacts builds what a Workspace needs on this host when it is
// missing: the Platform (kernel from the Debian package, initramfs with the
// guest agent) and the default busybox template.
// devExampleTemplate is the template name of the documentation's examples.
const devExampleTemplate = "kibotos-coding"

// e2bTemplate is the E2B-style template of the documentation
// (templates-and-platforms.md), as kibotos dev --e2b-template builds it:
// kibo template build NAME --debootstrap --include bash,python3,git,curl,ca-certificates --user user --sudo
func e2bTemplate(root, name string) template.DebootstrapOptions {
	return template.DebootstrapOptions{StorageRoot: root, Name: name, Include: []string{"bash", "python3", "git", "curl", "ca-certificates"},
		User: template.DefaultUser{Name: "user", Sudo: true}}
}

func ensureDevArtifacts(g *Globals, d datadir.Dir, cacheDir, debian, e2b string) error {
	root := d.StorageRoot()
	// The Platform carries this executable as the guest agent: a new build
	// gets a new Platform (an unchanged one is found, not rebuilt).
	start := time.Now()
	in, err := platform.Build(g.ctx, platform.Options{StorageRoot: root, CacheDir: cacheDir, Logger: slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return fmt.Errorf("kibotos dev: build the Platform: %w", err)
	}
	g.note("kibotos dev: Platform %s (kernel %s, agent %s) ready in %s\n", in.ID[:19], in.KernelVersion, in.AgentRevision, time.Since(start).Round(10*time.Millisecond))
	// kibotos-base, and kibotos-coding (the name the documentation's
	// examples use) as the same busybox system unless a Debian template
	// of that name is asked for.
	names := []string{template.DefaultName}
	if debian != devExampleTemplate && e2b != devExampleTemplate {
		names = append(names, devExampleTemplate)
	}
	for _, name := range names {
		if _, err := template.Get(root, name); err == nil {
			continue
		}
		t, err := template.BuildBusybox(g.ctx, root, name, "")
		if err != nil {
			return fmt.Errorf("kibotos dev: build the template %s: %w", name, err)
		}
		g.note("kibotos dev: template %s built (busybox, %s)\n", t.Name, formatBytes(uint64(t.ImageBytes)))
	}
	for _, o := range []struct {
		what string
		opts template.DebootstrapOptions
	}{{"Debian template", template.DebootstrapOptions{StorageRoot: root, Name: debian}}, {"E2B-style template", e2bTemplate(root, e2b)}} {
		if o.opts.Name == "" {
			continue
		}
		if _, err := template.Get(root, o.opts.Name); err == nil {
			continue
		}
		g.note("kibotos dev: building the %s %s with debootstrap (about a minute)\n", o.what, o.opts.Name)
		start := time.Now()
		t, err := buildDebian(g, o.opts, false)
		if err != nil {
			return fmt.Errorf("kibotos dev: build the %s: %w", o.what, err)
		}
		g.note("kibotos dev: template %s built in %s (%s of content)\n", t.Name, time.Since(start).Round(time.Second), formatBytes(uint64(t.ContentBytes)))
	}
	return nil
}

func (c *DevUpCmd) Run(g *Globals) error {
	dir := g.DataDir
	if dir == "" {
		dir = devDataDir()
	}
	d := datadir.Dir(dir)
	if !d.Exists() {
		id, err := cluster.Init(g.ctx, cluster.InitOptions{DataDir: d, NodeID: c.NodeID, Advertise: c.Advertise, Roles: []string{api.RoleCtrl, api.RoleNode}})
		if err != nil {
			return err
		}
		g.note("kibotos dev: created cluster %s in %s\n", id.ClusterID, dir)
	}
	id, err := d.LoadIdentity()
	if err != nil {
		return err
	}
	if err := d.CheckRelease(buildinfo.Release); err != nil {
		return err // before the Platform is built for it
	}
	runsVMs := privsd.Available() == nil || member.HostHasSystemd()
	if runsVMs && !c.NoBuild {
		if err := ensureDevArtifacts(g, d, c.PlatformCache, c.DebianTemplate, c.E2BTemplate); err != nil {
			return err
		}
	}
	var network *netpol.Config
	if runsVMs {
		n, err := netpol.DevConfig()
		if err != nil {
			return fmt.Errorf("kibotos dev: %w", err)
		}
		network = &n
		g.note("kibotos dev: guest network %s, uplink %s, resolver %s\n", n.IPv4Pool, n.Uplink, n.Resolvers[0])
	}
	onReady := func(ctx context.Context, srv *cluster.Server) {
		c.announceWhenReady(ctx, g, d, id, srv.APIAddr(), srv.E2BAddr(), runsVMs)
	}
	// A dev host without systemd as PID 1 gets a private one that outlives
	// kibotos dev, so a restart takes its VMs over; a host with systemd uses it.
	sdMode := member.SystemdDev
	if member.HostHasSystemd() {
		sdMode = member.SystemdHost
	}
	store, err := devArtifactsURL(d)
	if err != nil {
		return err
	}
	var warm []agent.WarmConfig
	for _, name := range slices.Sorted(maps.Keys(c.Warm)) {
		w, err := warmConfig(name, c.Warm[name], 0, "")
		if err != nil {
			return usagef("--warm %s=%d: %v", name, c.Warm[name], err)
		}
		warm = append(warm, w)
	}
	return runMember(g, "info", member.Options{DataDir: d, API: c.api(), E2B: c.e2b(), Capacity: agent.DefaultCapacity(), Timings: cluster.DefaultTimings(), OnReady: onReady, Warm: warm,
		Systemd: sdMode, Accel: qemu.AccelAuto, Network: network, EgressWarm: egress.DefaultWarmConnections, LogFormat: c.LogFormat, Artifacts: artifacts.Config{URL: store},
		// One node on a laptop: a report every few seconds while a guest
		// is denied costs nothing, and `workspace get` shows it soon.
		DeniedReport: 5 * time.Second})
}

// devAPIListen is where kibotos dev serves its API for applications
// unless told otherwise: apart from the ports of its default advertised
// address (7480 to 7483).
const devAPIListen = "127.0.0.1:7443"

// api is the dev member's [api]. Only the default address may be in
// use (another dev cluster holds it); one asked for must be served.
func (c *DevUpCmd) api() cluster.APIConfig {
	if c.APIListen == "none" {
		return cluster.APIConfig{}
	}
	return cluster.APIConfig{Listen: c.APIListen, Optional: c.APIListen == devAPIListen}
}

// devE2BListen is where kibotos dev serves the E2B API unless told
// otherwise.
const devE2BListen = "127.0.0.1:7444"

// e2b is the dev member's [e2b]: E2B's "base" is the E2B-style template
// when one is asked for, else the default template.
func (c *DevUpCmd) e2b() cluster.E2BConfig {
	if c.E2BListen == "none" {
		return cluster.E2BConfig{}
	}
	return cluster.E2BConfig{Listen: c.E2BListen, BaseTemplate: cmp.Or(c.E2BTemplate, template.DefaultName), Optional: c.E2BListen == devE2BListen,
		Domain: devE2BDomain(c.E2BListen)}
}

// devE2BDomain is the domain of dev's sandbox hosts (getHost): names
// under .localhost, which curl and browsers take for the loopback
// address, with the listener's port, which the SDKs keep in the hosts
// they build: https://8000-<sandboxID>.e2b.localhost:7444/.
func devE2BDomain(listen string) string {
	_, port, err := net.SplitHostPort(listen)
	if err != nil || port == "0" {
		return ""
	}
	return "e2b.localhost:" + port
}

// devArtifactsURL is the dev cluster's artifact store: a directory in its
// data directory, created here.
func devArtifactsURL(d datadir.Dir) (string, error) {
	dir, err := filepath.Abs(d.ArtifactsDir())
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("kibotos dev: artifact store: %w", err)
	}
	u := (&url.URL{Scheme: "file", Path: dir}).String()
	if _, err := artifacts.ParseURL(u); err != nil {
		return "", fmt.Errorf("kibotos dev: %w", err)
	}
	return u, nil
}

// announceWhenReady waits for the dev node to be READY and tells the user
// how to point the CLI at it.
//
// It runs until then or until the member stops (ctx): what it does on the
// member's behalf (the demo Workspace) must not outlive it.
func (c *DevUpCmd) announceWhenReady(ctx context.Context, g *Globals, d datadir.Dir, id *datadir.Identity, apiAddr, e2bAddr string, runsVMs bool) {
	member := *g
	member.ctx = ctx
	g = &member
	tlsConf, err := d.AdminClient()
	if err != nil {
		return
	}
	cl := api.NewClient(id.Advertise, tlsConf).Expect(id.NodeID)
	for i := 0; i < 600; i++ {
		var n api.Node
		// Ready for Workspaces: READY, reported and its overcommit values
		// acknowledged (ctrl places nothing on it before).
		if _, err := cl.Do(g.ctx, "GET", "/v1/nodes/"+id.NodeID, nil, &n); err == nil && n.Status == api.NodeReady &&
			n.Report != nil && n.Overcommit != nil && n.Overcommit.Acknowledged {
			if err := devPoolCapacity(g, cl, &n); err != nil {
				g.note("kibotos dev: %v\n", err)
			}
			kibo := kiboCommand()
			g.note("\nkibotos dev: node %s is READY at %s.\n", id.NodeID, id.Advertise)
			if runsVMs && !c.NoDemo {
				c.demo(g, d, kibo)
			}
			g.note("In another shell:\n  export KIBOTOS_DATA_DIR=%s\n  %s node list\n  %s workspace create --template %s -q\n  %s workspace exec WS -- uname -a\n  %s workspace terminal WS\nStop with Ctrl-C (VMs keep running); run kibotos dev again to take them over; kibotos dev down [--purge] ends everything.\n\n",
				d, kibo, kibo, template.DefaultName, kibo, kibo)
			if apiAddr != "" || e2bAddr != "" {
				c.announceAPI(g, cl, d, apiAddr, e2bAddr)
			}
			return
		}
		select {
		case <-g.ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// devPoolCapacity gives the dev node's private pool a capacity the first
// time (a pool without one takes no Workspace): the size of the file
// system it is on, which kibo storage-pool set-capacity can change.
func devPoolCapacity(g *Globals, cl *api.Client, n *api.Node) error {
	id := api.PrivatePoolID(n.NodeID)
	var p api.StoragePool
	if _, err := cl.Do(g.ctx, "GET", poolPath(id), nil, &p); err != nil {
		return fmt.Errorf("storage pool %s: %w", id, err)
	}
	if p.CapacityBytes != nil {
		return nil
	}
	var size uint64
	for _, rp := range n.Report.Pools {
		if rp.PoolID == id {
			size = rp.CapacityBytes
		}
	}
	if size == 0 {
		return fmt.Errorf("storage pool %s: its file system's size is unknown; set a capacity with kibo storage-pool set-capacity %s SIZE", id, id)
	}
	req := api.PoolCapacityRequest{WriteMeta: writeMeta("", &p.Version), CapacityBytes: min(size, api.MaxPoolCapacity)}
	if _, err := cl.Do(g.ctx, "POST", poolPath(id, "capacity"), req, &p); err != nil {
		return fmt.Errorf("storage pool %s: capacity not set: %w", id, err)
	}
	g.note("kibotos dev: storage pool %s capacity set to %s (its file system; change it with kibo storage-pool set-capacity)\n", id, formatBytes(*p.CapacityBytes))
	return nil
}

// demo creates a Workspace when the cluster has none and runs echo hello
// in it, so the first run shows the whole path working.
func (c *DevUpCmd) demo(g *Globals, d datadir.Dir, kibo string) {
	sub := *g
	sub.DataDir = string(d)
	sub.JSON = false
	sub.Timeout = 5 * time.Minute
	var list api.WorkspaceList
	if _, err := sub.call("GET", "/v1/workspaces?all=true&page_size=1", nil, &list); err != nil || len(list.Workspaces) > 0 {
		return
	}
	var out bytes.Buffer
	sub.stdout = &out
	start := time.Now()
	create := &WorkspaceCreateCmd{Template: template.DefaultName, CPU: 1, Memory: "512MiB", Label: map[string]string{"kibotos-dev": "demo"}, Quiet: true}
	if err := create.Run(&sub); err != nil {
		g.note("kibotos dev: demo Workspace not created: %v\n", err)
		return
	}
	ws := strings.TrimSpace(out.String())
	g.note("kibotos dev: created Workspace %s in %s\n", ws, time.Since(start).Round(100*time.Millisecond))
	g.note("kibotos dev: %s workspace exec %s -- echo hello\n", kibo, ws)
	sub.stdout, sub.stderr, sub.stdin = g.stderr, g.stderr, nil
	code, err := runInWorkspace(&sub, ws, []string{"echo", "hello"}, false, "", nil)
	if err != nil || code != 0 {
		g.note("kibotos dev: exec in %s failed (exit %d): %v\n", ws, code, err)
	}
}

// DevDownCmd ends the dev cluster's VMs and its private systemd.
type DevDownCmd struct {
	Purge bool `name:"purge" help:"Also remove the dev data directory (cluster state, credentials, templates, layers)."`
}

func (c *DevDownCmd) Run(g *Globals) error {
	dir := g.DataDir
	if dir == "" {
		dir = devDataDir()
	}
	d := datadir.Dir(dir)
	if !d.Exists() {
		return api.Errorf(api.CodeNotFound, "no dev cluster in %s (pass --data-dir)", dir)
	}
	release, err := d.Lock()
	if err != nil {
		return api.Errorf(api.CodeFailedPrecondition, "kibotos dev is running with %s: stop it (Ctrl-C) first", dir)
	}
	defer release()
	id, err := d.LoadIdentity()
	if err != nil {
		return err
	}
	var target units.Target
	var sd *privsd.Instance
	if member.HostHasSystemd() {
		if target, err = units.HostTarget(); err != nil {
			return err
		}
	} else {
		sd, err = privsd.Attach(g.ctx, member.DevSystemdDir(d))
		switch {
		case errors.Is(err, privsd.ErrNotRunning):
			sd = nil
		case err != nil:
			return err
		default:
			// Stop ends it below; the paths that return before let it go.
			defer sd.Release()
			target = sd.Target()
		}
	}
	deleted, dpStopped := 0, 0
	if target.Socket != "" {
		m, err := units.Connect(g.ctx, target)
		if err != nil {
			return err
		}
		// With the network kibotos dev runs with, so taking the VMs over
		// does not isolate them before they end.
		var network *netpol.Config
		if n, err := netpol.DevConfig(); err == nil {
			network = &n
		}
		rt, err := runtime.Open(g.ctx, runtime.Config{StorageRoot: d.StorageRoot(), NodeID: id.NodeID, Units: m, Accel: qemu.AccelAuto, Network: network})
		if err != nil {
			m.Close()
			return err
		}
		for _, st := range rt.List() {
			if err := rt.Delete(g.ctx, st.ID); err != nil {
				if sd == nil {
					rt.Close()
					m.Close()
					return err
				}
				// An Instance caught mid-start cannot be deleted cleanly;
				// stopping the private systemd below ends its VMM anyway.
				g.note("kibotos dev: %v; the private systemd stop ends it\n", err)
				continue
			}
			deleted++
		}
		if len(rt.List()) == 0 {
			// No guest left to route for: the node's own rule table goes.
			if err := removeHostTable(g.ctx); err != nil {
				g.note("kibotos dev: %v\n", err)
			}
		}
		rt.Close()
		// The data-plane process outlives the node by design; on the host's
		// systemd nothing else would end it.
		dpStopped, err = dataplane.StopScope(g.ctx, m, member.NodeScope(d))
		m.Close()
		if err != nil {
			return err
		}
	}
	if sd != nil {
		if err := sd.Stop(); err != nil {
			return err
		}
		// Its egress processes ended with it; their socket directory is
		// in the shared temporary directory.
		if err := member.RemoveEgressSocketDirs(d); err != nil {
			return err
		}
	}
	g.printf("kibotos dev: %d VM(s) ended, %d data-plane process(es) stopped", deleted, dpStopped)
	if sd != nil {
		g.printf(", private systemd stopped")
	}
	if c.Purge {
		release()
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		g.printf(", %s removed", dir)
	}
	g.printf("\n")
	return nil
}

// removeHostTable removes the node's nftables table and the routing of
// proxied guests from this process's network namespace.
func removeHostTable(ctx context.Context) error {
	ns, err := netns.GetFromPath("/proc/self/ns/net")
	if err != nil {
		return err
	}
	defer ns.Close()
	return errors.Join(netpol.RemoveHost(ctx, int(ns)), netpol.RemoveProxyRouting(ns))
}

// devKeyFile holds the secret of the API key kibotos dev made, root-only
// in the dev data directory, so that each run reuses the key while it is
// active instead of making a new one.
const devKeyFile = "api-key"

// devKeyName is that key's name (namespace default, role sandbox).
const devKeyName = "dev"

// devE2BEnvFile holds, root-only in the dev data directory, the
// environment of E2B's SDKs for the dev cluster (it has the key).
const devE2BEnvFile = "e2b.env"

// announceAPI tells how applications reach the dev cluster's API and its
// E2B API: their URLs, the CA file and an API key it made (the secret
// stays in files).
func (c *DevUpCmd) announceAPI(g *Globals, cl *api.Client, d datadir.Dir, apiAddr, e2bAddr string) {
	ca, _ := filepath.Abs(d.CACert())
	keyFile, _ := filepath.Abs(filepath.Join(string(d), devKeyFile))
	if err := devAPIKey(g, cl, keyFile); err != nil {
		g.note("Applications reach its API with an API key (--api-url, --token), trusting the CA file %s (--ca-file); no key was made: %v\n\n", ca, err)
		return
	}
	if apiAddr != "" {
		g.note("Applications reach its API with the API key %s it made (namespace default, role sandbox; the secret is in %s):\n  export KIBOTOS_API_URL=https://%s KIBOTOS_CA_FILE=%s KIBOTOS_TOKEN=$(cat %s)\n  %s workspace list\n\n",
			devKeyName, keyFile, apiAddr, ca, keyFile, kiboCommand())
	}
	if e2bAddr == "" {
		return
	}
	envFile, _ := filepath.Abs(filepath.Join(string(d), devE2BEnvFile))
	if err := writeE2BEnv(envFile, keyFile, e2bAddr, devE2BDomain(c.E2BListen), ca); err != nil {
		g.note("E2B's SDKs reach it at https://%s with the key in %s (E2B_API_URL, E2B_API_KEY, NODE_EXTRA_CA_CERTS=%s); %v\n\n", e2bAddr, keyFile, ca, err)
		return
	}
	g.note("E2B's SDKs reach its E2B API with the same key (sandboxes, commands, files and pty; docs/e2b.md):\n  set -a; . %s; set +a\n\n", envFile)
}

// writeE2BEnv writes the environment of E2B's SDKs for the E2B API at
// addr with the key in keyFile, root-only: E2B_API_URL, E2B_API_KEY, and
// NODE_EXTRA_CA_CERTS, since the listener's certificate is of the
// cluster CA; E2B_SANDBOX_URL is the same address (the sandbox API), since
// the names of E2B_DOMAIN, the sandboxes' hosts, need not resolve.
func writeE2BEnv(path, keyFile, addr, domain, ca string) error {
	raw, err := os.ReadFile(keyFile)
	if err != nil {
		return err
	}
	env := fmt.Sprintf("E2B_API_URL=https://%[1]s\nE2B_SANDBOX_URL=https://%[1]s\nE2B_API_KEY=%[2]s\nNODE_EXTRA_CA_CERTS=%[3]s\n", addr, strings.TrimSpace(string(raw)), ca)
	if domain != "" {
		env += "E2B_DOMAIN=" + domain + "\n"
	}
	return datadir.WriteFileAtomic(path, []byte(env), 0o600)
}

// devAPIKey makes sure keyFile holds the secret of an active key: the one
// it holds if ctrl still has it active, else a new one (an earlier one of
// that name, expired or not, is revoked first).
func devAPIKey(g *Globals, cl *api.Client, keyFile string) error {
	var keys []api.APIKey
	if _, err := cl.Do(g.ctx, "GET", "/v1/api-keys", nil, &keys); err != nil {
		return err
	}
	var current *api.APIKey
	for i := range keys {
		if keys[i].Name == devKeyName {
			current = &keys[i]
		}
	}
	if raw, err := os.ReadFile(keyFile); err == nil && current != nil && current.State == api.OperatorActive {
		if id, _, ok := api.ParseKeySecret(strings.TrimSpace(string(raw))); ok && id == current.KeyID {
			return nil
		}
	}
	if current != nil && current.State == api.OperatorActive {
		if _, err := cl.Do(g.ctx, "POST", "/v1/api-keys/"+devKeyName+"/revoke", api.WriteMeta{}, nil); err != nil {
			return err
		}
	}
	id, secret, hash := api.NewKeySecret()
	req := api.APIKeyCreateRequest{Name: devKeyName, Namespace: api.DefaultNamespace, Role: api.KeyRoleSandbox, KeyID: id, SecretHash: hash}
	if _, err := cl.Do(g.ctx, "POST", "/v1/api-keys", req, nil); err != nil {
		return err
	}
	return datadir.WriteFileAtomic(keyFile, []byte(secret+"\n"), 0o600)
}
