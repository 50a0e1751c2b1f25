package kibotos

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kibotos/kibotos/api"
)

// Workspace states.
const (
	StateCreating  = api.WorkspaceCreating
	StateStarting  = api.WorkspaceStarting
	StateAvailable = api.WorkspaceAvailable
	StatePausing   = api.WorkspacePausing
	StatePaused    = api.WorkspacePaused
	StateStopping  = api.WorkspaceStopping
	StateStopped   = api.WorkspaceStopped
	StateFailed    = api.WorkspaceFailed
	StateDeleting  = api.WorkspaceDeleting
)

// What a Workspace's timeout does (WorkspaceSpec.OnTimeout).
const (
	OnTimeoutDelete = api.TimeoutDelete // the default; its Volumes stay
	OnTimeoutStop   = api.TimeoutStop
	OnTimeoutPause  = api.TimeoutPause
)

// Sizes, for Memory and Volume sizes.
const (
	MiB uint64 = 1 << 20
	GiB uint64 = 1 << 30
)

// NetworkPolicy is what a Workspace's guest may reach: Egress "none"
// (the default), "public" (narrowed by Allow and Deny) or an Egress
// object of the namespace.
type NetworkPolicy = api.NetworkPolicy

// WorkspaceSpec is what a new Workspace is made of.
type WorkspaceSpec struct {
	// Template is the catalog Template it boots (kibo template list).
	Template string
	// CPU is in vCPUs (0.5, 2), to thousandths; Memory in bytes.
	CPU    float64
	Memory uint64
	Labels map[string]string
	// Network is the guest's network policy; nil: no egress.
	Network *NetworkPolicy
	// Volumes are existing Volumes (name or id) mounted at a path;
	// NewVolumes are made along with the Workspace.
	Volumes    []VolumeMount
	NewVolumes []NewVolume
	// Timeout ends each run (from every start and resume) with
	// OnTimeout (delete by default); 0: the namespace's default.
	Timeout   time.Duration
	OnTimeout string
	// AutoResume: Exec and Files resume the Workspace when it is PAUSED.
	AutoResume bool
	// IdleTimeout pauses it once it had no Exec or Files connection and
	// its guest used next to no CPU for that long (at least 30 s); with
	// AutoResume the next connection brings it back. 0: never.
	IdleTimeout time.Duration
	// From forks this PAUSED Workspace; Template, CPU and Memory are
	// then its own and may be left out.
	From string
	// Env is the environment of every process in the Workspace (Exec
	// and terminals; an Exec's own Env wins over it). Names are a
	// shell's (letters, digits, '_'); at most 128 variables, a value at
	// most 32 KiB, 64 KiB together. The values may be secrets: the
	// Workspace shows the names only (EnvNames). A fork has its source's.
	Env map[string]string
}

// VolumeMount mounts an existing Volume in a new Workspace.
type VolumeMount struct {
	Volume string // name or id
	Path   string
}

// NewVolume is a Volume made along with a Workspace.
type NewVolume struct {
	Size uint64
	Path string
}

// request is the spec as the API takes it.
func (s WorkspaceSpec) request() (api.WorkspaceCreateRequest, error) {
	req := api.WorkspaceCreateRequest{WriteMeta: writeMeta(), Template: s.Template, MemoryBytes: s.Memory, Labels: s.Labels,
		Network: s.Network, From: s.From, OnTimeout: s.OnTimeout, AutoResume: s.AutoResume, Env: api.EnvFromMap(s.Env)}
	if s.CPU != 0 {
		cpu, err := api.ParseMilli(strconv.FormatFloat(s.CPU, 'f', -1, 64))
		if err != nil || s.CPU < 0 {
			return req, errorf(CodeInvalidArgument, "kibotos: workspace CPU %g: give a positive number of vCPUs with at most three decimals, such as 0.5 or 2", s.CPU)
		}
		req.CPU = cpu
	}
	if s.Timeout != 0 {
		if err := api.CheckTimeout(s.Timeout); err != nil {
			return req, errorf(CodeInvalidArgument, "kibotos: workspace %v", err)
		}
		req.Timeout = s.Timeout.String()
	}
	if s.IdleTimeout != 0 {
		if err := api.CheckTimeout(s.IdleTimeout); err != nil {
			return req, errorf(CodeInvalidArgument, "kibotos: workspace idle %v", err)
		}
		req.IdleTimeout = s.IdleTimeout.String()
	}
	for _, v := range s.Volumes {
		req.Volumes = append(req.Volumes, api.VolumeAttach{Volume: v.Volume, Path: v.Path})
	}
	for _, v := range s.NewVolumes {
		req.NewVolumes = append(req.NewVolumes, api.NewVolume{SizeBytes: v.Size, Path: v.Path})
	}
	return req, nil
}

