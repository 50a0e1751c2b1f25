package cli

import (
	"net/url"
)

// WorkspaceCmd groups the Workspace commands.
type WorkspaceCmd struct {
	Create        WorkspaceCreateCmd        `cmd:"" help:"Create a Workspace from a template and start it on a node the scheduler picks (or --node)."`
	Start         WorkspaceStartCmd         `cmd:"" help:"Start a STOPPED or FAILED Workspace (a PAUSED one is resumed); each start gets a new Instance."`
	Stop          WorkspaceStopCmd          `cmd:"" help:"Stop a Workspace; its writable layer is kept. --force ends its Instance without a clean guest stop."`
	Pause         WorkspacePauseCmd         `cmd:"" help:"Save a running Workspace's memory and devices beside its writable layer and end its VM; resume brings it back as it was."`
	Resume        WorkspaceResumeCmd        `cmd:"" help:"Resume a PAUSED Workspace on its node or any node that reaches its pool and can restore it."`
	Delete        WorkspaceDeleteCmd        `cmd:"" help:"Delete a Workspace with its writable layer."`
	Get           WorkspaceGetCmd           `cmd:"" help:"Show one Workspace; the Node line is where it runs."`
	List          WorkspaceListCmd          `cmd:"" help:"List Workspaces (without --all: not the STOPPED ones)."`
	Move          WorkspaceMoveCmd          `cmd:"" help:"Stop a Workspace and start it on another node (no live migration)."`
	SetNetwork    WorkspaceSetNetworkCmd    `cmd:"" name:"set-network" help:"Change a Workspace's network policy (only the items given): stored at once when STOPPED, applied by its node when AVAILABLE."`
	SetTimeout    WorkspaceSetTimeoutCmd    `cmd:"" name:"set-timeout" help:"End a Workspace a given time from now (shorter or longer than before) with its timeout action; 0 removes the end."`
	CleanupStatus WorkspaceCleanupStatusCmd `cmd:"" name:"cleanup-status" help:"Show what the latest execution of a Workspace still holds."`
	Logs          WorkspaceLogsCmd          `cmd:"" help:"Show the machine log (guest console, or --vmm the VMM's log) of a Workspace's current or an ended Instance, from the node that keeps it."`
	Exec          WorkspaceExecCmd          `cmd:"" help:"Run a command in a Workspace through the data plane; its exit code becomes kibo's."`
	Terminal      WorkspaceTerminalCmd      `cmd:"" help:"Open an interactive shell in a Workspace."`
	Cp            WorkspaceCpCmd            `cmd:"" help:"Copy a file into or out of a Workspace (WS:PATH names the Workspace side)."`
	PortForward   WorkspacePortForwardCmd   `cmd:"" name:"port-forward" help:"Forward a local TCP port to a port inside a Workspace."`
}

func workspacePath(id string, verb ...string) string {
	p := "/v1/workspaces/" + url.PathEscape(id)
	if len(verb) > 0 {
		p += "/" + verb[0]
	}
	return p
}
