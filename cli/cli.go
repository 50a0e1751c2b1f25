// Package cli is the kibotos command tree (kong): one struct per verb with
// its help, flags and Run; rendering of tables and --json; exit codes.
// It talks to members only through the API (package api), except for the
// host-local commands (init, join, serve, dev) that run a member.
package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
)

// Globals are the flags every command takes.
type Globals struct {
	Address string `name:"address" env:"KIBOTOS_ADDR" help:"API address (HOST:PORT) of the member to talk to; default: the member of --data-dir."`
	DataDir string `name:"data-dir" env:"KIBOTOS_DATA_DIR" help:"Member data directory (credentials and state); default: /var/lib/kibotos, else the kibotos dev directory."`
	// Credentials: the flag, else KIBOTOS_CREDENTIALS (kong reads it),
	// else the per-user directory, else the member's (findCredentials).
	Credentials string `name:"credentials" env:"KIBOTOS_CREDENTIALS" help:"Operator credentials directory (ca.crt, operator.crt, operator.key from kibo operator issue); default: ~/.config/kibotos/credentials if it exists, else the operator certificate of --data-dir (ctrl and operator members)."`
	// Namespace and AllNamespaces go with every call (api.Client); an
	// API key works in its own namespace whatever is given.
	Namespace     string `name:"namespace" short:"n" env:"KIBOTOS_NAMESPACE" help:"Namespace of the Workspaces, Volumes, API keys and Transfers the command works on (Transfers: also their archives' place in the store, kibotos-transfer/v1/<namespace>/); default: default (an API key: its own)."`
	AllNamespaces bool   `name:"all-namespaces" short:"A" help:"List the objects of every namespace, with a NAMESPACE column (operators)."`
	// APIURL, Token and CAFile: remote use through a ctrl member's API
	// listener with an API key (remote.go).
	APIURL     string `name:"api-url" env:"KIBOTOS_API_URL" help:"URL of a ctrl member's API listener (https://HOST:PORT, its [api] listen); every call goes there with --token instead of a certificate, and no data directory is read."`
	Token      string `name:"token" env:"KIBOTOS_TOKEN" help:"API key to call --api-url with (prefer KIBOTOS_TOKEN: a flag shows in the process list)."`
	CAFile     string `name:"ca-file" env:"KIBOTOS_CA_FILE" type:"path" help:"PEM file of the cluster CA (tls/ca.crt of a ctrl member) with --api-url: the nodes' data planes (exec, terminal, cp, port-forward) are checked against it, the API listener against it and the system's CAs; without it, the API listener against the system's CAs only."`
	JSON       bool   `name:"json" help:"Print the API result as JSON ({\"result\": ...})."`
	Consistent bool   `name:"consistent" help:"Read from the ctrl leader instead of this member's replica."`
	// Timeout is how long a command waits for its result: the --timeout
	// of the commands that wait (WaitFlags), --wait-timeout of workspace
	// create, whose --timeout is the Workspace's lifetime.
	Timeout time.Duration `kong:"-"`

	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
	stdin  *os.File
}

