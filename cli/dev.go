package cli

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/vmm/qemu"
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

// DevCmd runs a one-voter cluster with a node on this host.
type DevCmd struct {
	Advertise string `name:"advertise" default:"127.0.0.1:7480" help:"HOST:PORT of the dev member (gossip uses PORT+1)."`
	NodeID    string `name:"node-id" default:"dev" help:"Node id of the dev member."`
}

func (c *DevCmd) Run(g *Globals) error {
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
	onReady := func(srv *cluster.Server) {
		go func() {
			c.announceWhenReady(g, d, id)
		}()
	}
	// A dev host without systemd as PID 1 gets a private one (VMs end with
	// kibotos dev); a host with systemd uses it.
	sdMode := systemdPrivate
	if hostHasSystemd() {
		sdMode = systemdHost
	}
	return runMember(g, memberOptions{dir: d, level: "info", capacity: agent.DefaultCapacity(), timings: cluster.DefaultTimings(), onReady: onReady,
		systemd: sdMode, accel: qemu.AccelAuto})
}

// announceWhenReady waits for the dev node to be READY and tells the user
// how to point the CLI at it.
func (c *DevCmd) announceWhenReady(g *Globals, d datadir.Dir, id *datadir.Identity) {
	tlsConf, err := d.AdminClientTLS()
	if err != nil {
		return
	}
	cl := api.NewClient(id.Advertise, tlsConf)
	for i := 0; i < 600; i++ {
		var n api.Node
		if _, err := cl.Do(g.ctx, "GET", "/v1/nodes/"+id.NodeID, nil, &n); err == nil && n.Status == api.NodeReady {
			g.note("\nkibotos dev: node %s is READY at %s.\nIn another shell:\n  export KIBOTOS_DATA_DIR=%s\n  %s node list\nStop with Ctrl-C; run kibotos dev again to resume; remove %s to start over.\n\n",
				id.NodeID, id.Advertise, d, kiboCommand(), d)
			return
		}
		select {
		case <-g.ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
