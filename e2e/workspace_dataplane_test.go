package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/credential"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/member"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"

	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
)

// credential asks ctrl for a data-plane credential for the Workspace, as
// the CLI does, and returns it with the cluster CA to check the node by.
func (d *wsDev) credential(ctx context.Context, id string) (api.DataPlaneCredential, *x509.CertPool) {
	t := d.t
	t.Helper()
	dir := datadir.Dir(d.dir)
	ident, err := dir.LoadIdentity()
	if err != nil {
		t.Fatal(err)
	}
	tlsConf, err := dir.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	roots, err := dir.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	var cred api.DataPlaneCredential
	if _, err := api.NewClient(ident.Advertise, tlsConf).Do(ctx, "POST", "/v1/workspaces/"+id+"/credentials", struct{}{}, &cred); err != nil {
		t.Fatalf("credential: %v", err)
	}
	return cred, roots
}

// testCredentials: the node's data plane refuses a credential signed by
// another key, one past its expiry and one naming another Workspace, and
// still accepts a good one; each refusal carries its code.
func (d *wsDev) testCredentials(id string) {
	t := d.t
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	good, roots := d.credential(ctx, id)
	caKey, err := os.ReadFile(datadir.Dir(d.dir).CAKey())
	if err != nil {
		t.Fatal(err)
	}
	ctrlKey, err := credential.KeyFromCA(caKey)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	valid := credential.Claims{WorkspaceID: good.WorkspaceID, InstanceID: good.InstanceID, NodeID: good.NodeID, IssuedAt: now, ExpiresAt: now.Add(time.Minute)}
	expired := valid
	expired.IssuedAt, expired.ExpiresAt = now.Add(-time.Hour), now.Add(-time.Minute)
	other := valid
	other.WorkspaceID = "ws-someoneelse"
	for _, c := range []struct {
		name, code string
		key        ed25519.PrivateKey
		claims     credential.Claims
	}{
		{"forged", dataplane.CodeForged, otherKey, valid},
		{"expired", dataplane.CodeExpired, ctrlKey, expired},
		{"wrong workspace", dataplane.CodeNoTarget, ctrlKey, other},
	} {
		tok, err := credential.Sign(c.key, c.claims)
		if err != nil {
			t.Fatal(err)
		}
		cred := good
		cred.Credential = tok
		cl, err := dataplane.Connect(ctx, cred, roots)
		var re *dataplane.RefusedError
		if err == nil {
			cl.Close()
			t.Errorf("%s credential accepted", c.name)
		} else if !errors.As(err, &re) || re.Code != c.code {
			t.Errorf("%s credential: %v, want a refusal with code %s", c.name, err, c.code)
		}
	}
	cl, err := dataplane.Connect(ctx, good, roots)
	if err != nil {
		t.Fatalf("the credential from ctrl: %v", err)
	}
	cl.Close()
}

// testDataPlaneKill: when the data-plane process dies, the node starts a
// new generation within seconds and exec works again.
func (d *wsDev) testDataPlaneKill(id string) {
	t := d.t
	// Where the process-model documentation puts it: dataplane/ in the
	// node's socket directory, mode 0700, and nothing in the state
	// directory.
	sockDir := member.DataPlaneSocketDir(datadir.Dir(d.dir), true)
	if st, err := os.Stat(sockDir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("data-plane socket directory %s: %v, %v; want mode 0700", sockDir, st, err)
	}
	if _, err := os.Stat(filepath.Join(datadir.Dir(d.dir).NodeDir(), "dataplane")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the node's state directory has a data-plane directory: %v", err)
	}
	raw, err := os.ReadFile(filepath.Join(sockDir, "generation"))
	if err != nil {
		t.Fatal(err)
	}
	gen, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The unit's main PID as the host sees it, from the dev cluster's own
	// private systemd (its PID namespace numbers differ): never by name.
	sd, err := privsd.Attach(ctx, filepath.Join(datadir.Dir(d.dir).NodeDir(), "systemd"))
	if err != nil {
		t.Fatal(err)
	}
	defer sd.Release()
	m, err := units.Connect(ctx, sd.Target())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	u, err := m.Get(ctx, dataplane.UnitName(member.NodeScope(datadir.Dir(d.dir)), gen))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := m.MainHostPID(u)
	if err != nil || pid <= 1 {
		t.Fatalf("host pid of %s: %d, %v", u.Name, pid, err)
	}
	counted := func() (conns, out float64) {
		fams := d.scrape()
		return metricValue(t, fams, "kibotos_node_dataplane_connections_total"), metricValue(t, fams, "kibotos_node_dataplane_bytes_total", "direction", "out")
	}
	connsBefore, outBefore := counted()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill data-plane pid %d: %v", pid, err)
	}
	testenv.WaitFor(t, 15*time.Second, "exec to work again after the data-plane process was killed", func() (bool, string) {
		r := d.kibo(30*time.Second, nil, "workspace", "exec", id, "--", "echo", "back")
		return r.Code == 0 && r.Stdout == "back\n", r.String()
	})
	if now, _ := os.ReadFile(filepath.Join(sockDir, "generation")); strings.TrimSpace(string(now)) == strings.TrimSpace(string(raw)) {
		t.Errorf("exec works but the data-plane generation is still %s", raw)
	}
	// The killed process's counts still count: nothing went down.
	if conns, out := counted(); conns <= connsBefore || out < outBefore {
		t.Errorf("data-plane counters after the kill: connections %v (before %v), bytes out %v (before %v); want them never lower", conns, connsBefore, out, outBefore)
	}
}