// CLI is the whole command tree.
type CLI struct {
	Globals

	Version          VersionCmd          `cmd:"" help:"Print the release, source revision and whether this is a released build."`
	Init             InitCmd             `cmd:"" help:"Create a new cluster with this host as its first ctrl voter."`
	Join             JoinCmd             `cmd:"" help:"Enroll this host into a cluster with an enrollment grant."`
	Serve            ServeCmd            `cmd:"" help:"Run this member until SIGTERM."`
	Dev              DevCmd              `cmd:"" help:"Run a one-voter development cluster with a node on this host, in the foreground."`
	Status           StatusCmd           `cmd:"" help:"Show the member the CLI talks to and the ctrl leader."`
	Enrollment       EnrollmentCmd       `cmd:"" help:"Grant, list and revoke enrollment grants."`
	Operator         OperatorCmd         `cmd:"" help:"Issue, list and revoke operator credentials of people (the CLI's --credentials)."`
	Node             NodeCmd             `cmd:"" help:"View nodes, drain, isolate, retire them and set overcommit."`
	CA               CACmd               `cmd:"" name:"ca" help:"Rotate the cluster CA: begin, follow and finish a rotation."`
	GuestAgent       GuestAgentCmd       `cmd:"" name:"guest-agent" hidden:"" help:"Run the guest agent (PID 1 inside a VM)."`
	Dataplane        DataplaneCmd        `cmd:"" hidden:"" help:"Run the node's data-plane process (started by the node as its own unit)."`
	Transfer         TransferCmd         `cmd:"" help:"Export a stopped Workspace into the artifact store, and import it as a new Workspace here or in another cluster."`
	Platform         PlatformCmd         `cmd:"" help:"Build and list Platforms (kernel + initramfs with the guest agent)."`
	Artifacts        ArtifactsCmd        `cmd:"" help:"Collect the artifact store's objects the catalog no longer references."`
	Template         TemplateCmd         `cmd:"" help:"Build, list, show and delete templates (Workspace root filesystems) on this node."`
	Namespace        NamespaceCmd        `cmd:"" help:"Create, list, show and delete namespaces (tenants: their own Workspaces, Volumes and API keys)."`
	APIKey           APIKeyCmd           `cmd:"" name:"api-key" help:"Create, list and revoke API keys (an application's credential, limited to a namespace and a role)."`
	Workspace        WorkspaceCmd        `cmd:"" help:"Create, start, stop, move and delete Workspaces; exec, terminal, cp and port-forward through the data plane."`
	Egress           EgressCmd           `cmd:"" help:"Create, update, list, show and delete Egress objects (SOCKS5 exits a Workspace's policy names)."`
	Resolver         ResolverCmd         `cmd:"" help:"Create, list, show and delete Resolver objects (DNS upstreams a Workspace's policy names)."`
	StoragePool      StoragePoolCmd      `cmd:"" name:"storage-pool" help:"List and show storage pools, set their capacity, declare a pool whose disk is gone lost."`
	Volume           VolumeCmd           `cmd:"" help:"Create, list, show, grow and delete Volumes (block files in a storage pool that Workspaces mount)."`
	Completion       CompletionCmd       `cmd:"" help:"Print the shell completion script for bash, zsh or fish."`
	CheckMaintenance CheckMaintenanceCmd `cmd:"" name:"check-maintenance" help:"With the node service stopped: may the program be replaced (--operation upgrade) or removed (--operation remove)? Only reads."`
	CheckUpgrade     CheckUpgradeCmd     `cmd:"" name:"check-upgrade" help:"Run with the target build before it replaces the node's program: can it take this node over? Only reads; --preview beside a live node."`
}

type exitPanic struct{ code int }

// Main runs the CLI and returns the process exit code.
func Main(ctx context.Context, name string, args []string, stdin *os.File, stdout, stderr io.Writer) (code int) {
	var root CLI
	root.ctx, root.stdout, root.stderr, root.stdin = ctx, stdout, stderr, stdin
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(exitPanic); ok {
				code = e.code
				return
			}
			panic(r)
		}
	}()
	parser, err := newKong(&root,
		kong.Name(name),
		kong.Description("Kibotos runs isolated micro-VM Workspaces on a fleet of Linux hosts."),
		kong.Writers(stdout, stderr),
		kong.Exit(func(c int) { panic(exitPanic{c}) }),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Help(helpWithExamples),
	)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return api.ExitInternal
	}
	if len(args) > 0 && args[0] == completeCommand {
		words := args[1:]
		if len(words) > 0 && words[0] == "--" {
			words = words[1:]
		}
		complete(parser.Model, words, stdout)
		return api.ExitOK
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "%s: error: %v\n", name, err)
		return api.ExitUsage
	}
	if err := kctx.Run(&root.Globals); err != nil {
		return reportError(stderr, name, err)
	}
	return api.ExitOK
}

// newKong is the parser of the command tree into root: the hooks of the
// flags that set Globals (WaitFlags) get root's.
func newKong(root *CLI, options ...kong.Option) (*kong.Kong, error) {
	root.Timeout = defaultWait
	return kong.New(root, append([]kong.Option{kong.Bind(&root.Globals)}, options...)...)
}

// namespaceFirst puts first, when -A lists every namespace, the NAMESPACE
// column: its title in a header, the object's namespace in a row.
func (g *Globals) namespaceFirst(first string, cols []string) []string {
	if !g.AllNamespaces {
		return cols
	}
	return append([]string{first}, cols...)
}

