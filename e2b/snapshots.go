package e2b

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/api"
)

// Snapshots (the SDKs' createSnapshot, listSnapshots, deleteSnapshot): a
// sandbox as it is now, kept after it ends, that new sandboxes start
// from (Sandbox.create with the snapshot's ID or name). A snapshot is a
// PAUSED fork of the sandbox that never runs again: new sandboxes are
// forks of it, and its disk and memory count against the namespace's
// snapshot bytes like any paused Workspace's. Kibotos lists it among
// the namespace's Workspaces with the label SnapshotLabel; the E2B API
// shows it as no sandbox.

// Labels of a snapshot: SnapshotLabel marks it, SnapshotOfLabel names
// the sandbox it was taken of, SnapshotNameLabel its name, if given.
const (
	SnapshotLabel     = "e2b/snapshot"
	SnapshotOfLabel   = "e2b/snapshot-of"
	SnapshotNameLabel = "e2b/snapshot-name"
)

// snapshotNamePattern is a snapshot's name, as E2B's template aliases.
var snapshotNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// defaultTag is the one tag of a snapshot's name: a new snapshot of the
// same name replaces it.
const defaultTag = "default"

// isSnapshot says whether a Workspace is a snapshot, not a sandbox.
func isSnapshot(ws *api.Workspace) bool { return ws.Labels[SnapshotLabel] != "" }

type snapshotBody struct {
	Name string `json:"name,omitempty"`
}

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotInfoOf(ws *api.Workspace) snapshotInfo {
	out := snapshotInfo{SnapshotID: ws.WorkspaceID, Names: []string{}}
	if name := ws.Labels[SnapshotNameLabel]; name != "" {
		ns := ws.Namespace
		if ns == "" {
			ns = api.DefaultNamespace
		}
		out.Names = append(out.Names, ns+"/"+name+":"+defaultTag)
	}
	return out
}

// createSnapshot is POST /sandboxes/{id}/snapshots: 201 once the
// snapshot is PAUSED. A running sandbox is paused for it and resumed
// after, as for a fork; the snapshot is a fork, started once from the
// sandbox's pause and paused again. A name given moves to the new
// snapshot: the one that had it is deleted.
func (h *handler) createSnapshot(c *call) error {
	id := c.r.PathValue("id")
	var body snapshotBody
	if err := c.decode(&body); err != nil {
		return err
	}
	if body.Name != "" && !snapshotNamePattern.MatchString(body.Name) {
		return api.Errorf(api.CodeInvalidArgument, "snapshot name %q: give 1 to 63 lowercase letters, digits, - and _, beginning with a letter or digit", api.EscapeText(body.Name))
	}
	var older []api.Workspace
	if body.Name != "" {
		var err error
		if older, err = listSnapshots(c, url.Values{"label": {SnapshotNameLabel + "=" + body.Name}}); err != nil {
			return err
		}
	}
	src, resume, err := h.holdPaused(c, id)
	if err != nil {
		return err
	}
	defer resume()
	labels := map[string]string{SnapshotLabel: "yes", SnapshotOfLabel: id, CreatorLabel: c.keyID()}
	if body.Name != "" {
		labels[SnapshotNameLabel] = body.Name
	}
	snap, err := createRunning(c, api.WorkspaceCreateRequest{From: src.WorkspaceID, Labels: labels, Network: src.Network})
	if err != nil {
		return err
	}
	ctx := c.r.Context()
	if _, err = c.cl.Do(ctx, http.MethodPost, workspacePath(snap.WorkspaceID, "pause"), api.WorkspaceWriteRequest{}, nil); err == nil {
		snap, err = waitPaused(ctx, c.cl, snap.WorkspaceID)
	}
	if err != nil {
		c.cl.Do(context.WithoutCancel(ctx), http.MethodPost, workspacePath(snap.WorkspaceID, "delete"), api.WorkspaceWriteRequest{}, nil)
		return err
	}
	for _, old := range older {
		if _, err := c.cl.Do(ctx, http.MethodPost, workspacePath(old.WorkspaceID, "delete"), api.WorkspaceWriteRequest{}, nil); err != nil {
			// Left with the name: Sandbox.create by name takes the newest.
			h.c.Log.Warn("snapshot not deleted after a new one took its name", "snapshot_id", old.WorkspaceID, "name", body.Name, "err", err)
		}
	}
	return c.reply(http.StatusCreated, snapshotInfoOf(snap))
}

