// Package kibotos is the Go SDK of Kibotos for applications: it creates
// micro-VM Workspaces in one namespace of a Kibotos cluster, runs
// commands in them, moves files in and out, and ends them, holding only
// the URL of the cluster's API listener, an API key and (for a listener
// with a certificate of the cluster CA) the CA file. An operator makes
// the key: kibo api-key create NAME --namespace NS --role sandbox.
//
// A short tour:
//
//	c, err := kibotos.Connect(ctx, "https://kibotos.example:7443", os.Getenv("KIBOTOS_TOKEN"),
//		&kibotos.Options{CAFile: "ca.crt"})
//	if err != nil { ... }
//	ws, err := c.Workspaces.Create(ctx, kibotos.WorkspaceSpec{
//		Template: "debian-12", CPU: 1, Memory: 512 * kibotos.MiB,
//		Timeout: 30 * time.Minute, // then deleted, unless SetTimeout moves the end
//	})
//	if err != nil { ... }
//	defer ws.Delete(context.WithoutCancel(ctx))
//	res, err := ws.Exec(ctx, []string{"sh", "-c", "echo hello"}, &kibotos.ExecOptions{Stdout: os.Stdout})
//	// res.ExitCode is the command's exit status
//	err = ws.Files.WriteFile(ctx, "/tmp/in.txt", []byte("data"), 0o644)
//	data, err := ws.Files.Read(ctx, "/tmp/in.txt")
//	err = ws.Pause(ctx)  // memory and all; Resume goes on from there
//	fork, err := ws.Fork(ctx)
//
// Calls that change a Workspace wait until it reached its new state
// (AVAILABLE, PAUSED, STOPPED, gone), blocking on the server rather than
// polling; NoWait returns at once, and ctx bounds every wait.
//
// Errors are *Error values with the API's code and a one-line message
// that names the object and the fix. Test them with errors.Is against
// the sentinels, one per class (and exit code of the kibo CLI):
// ErrNotFound, ErrPermissionDenied, ErrUnauthenticated,
// ErrResourceExhausted (a quota or no room), ErrFailedPrecondition,
// ErrUnavailable, ErrTimedOut and the others, and ErrRateLimited for
// the API listener's per-key rate. Calls refused for the rate (429 with
// Retry-After) or while the cluster has no leader are sent again after a
// backoff, within Options.MaxRetries and the call's context: every call
// of this package may be repeated, writes carrying a command id so that
// a repeat returns the first result.
//
// Exec and Files reach the guest through the data plane of the
// Workspace's node, with a short-lived credential the API hands out for
// the Workspace; the node's certificate is checked against the cluster
// CA of Options, never the system roots.
//
// The package speaks only to the API listener and the data planes; it
// never needs a member's certificate or data directory, and it keeps no
// state beyond its connection settings.
package kibotos
