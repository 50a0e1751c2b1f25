package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/trust"
)

// Calls ctrl makes of a node's member on its internal routes: over mTLS
// as this member (a ctrl member), to the node's registered address, which
// must present that node's certificate. The node's routes admit only
// ctrl members (fromCtrl).

// nodeCall is one such call: method and path on node n, whose answer
// ({"result": ...} or {"error": ...}) is read within maxAnswer bytes into
// out. body, if not nil, is sent as JSON. timeout bounds the whole call.
func (s *Server) nodeCall(ctx context.Context, n *api.Node, method, path string, body any, timeout time.Duration, maxAnswer int64, out any) error {
	if n.Address == "" {
		return api.Errorf(api.CodeUnavailable, "node %s has no address registered", n.NodeID)
	}
	tr := s.client.HTTPTransport(trust.Want{Kind: trust.KindMember, NodeID: n.NodeID, Role: trust.RoleNode}, 3*time.Second)
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: timeout}
	var in io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		in = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, "https://"+n.Address+path, in)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return api.Errorf(api.CodeUnavailable, "%v", err)
	}
	defer resp.Body.Close()
	var answer struct {
		Result json.RawMessage `json:"result"`
		Error  *api.Error      `json:"error"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(&answer); err != nil {
		return api.Errorf(api.CodeUnavailable, "answer of member %s (%s) unreadable: %v", n.NodeID, resp.Status, err)
	}
	if answer.Error != nil {
		return answer.Error
	}
	if resp.StatusCode != http.StatusOK {
		return api.Errorf(api.CodeUnavailable, "member %s answered %s", n.NodeID, resp.Status)
	}
	if err := json.Unmarshal(answer.Result, out); err != nil {
		return api.Errorf(api.CodeUnavailable, "answer of member %s unreadable: %v", n.NodeID, err)
	}
	return nil
}

// nodeSideRoutes are what ctrl asks of a node's member for an operator
// it authorized (as itself, a ctrl member): machine logs, uploads for a
// publish, Transfer exports and how far the node's transfers are.
func (s *Server) nodeSideRoutes() []route {
	return []route{
		{"GET", "/v1/internal/machine-logs/{instance}", fromCtrl("machine logs are read through ctrl (kibo workspace logs)"), atNode, s.handleNodeMachineLog},
		{"POST", "/v1/internal/templates/{name}/upload", fromCtrl("templates are published through ctrl (kibo template publish)"), atNode, nodeUploadRoute(s.publishTemplate)},
		{"POST", "/v1/internal/platforms/{name}/upload", fromCtrl("Platforms are published through ctrl (kibo platform publish)"), atNode, nodeUploadRoute(s.publishPlatform)},
		{"POST", "/v1/internal/transfers/export", fromCtrl("exports go through ctrl (kibo transfer export)"), atNode, decoded(s.handleNodeTransferExport)},
		{"GET", "/v1/internal/transfers/{name}/progress", fromCtrl("progress is read through ctrl (kibo transfer get)"), atNode, s.handleNodeTransferProgress},
		{"GET", "/v1/internal/progress/{key}", fromCtrl("progress is read through ctrl"), atNode, s.handleNodeProgress},
	}
}
