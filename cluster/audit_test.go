package cluster_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/internal/testenv"
)

// The member that receives a request logs every write it serves (who,
// what, the status) and every request it refuses for its credentials or
// its role (from where, what, why); refused callers are not told who
// leads.
func TestWritesAndRefusalsAreAudited(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, Logs: &logs})
	m := c.Members[0]
	ctx := context.Background()
	if _, err := c.Client(m).Do(ctx, "POST", "/v1/nodes/node-1/drain", api.WriteMeta{CommandID: "audit-1"}, nil); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Get("https://" + m.Addr + "/v1/nodes")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("X-Kibotos-Leader") != "" {
		t.Errorf("anonymous GET /v1/nodes: %d, X-Kibotos-Leader %q; want 401 without the leader", resp.StatusCode, resp.Header.Get("X-Kibotos-Leader"))
	}
	testenv.WaitFor(t, 5*time.Second, "the write and the refusal in the member's log", func() (bool, string) {
		out := logs.String()
		write := strings.Contains(out, `caller=admin@node-1 method=POST path=/v1/nodes/node-1/drain status=200`)
		refused := strings.Contains(out, `method=GET path=/v1/nodes remote=127.0.0.1 code=unauthenticated reason="a client certificate`)
		return write && refused, out
	})
}
