package guestproto

import "slices"

// WorkspaceRoot is where the node has the guest mount a Workspace's
// filesystem; execs into the Workspace are chrooted there
// (ExecRequest.Root).
const WorkspaceRoot = "/rootfs"

// WorkspaceEnv is the environment of a process in a Workspace whose
// template has no image config.
var WorkspaceEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}

// WithWorkspaceEnv gives req WorkspaceEnv for a guest with info: one
// that reads image configs takes it as the defaults a template's image
// config replaces, an older one gets it in Env before the caller's own.
func (req ExecRequest) WithWorkspaceEnv(info GuestInfo) ExecRequest {
	if info.Has(CapExecImageConfig) {
		req.DefaultEnv = WorkspaceEnv
	} else {
		req.Env = append(slices.Clone(WorkspaceEnv), req.Env...)
	}
	return req
}
