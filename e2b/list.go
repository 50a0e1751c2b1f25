package e2b

import (
	"cmp"
	"encoding/base64"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
)

// Lists of sandboxes, E2B's way: sorted by start time across the whole
// result (newest first unless order=asc), then cut into pages. The
// Kibotos list pages by Workspace ID, so a list reads all of the
// namespace's sandboxes that match and sorts them here; a page token is
// the start time and ID of the page's last sandbox.

// readPage is how many Workspaces one read of the Kibotos list takes.
const readPage = 1000

// list is GET /v2/sandboxes: running and paused ones (or the states
// asked), filtered by metadata, template and start, a page of limit with
// X-Next-Token.
func (h *handler) list(c *call) error {
	// The SDKs send a list of states as state=running&state=paused;
	// state=running,paused is taken too.
	var states []string
	for _, v := range c.r.URL.Query()["state"] {
		states = append(states, strings.Split(v, ",")...)
	}
	if len(states) == 0 {
		states = []string{stateRunning, statePaused}
	}
	return h.listStates(c, states)
}

// listRunning is the v1 GET /sandboxes: the running ones.
func (h *handler) listRunning(c *call) error {
	return h.listStates(c, []string{stateRunning})
}

// listQuery is a list's filters and page, read from its query.
type listQuery struct {
	in           url.Values // the Kibotos list's filters
	template     string
	startedAfter time.Time
	desc         bool
	limit        int
	after        *cursor
}

func (h *handler) listStates(c *call, states []string) error {
	lq, err := h.readListQuery(c.r.URL.Query(), states)
	if err != nil {
		return err
	}
	var all []api.Workspace
	for token := ""; ; {
		in := lq.in
		in.Set("page_size", strconv.Itoa(readPage))
		in.Set("page_token", token)
		var page api.WorkspaceList
		if _, err := c.cl.Do(c.r.Context(), http.MethodGet, "/v1/workspaces?"+in.Encode(), nil, &page); err != nil {
			return err
		}
		for _, ws := range page.Workspaces {
			if lq.keeps(&ws) {
				all = append(all, ws)
			}
		}
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	slices.SortFunc(all, func(a, b api.Workspace) int { return lq.compare(&a, cursorOf(&b)) })
	if lq.after != nil {
		i, _ := slices.BinarySearchFunc(all, *lq.after, func(ws api.Workspace, cur cursor) int {
			if x := lq.compare(&ws, cur); x != 0 {
				return x
			}
			return -1 // the cursor's own sandbox is on the page before
		})
		all = all[i:]
	}
	if len(all) > lq.limit {
		last := all[lq.limit-1]
		c.w.Header().Set("X-Next-Token", cursorOf(&last).String())
		all = all[:lq.limit]
	}
	out := make([]listedSandbox, 0, len(all))
	for i := range all {
		state, _ := e2bState(all[i].State)
		out = append(out, listedOf(&all[i], state))
	}
	return c.reply(http.StatusOK, out)
}

// readListQuery reads a list's query: the states asked, metadata,
// template, startedAfter, order, limit and nextToken.
func (h *handler) readListQuery(q url.Values, states []string) (*listQuery, error) {
	lq := &listQuery{in: url.Values{}, desc: true, limit: listLimit}
	for _, s := range states {
		switch strings.TrimSpace(s) {
		case stateRunning:
			lq.in.Add("state", strings.Join([]string{api.WorkspaceCreating, api.WorkspaceStarting, api.WorkspaceAvailable, api.WorkspacePausing, api.WorkspaceStopping}, ","))
		case statePaused:
			lq.in.Add("state", api.WorkspacePaused+","+api.WorkspaceStopped)
		default:
			return nil, api.Errorf(api.CodeInvalidArgument, "state %q: give running or paused", api.EscapeText(s))
		}
	}
	if m := q.Get("metadata"); m != "" {
		pairs, err := url.ParseQuery(m)
		if err != nil {
			return nil, api.Errorf(api.CodeInvalidArgument, "metadata filter %q: want key=value pairs joined by &", api.EscapeText(m))
		}
		for k, vs := range pairs {
			for _, v := range vs {
				lq.in.Add("label", k+"="+v)
			}
		}
	}
	if t := q.Get("template"); t != "" {
		lq.template = h.templateName(t)
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return nil, api.Errorf(api.CodeInvalidArgument, "startedAfter %q: give a time as RFC 3339 (2026-12-01T10:00:00Z)", api.EscapeText(v))
		}
		lq.startedAfter = t
	}
	switch v := q.Get("order"); v {
	case "", "desc":
	case "asc":
		lq.desc = false
	default:
		return nil, api.Errorf(api.CodeInvalidArgument, "order %q: give asc or desc", api.EscapeText(v))
	}
	var err error
	if lq.limit, err = pageLimit(q); err != nil {
		return nil, err
	}
	if v := q.Get("nextToken"); v != "" {
		cur, err := parseCursor(v)
		if err != nil {
			return nil, err
		}
		lq.after = &cur
	}
	return lq, nil
}

// keeps says whether a Workspace the Kibotos list gave is in the list:
// a sandbox, of the template and started when asked.
func (lq *listQuery) keeps(ws *api.Workspace) bool {
	if _, ok := e2bState(ws.State); !ok || isSnapshot(ws) {
		return false
	}
	if lq.template != "" && ws.Template != lq.template {
		return false
	}
	return !ws.CreatedAt.Before(lq.startedAfter)
}

// pageLimit is a list's limit: E2B's default and largest page unless
// asked for fewer.
func pageLimit(q url.Values) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return listLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > listLimit {
		return 0, api.Errorf(api.CodeInvalidArgument, "limit %q: give a number from 1 to %d", api.EscapeText(v), listLimit)
	}
	return n, nil
}

// cursor is a list's position: the start time and ID of the last sandbox
// of the page before.
type cursor struct {
	at time.Time
	id string
}

func cursorOf(ws *api.Workspace) cursor { return cursor{at: ws.CreatedAt, id: ws.WorkspaceID} }

// compare orders ws against the position cur in the list's order: by
// start, then ID, newest first when desc.
func (lq *listQuery) compare(ws *api.Workspace, cur cursor) int {
	x := cmp.Or(ws.CreatedAt.Compare(cur.at), strings.Compare(ws.WorkspaceID, cur.id))
	if lq.desc {
		return -x
	}
	return x
}

func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.at.UnixNano(), 10) + "." + c.id))
}

func parseCursor(s string) (cursor, error) {
	bad := api.Errorf(api.CodeInvalidArgument, "nextToken %q is not one this list handed out: pass the X-Next-Token of the page before", api.EscapeText(s))
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(raw) > 256 {
		return cursor{}, bad
	}
	ns, id, ok := strings.Cut(string(raw), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || !strings.HasPrefix(id, "ws-") || api.CheckText("sandbox id", id) != nil {
		return cursor{}, bad
	}
	return cursor{at: time.Unix(0, n), id: id}, nil
}
