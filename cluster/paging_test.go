package cluster_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// A list's paging parameters are checked, and a list answered whole
// refuses them instead of ignoring them.
func TestListPagingParametersAreChecked(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	cl := c.Client(c.Members[0])
	ctx := context.Background()
	for _, path := range []string{
		"/v1/nodes?page_size=-1",
		"/v1/nodes?page_size=10001",
		"/v1/nodes?page_size=x",
		"/v1/workspaces?page_token=" + url.QueryEscape("a\x1b[2J"),
		"/v1/volumes?page_token=" + url.QueryEscape(string(make([]byte, 300))),
		"/v1/enrollment/grants?page_size=1",
		"/v1/platforms?page_token=x",
	} {
		if _, err := cl.Do(ctx, "GET", path, nil, nil); api.CodeOf(err) != api.CodeInvalidArgument {
			t.Errorf("GET %q: %v; want invalid_argument", path, err)
		}
	}
	var page api.NodeList
	if _, err := cl.Do(ctx, "GET", "/v1/nodes?page_size=1&page_token=node-0", nil, &page); err != nil || len(page.Nodes) != 1 || page.Nodes[0].NodeID != "node-1" {
		t.Errorf("a valid page: %+v, %v", page, err)
	}
}
