package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// `workspace logs` reads an Instance's machine logs (guest console, VMM
// log) where they are: on the node that holds the Instance, or kept its
// tails when it ended. The operator asks any ctrl member (operator
// certificate, as for get and exec); ctrl resolves the Instance from its
// records and asks that node's member over mTLS as itself, a ctrl member,
// on an internal route. Both ends bound the read (api.MachineLogMaxBytes).

// machineLogAnswerMax bounds what ctrl reads of a node's answer: two logs
// at the most, JSON-escaped (a control character takes six bytes).
const machineLogAnswerMax = 2*6*api.MachineLogMaxBytes + 64<<10

// handleMachineLog is GET /v1/workspaces/{id}/logs[?instance=&max_bytes=&tail=].
func (s *Server) handleMachineLog(r *http.Request) response {
	q, err := api.ParseMachineLogQuery(r.URL.Query())
	if err != nil {
		return fail(err)
	}
	id, inst := r.PathValue("id"), r.URL.Query().Get("instance")
	var ws *api.Workspace
	var nodes []*api.Node
	err = s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		if ws, err = visibleWorkspace(r, tx, id); err != nil {
			return err
		}
		if inst, err = machineLogInstance(ws, inst); err != nil {
			return err
		}
		for _, n := range machineLogNodes(ws, inst) {
			node, err := fsm.GetNode(tx, n)
			if api.CodeOf(err) == api.CodeNotFound {
				continue // retired and gone: its logs went with it
			}
			if err != nil {
				return err
			}
			nodes = append(nodes, node)
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	var unreachable error
	for _, n := range nodes {
		l, err := s.machineLogOf(r.Context(), n, inst, q)
		if err == nil {
			l.WorkspaceID, l.InstanceID, l.NodeID = ws.WorkspaceID, inst, n.NodeID
			return answer(l)
		}
		if api.CodeOf(err) != api.CodeNotFound {
			unreachable = api.Errorf(api.CodeUnavailable, "machine log of instance %s (workspace %s): node %s did not answer: %v; retry once it is back (kibo node get %s)",
				inst, ws.WorkspaceID, n.NodeID, err, n.NodeID)
		}
	}
	if unreachable != nil {
		return fail(unreachable)
	}
	where := "no node holds it"
	if len(nodes) > 0 {
		where = "node " + nodes[0].NodeID + " no longer keeps it"
	}
	return fail(api.Errorf(api.CodeNotFound, "machine log of instance %s (workspace %s) is gone: %s (ended Instances' log tails are pruned oldest first past [logs] machine_logs_max_bytes)",
		inst, ws.WorkspaceID, where))
}

// machineLogInstance is the Instance a read means: the one asked for,
// which must be one of the Workspace's, else the current or latest.
func machineLogInstance(ws *api.Workspace, inst string) (string, error) {
	switch {
	case inst == "":
		if inst = ws.InstanceID; inst == "" {
			inst = fsm.LatestInstanceID(ws)
		}
		if inst == "" {
			return "", api.Errorf(api.CodeFailedPrecondition, "workspace %s has not started yet: it has no machine log; start it with kibo workspace start %s", ws.WorkspaceID, ws.WorkspaceID)
		}
		return inst, nil
	case !api.ValidInstanceID(inst):
		return "", api.Errorf(api.CodeInvalidArgument, "instance %q is not an Instance id (inst- and 26 letters or digits, as kibo workspace get %s shows)", inst, ws.WorkspaceID)
	case !fsm.IsInstanceOf(ws, inst):
		return "", api.Errorf(api.CodeNotFound, "workspace %s has no instance %s: it has had %d; kibo workspace get %s shows the current one", ws.WorkspaceID, inst, ws.Instances, ws.WorkspaceID)
	}
	return inst, nil
}

// machineLogNodes are the nodes that may hold an Instance's logs, most
// likely first: the one running it, the one that concluded it, the one
// holding the Workspace's layer (where its Instances run unless it was
// moved). ctrl keeps no node per ended Instance, so an Instance that ran
// before a move to another node is not found.
func machineLogNodes(ws *api.Workspace, inst string) []string {
	var out []string
	add := func(n string) {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if ws.InstanceID == inst {
		add(ws.NodeID)
	}
	if p := ws.Pending; p != nil && p.InstanceID == inst {
		add(p.NodeID)
	}
	if c := ws.Cleanup; c != nil && c.InstanceID == inst {
		add(c.NodeID)
	}
	if l := ws.Layer; l != nil {
		add(l.NodeID)
	}
	return out
}

// machineLogOf asks node n for an Instance's logs: this member's own
// reader when it is that node, else the node's member over mTLS, which
// must present that node's certificate.
func (s *Server) machineLogOf(ctx context.Context, n *api.Node, inst string, q api.MachineLogQuery) (api.MachineLog, error) {
	if n.NodeID == s.id.NodeID {
		return s.readMachineLog(inst, q)
	}
	var l api.MachineLog
	err := s.nodeCall(ctx, n, http.MethodGet, "/v1/internal/machine-logs/"+url.PathEscape(inst)+"?"+q.Values().Encode(), nil, 30*time.Second, machineLogAnswerMax, &l)
	return l, err
}

// handleNodeMachineLog is GET /v1/internal/machine-logs/{instance} on the
// node: only ctrl members ask (they authorized the operator), as
// themselves.
func (s *Server) handleNodeMachineLog(r *http.Request) response {
	q, err := api.ParseMachineLogQuery(r.URL.Query())
	if err != nil {
		return fail(err)
	}
	l, err := s.readMachineLog(r.PathValue("instance"), q)
	if err != nil {
		return fail(err)
	}
	return answer(l)
}

// readMachineLog reads on this node within q.
func (s *Server) readMachineLog(inst string, q api.MachineLogQuery) (api.MachineLog, error) {
	read := s.own().MachineLogs
	if read == nil {
		return api.MachineLog{}, api.Errorf(api.CodeNotFound, "member %s runs no Instances", s.id.NodeID)
	}
	if !api.ValidInstanceID(inst) {
		return api.MachineLog{}, api.Errorf(api.CodeInvalidArgument, "instance %q is not an Instance id", inst)
	}
	q.MaxBytes = min(q.MaxBytes, api.MachineLogMaxBytes)
	l, err := read(inst, q)
	if err != nil {
		var e *api.Error
		if errors.As(err, &e) {
			return l, e
		}
		return l, fmt.Errorf("member %s: machine log of instance %s: %w", s.id.NodeID, inst, err)
	}
	q.Apply(&l)
	return l, nil
}
