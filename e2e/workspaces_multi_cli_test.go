package e2e

import (
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/clusterlab"
)

func mhVolume(t *testing.T, admin *clusterlab.Host, ref string) api.Volume {
	t.Helper()
	var v api.Volume
	admin.MustKiboJSON(&v, "volume", "get", ref)
	return v
}

// mhDataKiB is the size of the filesystem at /data in the Workspace, as
// its df says (KiB).
func mhDataKiB(t *testing.T, admin *clusterlab.Host, ws string) int {
	t.Helper()
	return dfKiB(t, clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", ws, "--", "df", "-k", "/data").Stdout)
}