// usageError is a mistake in the command line found after parsing.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// exitError carries a specific exit code with its message.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

func reportError(w io.Writer, name string, err error) int {
	// An exit code passed through (workspace exec) has no message.
	if msg := strings.TrimSpace(err.Error()); msg != "" {
		fmt.Fprintf(w, "%s: error: %s\n", name, shownLines(msg))
	}
	var ue usageError
	var ee exitError
	var ae *api.Error
	switch {
	case errors.As(err, &ue):
		return api.ExitUsage
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ae):
		return ae.Code.ExitCode()
	default:
		return api.ExitInternal
	}
}

// devDataDir is where `kibotos dev` keeps its member by default.
func devDataDir() string {
	if s := os.Getenv("XDG_STATE_HOME"); s != "" {
		return filepath.Join(s, "kibotos", "dev")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "kibotos-dev")
	}
	return filepath.Join(home, ".local", "state", "kibotos", "dev")
}

// SystemDataDir is the data directory of a member installed as a service.
const SystemDataDir = datadir.SystemDir

// dir resolves the data directory: the flag or KIBOTOS_DATA_DIR, else the
// system member, else the dev member, so the CLI works with no flags on any
// member host.
func (g *Globals) dir() datadir.Dir {
	if g.DataDir != "" {
		return datadir.Dir(g.DataDir)
	}
	if datadir.Dir(SystemDataDir).Exists() {
		return datadir.Dir(SystemDataDir)
	}
	if d := datadir.Dir(devDataDir()); d.Exists() {
		return d
	}
	return datadir.Dir(SystemDataDir)
}

// client connects to --address or the member of the data directory, with
// the operator credential findCredentials picks; with --api-url, to that
// API listener with --token.
func (g *Globals) client() (*api.Client, error) {
	if g.APIURL != "" {
		return g.tokenClient()
	}
	d := g.dir()
	tlsConf, err := g.findCredentials(d)
	if err != nil {
		return nil, err
	}
	id, err := d.LoadIdentity()
	if err != nil && g.Address == "" {
		return nil, api.Errorf(api.CodeUnauthenticated, "%v; on a host without a member give the member's --address", err)
	}
	addr := g.Address
	c := api.NewClient(addr, tlsConf)
	if id != nil && (addr == "" || addr == id.Advertise) {
		// The member of its data directory (by default, or named by its
		// address): no other member is accepted there, even one whose
		// certificate holds the same host.
		c = api.NewClient(id.Advertise, tlsConf).Expect(id.NodeID)
	}
	c.Consistent = g.Consistent
	c.Namespace, c.AllNamespaces = g.Namespace, g.AllNamespaces
	return c, nil
}

// call is client + Do in one step.
func (g *Globals) call(method, path string, in, out any) (json.RawMessage, error) {
	c, err := g.client()
	if err != nil {
		return nil, err
	}
	return c.Do(g.ctx, method, path, in, out)
}

// getConsistent reads path from the ctrl leader, whatever --consistent
// says: the state a write command checks before it writes must not come
// from a member whose replica lags (one that just restarted answers "does
// not exist" for a Workspace it has not replayed yet).
func (g *Globals) getConsistent(path string, out any) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	c.Consistent = true
	_, err = c.Do(g.ctx, "GET", path, nil, out)
	return err
}

// printJSON prints the API answer indented, without decoding it.
func (g *Globals) printJSON(raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, bytes.TrimSpace(raw), "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := g.stdout.Write(buf.Bytes())
	return err
}

// printf and note escape the control and bidi characters of string
// arguments (they come from the server): the format is ours.
func (g *Globals) printf(format string, args ...any) { fmt.Fprintf(g.stdout, format, shown(args)...) }
func (g *Globals) note(format string, args ...any)   { fmt.Fprintf(g.stderr, format, shown(args)...) }

// writeMeta builds the common write fields from flags. Without
// --command-id the CLI makes one up, so its own retries after a leader
// change cannot apply a write twice.
func writeMeta(commandID string, expected *uint64) api.WriteMeta {
	if commandID == "" {
		b := make([]byte, 12)
		rand.Read(b)
		return api.WriteMeta{CommandID: "cli-" + hex.EncodeToString(b), ExpectedVersion: expected, Generated: true}
	}
	return api.WriteMeta{CommandID: commandID, ExpectedVersion: expected}
}
