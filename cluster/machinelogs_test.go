package cluster_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/trust"
)

// `workspace logs` over the API: an operator asks a ctrl member, which
// asks the node-only member holding the Instance (over mTLS, as a ctrl
// member) and answers with what that node read, within the bounds asked
// and never more than the hard cap. Instances that are not the
// Workspace's, ids that are paths, logs the node no longer keeps and an
// unreachable node each get their own code; only ctrl members may call
// the node's internal route.
func TestWorkspaceLogsOverHTTP(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1,
		AdjustReport: func(node string, r *api.Report) {
			if node == "node-2" {
				r.Templates = append(r.Templates, "kibotos-coding")
			}
		},
		// The start stays pending: the Instance is node-2's, with no VM.
		HoldTask: func(string, api.WorkspaceTask) bool { return true },
	})
	ctrl, node := c.Members[0], c.Members[1]
	var lines strings.Builder
	for i := 1; i <= 1000; i++ {
		fmt.Fprintf(&lines, "boot line %d\n", i)
	}
	console := lines.String()
	var asked atomic.Int64
	var after atomic.Value
	var gone atomic.Bool
	node.ServeMachineLogs(func(id string, q api.MachineLogQuery) (api.MachineLog, error) {
		max := q.MaxBytes
		asked.Store(max)
		after.Store(q.After)
		if gone.Load() {
			return api.MachineLog{}, api.Errorf(api.CodeNotFound, "this node has no machine log of instance %s", id)
		}
		l := api.MachineLog{InstanceID: id, Live: true, Console: console, VMM: "qemu started\n"}
		if int64(len(console)) > max {
			l.Console, l.ConsoleTruncated = console[int64(len(console))-max:], true
		}
		return l, nil
	})

	cl := c.Client(ctrl)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ws api.Workspace
	create := api.WorkspaceCreateRequest{WriteMeta: api.WriteMeta{CommandID: "logs-1"}, Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20}
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", create, &ws); err != nil {
		t.Fatal(err)
	}
	if ws.NodeID != "node-2" || ws.InstanceID == "" {
		t.Fatalf("created on %q with instance %q, want node-2", ws.NodeID, ws.InstanceID)
	}
	logs := func(cl *api.Client, q url.Values) (api.MachineLog, error) {
		var l api.MachineLog
		_, err := cl.Do(ctx, "GET", "/v1/workspaces/"+ws.WorkspaceID+"/logs?"+q.Encode(), nil, &l)
		return l, err
	}

	l, err := logs(cl, url.Values{"tail": {"3"}})
	if err != nil {
		t.Fatal(err)
	}
	if l.Console != "boot line 998\nboot line 999\nboot line 1000\n" || !l.ConsoleTruncated || l.VMM != "qemu started\n" ||
		l.NodeID != "node-2" || l.InstanceID != ws.InstanceID || l.WorkspaceID != ws.WorkspaceID || !l.Live {
		t.Fatalf("tail 3: %+v", l)
	}
	if asked.Load() != api.MachineLogDefaultBytes {
		t.Errorf("the node was asked for %d bytes, want the default %d", asked.Load(), api.MachineLogDefaultBytes)
	}
	// Through the node-only member too: it sends the operator to ctrl.
	if l, err = logs(c.Client(node), url.Values{"max_bytes": {"100"}, "instance": {ws.InstanceID}}); err != nil || len(l.Console) != 100 || asked.Load() != 100 {
		t.Fatalf("100 bytes via node-2: %d bytes (node asked for %d), %v", len(l.Console), asked.Load(), err)
	}

	// A follow read hands the node the cursor of the one before.
	if _, err := logs(cl, url.Values{"after": {"1234.56"}}); err != nil || after.Load() != "1234.56" {
		t.Fatalf("after a cursor: the node got %q, %v", after.Load(), err)
	}

	refused := func(q url.Values, code api.Code, msg string) {
		t.Helper()
		_, err := logs(cl, q)
		if api.CodeOf(err) != code || !strings.Contains(err.Error(), msg) {
			t.Errorf("logs %v: %v, want %s saying %q", q, err, code, msg)
		}
	}
	refused(url.Values{"max_bytes": {fmt.Sprint(api.MachineLogMaxBytes + 1)}}, api.CodeInvalidArgument, "give a count from 1 to 1048576")
	refused(url.Values{"tail": {"-1"}}, api.CodeInvalidArgument, "tail \"-1\"")
	refused(url.Values{"instance": {"../../../etc/passwd"}}, api.CodeInvalidArgument, "is not an Instance id")
	refused(url.Values{"after": {"../1"}}, api.CodeInvalidArgument, "is not a console cursor")
	refused(url.Values{"instance": {"inst-aaaaaaaaaaaaaaaaaaaaaaaaaa"}}, api.CodeNotFound, "workspace "+ws.WorkspaceID+" has no instance inst-aaaaaaaaaaaaaaaaaaaaaaaaaa")
	if _, err := cl.Do(ctx, "GET", "/v1/workspaces/ws-nosuch/logs", nil, nil); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("unknown Workspace: %v, want not_found", err)
	}

	// The node's internal route takes ctrl members only, as themselves:
	// not operators, not node members, not a ctrl member speaking for
	// someone else.
	internal := "/v1/internal/machine-logs/" + ws.InstanceID
	if _, err := c.Client(node).Do(ctx, "GET", internal, nil, nil); api.CodeOf(err) != api.CodePermissionDenied {
		t.Errorf("operator on the node's internal route: %v, want permission_denied", err)
	}
	if status, e := rawCall(t, node, memberCert(t, node), node.Addr, "GET", internal, nil, nil); status != http.StatusForbidden || e == nil || !strings.Contains(e.Message, "is not a ctrl member") {
		t.Errorf("node member certificate on the internal route: %d %v, want 403", status, e)
	}
	// The actor is admitted (the node checks that with ctrl first); only
	// the role refuses it.
	ac := adminCert(t, ctrl)
	leaf, err := x509.ParseCertificate(ac.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	actor, err := trust.FromCert(leaf)
	if err != nil {
		t.Fatal(err)
	}
	admin := map[string]string{"X-Kibotos-Actor": "admin@" + ctrl.ID, "X-Kibotos-Actor-Kind": "admin", "X-Kibotos-Actor-Node": ctrl.ID,
		"X-Kibotos-Actor-Admitted": strconv.FormatInt(actor.Admitted.UnixNano(), 10)}
	if status, e := rawCall(t, node, memberCert(t, ctrl), node.Addr, "GET", internal, nil, admin); status != http.StatusForbidden {
		t.Errorf("ctrl member certificate speaking for an operator on the internal route: %d %v, want 403", status, e)
	}
	if status, e := rawCall(t, node, memberCert(t, ctrl), node.Addr, "GET", internal, nil, nil); status != http.StatusOK {
		t.Errorf("ctrl member certificate on the internal route: %d %v, want 200", status, e)
	}
	// The node's upload routes (kibo template publish, kibo platform
	// publish) are guarded the same way, and refuse a name that is not a
	// template name or Platform id.
	for _, route := range []struct{ upload, bad string }{
		{"/v1/internal/templates/kibotos-coding/upload", "/v1/internal/templates/Bad.Name!/upload"},
		{"/v1/internal/platforms/own/upload", "/v1/internal/platforms/sha256-x/upload"},
		{"/v1/internal/transfers/export", "/v1/internal/transfers/export"},
	} {
		if _, err := c.Client(node).Do(ctx, "POST", route.upload, nil, nil); api.CodeOf(err) != api.CodePermissionDenied {
			t.Errorf("operator on the node's upload route %s: %v, want permission_denied", route.upload, err)
		}
		if status, e := rawCall(t, node, memberCert(t, node), node.Addr, "POST", route.upload, nil, nil); status != http.StatusForbidden || e == nil || !strings.Contains(e.Message, "is not a ctrl member") {
			t.Errorf("node member certificate on the upload route %s: %d %v, want 403", route.upload, status, e)
		}
		if status, e := rawCall(t, node, memberCert(t, ctrl), node.Addr, "POST", route.bad, nil, nil); status != http.StatusBadRequest || e == nil || e.Code != api.CodeInvalidArgument {
			t.Errorf("ctrl member on %s: %d %v, want 400 invalid_argument", route.bad, status, e)
		}
	}

	// How far an export is: ctrl members only, a Transfer id, and only
	// while the node exports it.
	progress := "/v1/internal/transfers/tr-" + strings.Repeat("a", 26) + "/progress"
	if _, err := c.Client(node).Do(ctx, "GET", progress, nil, nil); api.CodeOf(err) != api.CodePermissionDenied {
		t.Errorf("operator on the node's progress route: %v, want permission_denied", err)
	}
	if status, e := rawCall(t, node, memberCert(t, ctrl), node.Addr, "GET", progress, nil, nil); status != http.StatusNotFound || e == nil || !strings.Contains(e.Message, "is not being exported") {
		t.Errorf("progress of a Transfer the node does not export: %d %v, want 404", status, e)
	}
	if status, e := rawCall(t, node, memberCert(t, ctrl), node.Addr, "GET", "/v1/internal/transfers/x/progress", nil, nil); status != http.StatusBadRequest || e == nil {
		t.Errorf("progress of a bad id: %d %v, want 400", status, e)
	}

	// How far a publish, fetch or import is: the same guard, and only the
	// keys a node lists its transfers under.
	wsProgress := "/v1/internal/progress/" + url.PathEscape(api.WorkspaceProgressKey(ws.WorkspaceID))
	if _, err := c.Client(node).Do(ctx, "GET", wsProgress, nil, nil); api.CodeOf(err) != api.CodePermissionDenied {
		t.Errorf("operator on the node's progress route: %v, want permission_denied", err)
	}
	if status, e := rawCall(t, node, memberCert(t, node), node.Addr, "GET", wsProgress, nil, nil); status != http.StatusForbidden {
		t.Errorf("node member certificate on the progress route: %d %v, want 403", status, e)
	}
	if status, e := rawCall(t, node, memberCert(t, ctrl), node.Addr, "GET", wsProgress, nil, nil); status != http.StatusNotFound || e == nil || !strings.Contains(e.Message, "nothing runs under workspace/"+ws.WorkspaceID) {
		t.Errorf("progress of a Workspace the node fetches nothing for: %d %v, want 404", status, e)
	}
	for _, bad := range []string{"workspace%2F..%2Fetc", "template-publish%2FBad.Name!", "other%2Fx", "workspace"} {
		if status, e := rawCall(t, node, memberCert(t, ctrl), node.Addr, "GET", "/v1/internal/progress/"+bad, nil, nil); status != http.StatusBadRequest || e == nil || e.Code != api.CodeInvalidArgument {
			t.Errorf("progress key %s: %d %v, want 400 invalid_argument", bad, status, e)
		}
	}
	// Through ctrl, an operator asks by Workspace.
	if _, err := cl.Do(ctx, "GET", "/v1/workspaces/"+ws.WorkspaceID+"/progress", nil, nil); api.CodeOf(err) != api.CodeNotFound || !strings.Contains(err.Error(), "nothing runs under workspace/"+ws.WorkspaceID+" on member node-2") {
		t.Errorf("workspace progress through ctrl: %v, want not_found from node-2", err)
	}

	gone.Store(true)
	refused(url.Values{}, api.CodeNotFound, "machine log of instance "+ws.InstanceID+" (workspace "+ws.WorkspaceID+") is gone: node node-2 no longer keeps it")

	node.Stop()
	cl.Retries = 1
	refused(url.Values{}, api.CodeUnavailable, "node node-2 did not answer")
}
