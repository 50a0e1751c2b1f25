package cli

import (
	"context"
	"errors"
	"time"

	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// dataPlane opens a session to the Workspace's guest through the data
// plane of its node, with a fresh credential from ctrl.
func (g *Globals) dataPlane(id string) (*guestproto.Client, error) {
	// Before the credential is asked for: without the CA to check the
	// node with, it would be spent for nothing.
	roots, err := g.dataPlaneRoots()
	if err != nil {
		return nil, err
	}
	var cred api.DataPlaneCredential
	if _, err := g.call("POST", workspacePath(id, "credentials"), struct{}{}, &cred); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(g.ctx, 30*time.Second)
	defer cancel()
	c, err := dataplane.Connect(ctx, cred, roots)
	if err != nil {
		var re *dataplane.RefusedError
		if errors.As(err, &re) {
			return nil, api.Errorf(api.CodeUnavailable, "%v", err)
		}
		return nil, api.Errorf(api.CodeUnavailable, "workspace %s: %v", id, err)
	}
	return c, nil
}
