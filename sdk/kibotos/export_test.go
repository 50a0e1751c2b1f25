package kibotos

// SetWorkspaceRoot makes the client look for Workspaces' files and run
// their commands under dir, the root a test's in-process guest agent
// serves, until the returned func puts /rootfs back.
func SetWorkspaceRoot(dir string) (restore func()) {
	old := workspaceRoot
	workspaceRoot = dir
	return func() { workspaceRoot = old }
}
