package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// WorkspaceExecCmd is `workspace exec WS -- CMD...`.
type WorkspaceExecCmd struct {
	ID      string   `arg:"" name:"workspace"`
	Command []string `arg:"" name:"command" passthrough:"" help:"The command and its arguments (after --)."`
	TTY     bool     `short:"t" name:"tty" help:"Run in a pseudo-terminal (resized with this terminal)."`
	Dir     string   `name:"workdir" short:"w" help:"Working directory in the Workspace."`
	Env     []string `name:"env" short:"e" help:"Environment KEY=VALUE (KEY alone: its value here); repeat for more."`
}

// execEnv is -e (or create's --env, flag) as the guest takes it:
// KEY=VALUE, or KEY alone for the value it has in kibo's environment (as
// docker exec -e does), which must then be set.
func execEnv(flag string, env []string) ([]string, error) {
	out := make([]string, 0, len(env))
	for _, e := range env {
		k, _, hasValue := strings.Cut(e, "=")
		switch {
		case k == "" || strings.ContainsRune(e, 0):
			return nil, usagef("%s %q: want KEY=VALUE with a KEY", flag, e)
		case hasValue:
			out = append(out, e)
		default:
			v, ok := os.LookupEnv(k)
			if !ok {
				return nil, usagef("%s %s: %s is not set here; give its value: %s %s=VALUE", flag, k, k, flag, k)
			}
			out = append(out, k+"="+v)
		}
	}
	return out, nil
}

func (c *WorkspaceExecCmd) Run(g *Globals) error {
	argv := c.Command
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return usagef("workspace exec %s: give the command after --, e.g. kibo workspace exec %s -- uname -a", c.ID, c.ID)
	}
	env, err := execEnv("-e", c.Env)
	if err != nil {
		return err
	}
	code, err := runInWorkspace(g, c.ID, argv, c.TTY, c.Dir, env)
	if err != nil {
		return err
	}
	if code != 0 {
		return exitError{code, ""}
	}
	return nil
}

// WorkspaceTerminalCmd is `workspace terminal WS`.
type WorkspaceTerminalCmd struct {
	ID    string `arg:"" name:"workspace"`
	Shell string `name:"shell" default:"/bin/sh" help:"Shell to run."`
}

func (c *WorkspaceTerminalCmd) Run(g *Globals) error {
	code, err := runInWorkspace(g, c.ID, []string{c.Shell, "-l"}, true, "", nil)
	if err != nil {
		return err
	}
	if code != 0 {
		return exitError{code, ""}
	}
	return nil
}

// runInWorkspace runs argv in the Workspace's root with this process's
// stdio and returns its exit code (128+signal when a signal ended it).
func runInWorkspace(g *Globals, id string, argv []string, tty bool, dir string, env []string) (int, error) {
	c, err := g.dataPlane(id)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	in := g.stdin
	inIsTerm := in != nil && isTerminal(in.Fd())
	// Only the user's -e are explicit: a template built from an OCI
	// image replaces the defaults with the image's Env.
	req := guestproto.ExecRequest{Argv: argv, Root: guestproto.WorkspaceRoot, Dir: dir, Env: append([]string(nil), env...)}.WithWorkspaceEnv(c.Info())
	// A terminal's stdin is forwarded only with -t (it would never end);
	// a pipe or file is always forwarded.
	req.Stdin = in != nil && (tty || !inIsTerm)
	var restore func()
	if tty {
		ws := guestproto.WinSize{Rows: 24, Cols: 80}
		if inIsTerm {
			if r, cl, err := termSize(in); err == nil {
				ws = guestproto.WinSize{Rows: r, Cols: cl}
			}
		}
		req.PTY = &ws
		t := os.Getenv("TERM")
		if t == "" {
			t = "xterm"
		}
		req.Env = append(req.Env, "TERM="+t)
	}
	ctx, cancel := context.WithTimeout(g.ctx, 30*time.Second)
	p, err := c.Exec(ctx, req)
	cancel()
	if err != nil {
		return 0, execStartError(id, argv[0], err)
	}
	if tty && inIsTerm {
		if restore, err = makeRaw(in); err != nil {
			return 0, err
		}
		defer restore()
		stopResize := forwardResize(in, p)
		defer stopResize()
	}
	stopSignals := forwardSignals(p, tty)
	defer stopSignals()
	var wg sync.WaitGroup
	if p.Stdin != nil {
		// Ends with the input, or when this returns (the process exited
		// and its output was copied).
		stopInput, err := copyInput(p.Stdin, in)
		if err != nil {
			p.Close()
			return 0, fmt.Errorf("workspace %s: exec %s: forward stdin: %w", id, argv[0], err)
		}
		defer stopInput()
	}
	wg.Add(1)
	go func() { defer wg.Done(); io.Copy(g.stdout, p.Stdout) }()
	if p.Stderr != nil {
		wg.Add(1)
		go func() { defer wg.Done(); io.Copy(g.stderr, p.Stderr) }()
	}
	exit, err := p.Wait()
	wg.Wait()
	if err != nil {
		return 0, lostExec(g, id, err)
	}
	if exit.Signal != 0 {
		return 128 + exit.Signal, nil
	}
	return exit.ExitCode, nil
}

// execStartError is the error of a command the guest did not start, with
// the exit code a shell gives it: 127 when the command is not found, 126
// when it cannot run (not executable, its working directory missing).
func execStartError(id, name string, err error) error {
	var ge *guestproto.Error
	if !errors.As(err, &ge) {
		return fmt.Errorf("workspace %s: exec %s: %w", id, name, err)
	}
	code := 126
	if ge.Code == guestproto.CodeNotFound {
		code = 127
	}
	return exitError{code, fmt.Sprintf("workspace %s: %s", id, ge.Message)}
}

// lostExec is the error of an exec whose stream broke: when the
// Workspace was paused or stopped meanwhile, that is what the user needs
// to hear.
func lostExec(g *Globals, id string, err error) error {
	var ws api.Workspace
	if _, gerr := g.call("GET", workspacePath(id), nil, &ws); gerr == nil {
		switch ws.State {
		case api.WorkspacePausing, api.WorkspacePaused:
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s was paused while the command ran: its process is paused with the guest and goes on, without this stream, after kibo workspace resume %s", id, id)}
		case api.WorkspaceStopping, api.WorkspaceStopped, api.WorkspaceDeleting, api.WorkspaceFailed:
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s is %s: the command ended with its guest (%v)", id, ws.State, err)}
		}
	}
	return fmt.Errorf("workspace %s: %w", id, err)
}
