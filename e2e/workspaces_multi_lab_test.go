package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/template"
)

// mhProbeTemplate adds template mh-probe, listed by every node (so ctrl
// places by capacity alone) but unusable: its image is a directory, so a
// node fails the start before booting a VM. Placement probes use it.
func mhProbeTemplate(t *testing.T, root string) {
	t.Helper()
	dir := filepath.Join(template.Dir(root), "sha256-mhprobe")
	if err := os.MkdirAll(filepath.Join(dir, template.ImageFile), 0o755); err != nil {
		t.Fatal(err)
	}
	rec := fmt.Sprintf(`{"format_version": %d, "id": "sha256-mhprobe", "name": "mh-probe", "source": "e2e probe"}`, template.FormatVersion)
	if err := os.WriteFile(filepath.Join(dir, "template.json"), []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mhTwoHosts is a lab of two hosts that boot VMs: node-a (ctrl,node) and
// node-b (node only), their data directories under root (mhRoot).
func mhTwoHosts(t *testing.T) (l *clusterlab.Lab, a, b *clusterlab.Host, root string) {
	t.Helper()
	clusterlab.Require(t)
	runtimetest.RequireVMHost(t)
	testenv.LookPath(t, "qemu-img", "qemu-utils") // retained layers
	l = clusterlab.New(t, 2)
	a, b = l.Hosts[0], l.Hosts[1]
	a.NodeID, a.Roles = "node-a", "ctrl,node"
	b.NodeID, b.Roles = "node-b", "node"
	root = clusterlab.VMRoot(t, l)
	a.DataDir, b.DataDir = filepath.Join(root, "a"), filepath.Join(root, "b")
	return l, a, b, root
}

// mhBuildArtifacts is clusterlab.BuildArtifacts with the probe template.
func mhBuildArtifacts(t *testing.T, dir, binDir string) string {
	t.Helper()
	root := clusterlab.BuildArtifacts(t, dir, binDir)
	mhProbeTemplate(t, root)
	return root
}
