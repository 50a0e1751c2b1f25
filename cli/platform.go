package cli

import (
	"log/slog"
	"strings"
	"time"

	"github.com/kibotos/kibotos/vmm/platform"
)

// PlatformCmd groups the Platform commands. build and list --local work
// on this host's storage root and need no running member; the others work
// on the cluster's catalog.
type PlatformCmd struct {
	Build    PlatformBuildCmd    `cmd:"" help:"Build a Platform from the Debian cloud kernel, busybox-static and this kibotos executable."`
	Publish  PlatformPublishCmd  `cmd:"" help:"Put a node's Platform into the artifact store and record it in the cluster's catalog."`
	Approve  PlatformApproveCmd  `cmd:"" help:"Approve a published Platform: it becomes the default of its kernel series, which new Instances start on."`
	Withdraw PlatformWithdrawCmd `cmd:"" help:"Remove a Platform from the catalog; refused for the default of a kernel series and while Workspaces run on it."`
	List     PlatformListCmd     `cmd:"" help:"List the cluster's Platform catalog (--local: the Platforms installed on this host)."`
}

// PlatformBuildCmd builds (or finds) the Platform for this executable.
type PlatformBuildCmd struct {
	StorageRoot   string   `name:"storage-root" help:"Storage root holding installations/; default: <data-dir>/storage."`
	KernelPackage string   `name:"kernel-package" help:"Debian kernel package (a metapackage is resolved to its linux-image-<release>) or a path to a .deb; default: linux-image-cloud-amd64."`
	CacheDir      string   `name:"cache-dir" help:"Where downloaded and unpacked kernel packages are kept; default: <storage-root>/cache/platform."`
	Module        []string `name:"module" help:"Kernel module to load in the guest (repeatable); default: virtio_mmio, virtio_console, virtio_blk, virtio_net."`
	Verbose       bool     `name:"verbose" short:"v" help:"Log each step."`
}

func (c *PlatformBuildCmd) Run(g *Globals) error {
	root := c.StorageRoot
	if root == "" {
		root = g.dir().StorageRoot()
	}
	lvl := slog.LevelInfo
	if c.Verbose {
		lvl = slog.LevelDebug
	}
	in, err := platform.Build(g.ctx, platform.Options{
		StorageRoot:   root,
		CacheDir:      c.CacheDir,
		KernelPackage: c.KernelPackage,
		Modules:       c.Module,
		Logger:        slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: lvl})),
	})
	if err != nil {
		return err
	}
	if g.JSON {
		return printResult(g, in)
	}
	g.printf("%s\n", in.ID)
	g.note("platform %s: kernel %s (%s %s), agent %s, %s in %s\n", in.ID, in.KernelVersion,
		in.KernelPackage, in.KernelPackageVersion, in.AgentRevision, formatBytes(uint64(in.Size())), in.Dir)
	return nil
}

// PlatformListCmd lists the catalog, or the installed Platforms, newest
// first.
type PlatformListCmd struct {
	StorageRoot string `name:"storage-root" help:"Storage root holding installations/; default: <data-dir>/storage. Implies --local."`
	Local       bool   `name:"local" help:"List the Platforms installed on this host (its storage root) instead of the catalog."`
	Quiet       bool   `short:"q" name:"quiet" help:"Print only the Platform ids."`
}

func (c *PlatformListCmd) Run(g *Globals) error {
	if !c.Local && c.StorageRoot == "" {
		return c.runCatalog(g)
	}
	root := c.StorageRoot
	if root == "" {
		root = g.dir().StorageRoot()
	}
	ins, err := platform.List(root)
	if ins == nil {
		ins = []*platform.Installation{}
	}
	if g.JSON {
		if perr := printResult(g, ins); perr != nil {
			return perr
		}
		return err
	}
	if c.Quiet {
		for _, in := range ins {
			g.printf("%s\n", in.ID)
		}
		return err
	}
	t := newTable(g.stdout, "ID", "KERNEL", "KERNEL_PACKAGE", "AGENT", "SIZE", "CREATED")
	for _, in := range ins {
		t.row(in.ID, in.KernelVersion, in.KernelPackageVersion, shortRevision(in.AgentRevision),
			formatBytes(uint64(in.Size())), in.CreatedAt.Format(time.RFC3339))
	}
	t.flush()
	return err
}

func shortRevision(r string) string {
	if len(r) > 12 && !strings.Contains(r, "-") {
		return r[:12]
	}
	return r
}
