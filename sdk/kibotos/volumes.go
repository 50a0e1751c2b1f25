package kibotos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/kibotos/kibotos/api"
)

// Volume states.
const (
	VolumeCreating  = api.VolumeCreating
	VolumeAvailable = api.VolumeAvailable
	VolumeFailed    = api.VolumeFailed
	VolumeDeleting  = api.VolumeDeleting
	VolumeLost      = api.VolumeLost
)

// Volume is a disk that outlives Workspaces: mounted in at most one at a
// time (WorkspaceSpec.Volumes), kept when that one is deleted.
type Volume struct {
	ID        string
	Name      string
	Namespace string
	State     string
	Size      uint64
	Version   uint64
	// WorkspaceID and MountPath: where it is attached; empty when not.
	WorkspaceID string
	MountPath   string
	// Error is why its latest change failed; "" otherwise.
	Error     string
	CreatedAt time.Time
}

func volume(r *api.Volume) *Volume {
	return &Volume{ID: r.VolumeID, Name: r.Name, Namespace: api.ShownNamespace(r.Namespace), State: r.State, Size: r.SizeBytes,
		Version: r.Version, WorkspaceID: r.WorkspaceID, MountPath: r.MountPath, Error: r.Error, CreatedAt: r.CreatedAt}
}

// VolumeSpec is a new Volume: its name (unique in the namespace) and size
// in bytes (whole MiB, 16 MiB at least).
type VolumeSpec struct {
	Name string
	Size uint64
}

// VolumeService is the namespace's Volumes (Client.Volumes).
type VolumeService struct{ c *Client }

// Create makes a Volume and waits until it is AVAILABLE (FAILED: an
// error saying why) unless NoWait.
func (s *VolumeService) Create(ctx context.Context, spec VolumeSpec, opts ...CallOption) (*Volume, error) {
	var r api.Volume
	req := api.VolumeCreateRequest{WriteMeta: writeMeta(), Name: spec.Name, SizeBytes: spec.Size}
	if err := s.c.do(ctx, http.MethodPost, "/v1/volumes", nil, req, &r); err != nil {
		return nil, err
	}
	if options(opts).noWait {
		return volume(&r), nil
	}
	for {
		switch r.State {
		case VolumeAvailable:
			return volume(&r), nil
		case VolumeFailed, VolumeLost:
			return volume(&r), errorf(CodeFailedPrecondition, "volume %s is %s: %s; delete it", r.Name, r.State, r.Error)
		}
		if err := s.c.do(ctx, http.MethodGet, volumePath(r.VolumeID, ""), blockingQuery(r.Version), nil, &r); err != nil {
			return nil, err
		}
	}
}

// Get reads a Volume by name or id.
func (s *VolumeService) Get(ctx context.Context, ref string) (*Volume, error) {
	var r api.Volume
	if err := s.c.do(ctx, http.MethodGet, volumePath(ref, ""), nil, nil, &r); err != nil {
		return nil, err
	}
	return volume(&r), nil
}

// List reads the namespace's Volumes, all pages of them.
func (s *VolumeService) List(ctx context.Context) ([]*Volume, error) {
	q := url.Values{"page_size": {"500"}}
	var out []*Volume
	for {
		var page api.VolumeList
		if err := s.c.do(ctx, http.MethodGet, "/v1/volumes", q, nil, &page); err != nil {
			return nil, err
		}
		for i := range page.Volumes {
			out = append(out, volume(&page.Volumes[i]))
		}
		if page.NextPageToken == "" {
			return out, nil
		}
		q.Set("page_token", page.NextPageToken)
	}
}

// Delete deletes a detached Volume (name or id) and its data, and waits
// until it is gone unless NoWait.
func (s *VolumeService) Delete(ctx context.Context, ref string, opts ...CallOption) error {
	var r api.Volume
	if err := s.c.do(ctx, http.MethodPost, volumePath(ref, "delete"), nil, writeMeta(), &r); err != nil {
		return err
	}
	if options(opts).noWait || r.DeletedAt != nil {
		return nil
	}
	for {
		err := s.c.do(ctx, http.MethodGet, volumePath(r.VolumeID, ""), blockingQuery(r.Version), nil, &r)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func volumePath(ref, verb string) string {
	p := "/v1/volumes/" + url.PathEscape(ref)
	if verb != "" {
		p += "/" + verb
	}
	return p
}

// blockingQuery makes a get answer when the object's version passes
// version (or it is gone), at the latest after 30 s.
func blockingQuery(version uint64) url.Values {
	return url.Values{"wait_version": {fmt.Sprint(version)}, "wait": {"30s"}}
}