// listSnapshotsPage is GET /snapshots: the namespace's snapshots, of a
// sandbox (sandboxID) or by name or ID (name), a page of limit with
// X-Next-Token.
func (h *handler) listSnapshotsPage(c *call) error {
	q := c.r.URL.Query()
	in := url.Values{"label": {SnapshotLabel + "=yes"}, "state": {api.WorkspacePaused}}
	if id := q.Get("sandboxID"); id != "" {
		in.Add("label", SnapshotOfLabel+"="+id)
	}
	var id string
	if ref := q.Get("name"); ref != "" {
		name, isID, ok := parseSnapshotRef(ref)
		if !ok {
			return c.reply(http.StatusOK, []snapshotInfo{})
		}
		if isID {
			id = name
		} else {
			in.Add("label", SnapshotNameLabel+"="+name)
		}
	}
	limit, err := pageLimit(q)
	if err != nil {
		return err
	}
	in.Set("page_size", strconv.Itoa(limit))
	if t := q.Get("nextToken"); t != "" {
		in.Set("page_token", t)
	}
	var page api.WorkspaceList
	if _, err := c.cl.Do(c.r.Context(), http.MethodGet, "/v1/workspaces?"+in.Encode(), nil, &page); err != nil {
		return err
	}
	out := []snapshotInfo{}
	for i := range page.Workspaces {
		if id == "" || page.Workspaces[i].WorkspaceID == id {
			out = append(out, snapshotInfoOf(&page.Workspaces[i]))
		}
	}
	if page.NextPageToken != "" {
		c.w.Header().Set("X-Next-Token", page.NextPageToken)
	}
	return c.reply(http.StatusOK, out)
}

// deleteSnapshot is DELETE /templates/{id}, the SDKs' deleteSnapshot:
// 204, or 404 when it names no snapshot (Kibotos templates are not
// deleted through the E2B API).
func (h *handler) deleteSnapshot(c *call) error {
	ref := c.r.PathValue("id")
	snap, err := snapshotByRef(c, ref)
	if err != nil {
		return err
	}
	if snap == nil {
		return api.Errorf(api.CodeNotFound, "snapshot %s not found (Kibotos templates are managed with kibo template, not the E2B API)", api.EscapeText(ref))
	}
	if _, err := c.cl.Do(c.r.Context(), http.MethodPost, workspacePath(snap.WorkspaceID, "delete"), api.WorkspaceWriteRequest{}, nil); err != nil {
		return err
	}
	return c.noContent()
}

// parseSnapshotRef reads a snapshot's ID or name as the SDKs give it:
// its ID, or its name, alone or after its namespace (NS/name) and with
// its tag (name:default); ok is false for another tag or a malformed
// reference.
func parseSnapshotRef(ref string) (name string, isID, ok bool) {
	if i := strings.LastIndex(ref, ":"); i >= 0 {
		if ref[i+1:] != defaultTag {
			return "", false, false
		}
		ref = ref[:i]
	}
	if i := strings.LastIndex(ref, "/"); i >= 0 {
		ref = ref[i+1:]
	}
	if strings.HasPrefix(ref, "ws-") {
		return ref, true, api.CheckText("snapshot id", ref) == nil && len(ref) <= 64
	}
	return ref, false, snapshotNamePattern.MatchString(ref)
}

// snapshotByRef is the snapshot a reference names in the caller's
// namespace, the newest of a name; nil when there is none.
func snapshotByRef(c *call, ref string) (*api.Workspace, error) {
	name, isID, ok := parseSnapshotRef(ref)
	if !ok {
		return nil, nil
	}
	if isID {
		var ws api.Workspace
		if _, err := c.cl.Do(c.r.Context(), http.MethodGet, workspacePath(name), nil, &ws); err != nil {
			if api.CodeOf(err) == api.CodeNotFound {
				return nil, nil
			}
			return nil, err
		}
		if !isSnapshot(&ws) || ws.State != api.WorkspacePaused {
			return nil, nil
		}
		return &ws, nil
	}
	found, err := listSnapshots(c, url.Values{"label": {SnapshotNameLabel + "=" + name}})
	if err != nil || len(found) == 0 {
		return nil, err
	}
	newest := slices.MaxFunc(found, func(a, b api.Workspace) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return &newest, nil
}

// listSnapshots is every snapshot of the caller's namespace the filter
// in matches: PAUSED, not being deleted.
func listSnapshots(c *call, in url.Values) ([]api.Workspace, error) {
	in.Add("label", SnapshotLabel+"=yes")
	in.Set("state", api.WorkspacePaused)
	var page api.WorkspaceList
	if _, err := c.cl.Do(c.r.Context(), http.MethodGet, "/v1/workspaces?"+in.Encode(), nil, &page); err != nil {
		return nil, err
	}
	return page.Workspaces, nil
}