// Workspace is a Workspace as the server last described it, with what
// can be done to it. The methods that change it update the fields from
// the server's answer: use a *Workspace from one goroutine at a time
// (Exec and Files only read the id, and may run alongside each other).
type Workspace struct {
	ID        string
	Namespace string
	State     string
	Template  string
	CPU       float64
	Memory    uint64
	Labels    map[string]string
	// EnvNames are the names of its environment variables (WorkspaceSpec.Env),
	// sorted; their values are never shown.
	EnvNames   []string
	Version    uint64
	ForkedFrom string
	// Timeout is how long each run lasts (0: no end), OnTimeout what
	// then happens, EndsAt when this run ends (zero: no end).
	Timeout    time.Duration
	OnTimeout  string
	EndsAt     time.Time
	AutoResume bool
	CreatedAt  time.Time
	// Failure is why it is FAILED (or why its latest command left it as
	// it was); "" otherwise.
	Failure string

	// Files are the files of its guest.
	Files *Files

	c             *Client
	id            string // ID, read by Exec and Files while the fields may change
	failureReason string
}

func (c *Client) workspace(r *api.Workspace) *Workspace {
	w := &Workspace{c: c, id: r.WorkspaceID}
	w.Files = &Files{w: w}
	w.set(r)
	return w
}

// set copies r into w's fields.
func (w *Workspace) set(r *api.Workspace) {
	w.ID, w.Namespace, w.State, w.Template = r.WorkspaceID, api.ShownNamespace(r.Namespace), r.State, r.Template
	w.CPU, _ = strconv.ParseFloat(r.CPU.String(), 64)
	w.Memory, w.Labels, w.Version, w.ForkedFrom, w.EnvNames = r.MemoryBytes, r.Labels, r.Version, r.ForkedFrom, r.EnvNames
	w.Timeout, w.OnTimeout, w.AutoResume, w.CreatedAt = r.TimeoutDuration(), r.OnTimeout, r.AutoResume, r.CreatedAt
	w.EndsAt = time.Time{}
	if r.EndsAt != nil {
		w.EndsAt = *r.EndsAt
	}
	w.Failure, w.failureReason = "", ""
	if f := r.Failure; f != nil && r.State == api.WorkspaceFailed {
		w.Failure, w.failureReason = f.Reason+": "+f.Message, f.Reason
	} else if r.LastError != nil {
		w.Failure = r.LastError.Message
	}
}

// WorkspaceService is the namespace's Workspaces (Client.Workspaces).
type WorkspaceService struct{ c *Client }

// CallOption changes how a lifecycle call behaves.
type CallOption func(*callOptions)

type callOptions struct{ noWait bool }

// NoWait returns once the server accepted the change, instead of when
// the Workspace (or Volume) reached its state; Wait waits later.
func NoWait() CallOption { return func(o *callOptions) { o.noWait = true } }

func options(opts []CallOption) callOptions {
	var o callOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Create makes a Workspace and waits until it is AVAILABLE (or FAILED:
// an error saying why), unless NoWait.
func (s *WorkspaceService) Create(ctx context.Context, spec WorkspaceSpec, opts ...CallOption) (*Workspace, error) {
	req, err := spec.request()
	if err != nil {
		return nil, err
	}
	var r api.Workspace
	if err := s.c.do(ctx, http.MethodPost, "/v1/workspaces", nil, req, &r); err != nil {
		return nil, err
	}
	w := s.c.workspace(&r)
	if options(opts).noWait {
		return w, nil
	}
	return w, w.Wait(ctx, StateAvailable)
}

// Get reads a Workspace by id.
func (s *WorkspaceService) Get(ctx context.Context, id string) (*Workspace, error) {
	var r api.Workspace
	if err := s.c.do(ctx, http.MethodGet, workspacePath(id, ""), nil, nil, &r); err != nil {
		return nil, err
	}
	return s.c.workspace(&r), nil
}

// ListOptions narrow a list; nil lists all.
type ListOptions struct {
	// States keeps Workspaces in one of these states.
	States []string
	// Labels keeps Workspaces with all of these labels.
	Labels map[string]string
}

// List reads the namespace's Workspaces, all pages of them.
func (s *WorkspaceService) List(ctx context.Context, opts *ListOptions) ([]*Workspace, error) {
	q := url.Values{"page_size": {"500"}}
	if opts != nil {
		q["state"] = opts.States
		for k, v := range opts.Labels {
			q.Add("label", k+"="+v)
		}
	}
	var out []*Workspace
	for {
		var page api.WorkspaceList
		if err := s.c.do(ctx, http.MethodGet, "/v1/workspaces", q, nil, &page); err != nil {
			return nil, err
		}
		for i := range page.Workspaces {
			out = append(out, s.c.workspace(&page.Workspaces[i]))
		}
		if page.NextPageToken == "" {
			return out, nil
		}
		q.Set("page_token", page.NextPageToken)
	}
}

func workspacePath(id, verb string) string {
	p := "/v1/workspaces/" + url.PathEscape(id)
	if verb != "" {
		p += "/" + verb
	}
	return p
}
