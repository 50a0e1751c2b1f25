package cli

import (
	"bytes"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"unicode/utf8"

	"github.com/kibotos/kibotos/api"
)

// EgressCmd groups the Egress object commands.
type EgressCmd struct {
	Create EgressCreateCmd `cmd:"" help:"Create an Egress: a SOCKS5 proxy of yours that Workspaces' TCP leaves through (workspace --egress NAME)."`
	Update EgressUpdateCmd `cmd:"" help:"Make a new revision of an Egress (only the items given). Workspaces keep the revision they use until a set-network naming the Egress or their next start."`
	List   EgressListCmd   `cmd:"" help:"List Egress objects, by name."`
	Get    EgressGetCmd    `cmd:"" help:"Show one Egress; its password is never shown."`
	Delete EgressDeleteCmd `cmd:"" help:"Delete an Egress that no Workspace's network policy names."`
	Serve  EgressServeCmd  `cmd:"" hidden:"" help:"Run the node's egress process (started by the node as its own unit, unprivileged)."`
}

func egressPath(name string, verb ...string) string {
	p := "/v1/egress/" + url.PathEscape(name)
	if len(verb) > 0 {
		p += "/" + verb[0]
	}
	return p
}

// maxPasswordFile bounds what is read of --password-file: the server
// refuses more than api.MaxCredentialBytes and says how long it was.
const maxPasswordFile = 64 << 10

// readPassword reads --password-file: a file, or stdin for "-", with one
// trailing newline dropped. The password never is a flag value, so it
// shows in no process list or shell history.
func readPassword(g *Globals, path string) (string, error) {
	var r io.Reader
	name := path
	if path == "-" {
		if g.stdin == nil {
			return "", usagef("--password-file -: no standard input to read the password from")
		}
		r, name = g.stdin, "standard input"
	} else {
		f, err := os.Open(path)
		if err != nil {
			return "", usagef("--password-file %s: %v", path, err)
		}
		defer f.Close()
		r = f
	}
	raw, err := io.ReadAll(io.LimitReader(r, maxPasswordFile+1))
	if err != nil {
		return "", usagef("--password-file: read %s: %v", name, err)
	}
	if len(raw) > maxPasswordFile {
		return "", exitError{api.ExitInvalidArgument, fmt.Sprintf("--password-file: %s holds more than %d bytes: a SOCKS5 password is at most %d", name, maxPasswordFile, api.MaxCredentialBytes)}
	}
	raw = bytes.TrimSuffix(raw, []byte("\n"))
	raw = bytes.TrimSuffix(raw, []byte("\r"))
	switch {
	case len(raw) == 0:
		return "", usagef("--password-file: %s holds no password", name)
	case !utf8.Valid(raw):
		// JSON would replace the bad bytes and store another password.
		return "", exitError{api.ExitInvalidArgument, fmt.Sprintf("--password-file: the password in %s is not UTF-8 text", name)}
	}
	return string(raw), nil
}

func credentialsColumn(e *api.Egress) string {
	if e.PasswordSet {
		return "set"
	}
	return "none"
}

// EgressCreateCmd is `egress create`.
type EgressCreateCmd struct {
	Name         string `arg:"" name:"name" help:"1-63 lowercase letters, digits or '-'; not none, public or default."`
	SOCKS5       string `name:"socks5" required:"" placeholder:"HOST:PORT" help:"The SOCKS5 proxy: an IPv4 address, [IPv6] or DNS name, and a port."`
	Username     string `name:"username" help:"SOCKS5 username (RFC 1929); needs --password-file."`
	PasswordFile string `name:"password-file" placeholder:"FILE|-" help:"Read the SOCKS5 password from FILE, or from stdin with -; one trailing newline is dropped."`
	CommandID    string `name:"command-id" help:"Idempotency key."`
}

func (c *EgressCreateCmd) Run(g *Globals) error {
	if (c.Username == "") != (c.PasswordFile == "") {
		return usagef("--username and --password-file go together: SOCKS5 authentication needs both (or give neither)")
	}
	req := api.EgressCreateRequest{WriteMeta: writeMeta(c.CommandID, nil), Name: c.Name, SOCKS5: c.SOCKS5, Username: c.Username}
	if c.PasswordFile != "" {
		pw, err := readPassword(g, c.PasswordFile)
		if err != nil {
			return err
		}
		req.Password = pw
	}
	var e api.Egress
	raw, err := g.call("POST", "/v1/egress", req, &e)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("egress %s created: socks5 %s, credentials %s (revision %d, version %d)\n", e.Name, e.SOCKS5, credentialsColumn(&e), e.Revision, e.Version)
	return nil
}

// EgressUpdateCmd is `egress update`.
type EgressUpdateCmd struct {
	Name             string  `arg:"" name:"name"`
	SOCKS5           *string `name:"socks5" placeholder:"HOST:PORT" help:"Replace the SOCKS5 proxy address."`
	Username         *string `name:"username" help:"Replace the username (the password is kept unless --password-file is given)."`
	PasswordFile     string  `name:"password-file" placeholder:"FILE|-" help:"Replace the password, read from FILE or stdin (-)."`
	ClearCredentials bool    `name:"clear-credentials" help:"Drop username and password: the proxy takes no authentication."`
	CommandID        string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion  *uint64 `name:"expected-version" help:"Version the Egress must still be at."`
}

func (c *EgressUpdateCmd) Run(g *Globals) error {
	if c.ClearCredentials && (c.Username != nil || c.PasswordFile != "") {
		return usagef("--clear-credentials and --username/--password-file are exclusive: give one")
	}
	if c.SOCKS5 == nil && c.Username == nil && c.PasswordFile == "" && !c.ClearCredentials {
		return usagef("give what to change: --socks5, --username, --password-file or --clear-credentials")
	}
	req := api.EgressUpdateRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), SOCKS5: c.SOCKS5, Username: c.Username, ClearCredentials: c.ClearCredentials}
	if c.PasswordFile != "" {
		pw, err := readPassword(g, c.PasswordFile)
		if err != nil {
			return err
		}
		req.Password = &pw
	}
	var e api.Egress
	raw, err := g.call("POST", egressPath(c.Name, "update"), req, &e)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	// An update that changes nothing makes no revision: say where it is.
	g.printf("egress %s is at revision %d: socks5 %s, credentials %s (version %d)\n", e.Name, e.Revision, e.SOCKS5, credentialsColumn(&e), e.Version)
	if e.Workspaces > 0 {
		g.note("%d Workspaces keep the revision they use until kibo workspace set-network WORKSPACE --egress %s, or their next start\n", e.Workspaces, e.Name)
	}
	return nil
}

// EgressListCmd is `egress list`.
type EgressListCmd struct {
	PageSize  int    `name:"page-size" default:"0" help:"Egress objects per page (0: all)."`
	PageToken string `name:"page-token" help:"Continue after a previous page."`
	Quiet     bool   `short:"q" name:"quiet" help:"Print only the names."`
	Wide      bool   `name:"wide" help:"Add the USERNAME, VERSION and UPDATED columns."`
}

func (c *EgressListCmd) Run(g *Globals) error {
	var out api.EgressList
	return runList(g, listCall{path: "/v1/egress", size: c.PageSize, token: c.PageToken, quiet: c.Quiet, what: "Egress objects"}, &out,
		func() ([]string, string) {
			names := make([]string, len(out.Egress))
			for i, e := range out.Egress {
				names[i] = e.Name
			}
			return names, out.NextPageToken
		},
		func() { c.table(g, &out) })
}

func (c *EgressListCmd) table(g *Globals, out *api.EgressList) {
	header := []string{"NAME", "SOCKS5", "REVISION", "CREDENTIALS", "WORKSPACES"}
	if c.Wide {
		header = append(header, "USERNAME", "VERSION", "UPDATED")
	}
	t := newTable(g.stdout, g.namespaceFirst("NAMESPACE", header)...)
	for i := range out.Egress {
		e := &out.Egress[i]
		row := []string{e.Name, e.SOCKS5, strconv.FormatUint(e.Revision, 10), credentialsColumn(e), itoa(e.Workspaces)}
		if c.Wide {
			row = append(row, dash(e.Username), strconv.FormatUint(e.Version, 10), stamp(e.UpdatedAt))
		}
		t.row(g.namespaceFirst(api.ShownNamespace(e.Namespace), row)...)
	}
	t.flush()
}

// listCall is one page of an object list: where, which page, how shown.
type listCall struct {
	path   string
	filter url.Values // more query parameters; may be nil
	size   int
	token  string
	quiet  bool
	what   string // "Egress objects": in the next-page note
}

// runList is the frame of the object lists: fetch one page into out,
// print it as received (--json), its names (-q) or the table, and say
// how to read the next one. names gives the page's names and next token.
func runList(g *Globals, l listCall, out any, names func() ([]string, string), table func()) error {
	if l.size < 0 {
		return usagef("--page-size must be 0 or more")
	}
	raw, err := g.call("GET", l.path+pageQuery(l.filter, l.size, l.token), nil, out)
	if err != nil {
		return err
	}
	ids, next := names()
	switch {
	case g.JSON:
		return g.printJSON(raw)
	case l.quiet:
		for _, id := range ids {
			g.printf("%s\n", id)
		}
	default:
		table()
	}
	if next != "" {
		g.note("more %s: --page-token %s\n", l.what, next)
	}
	return nil
}

// pageQuery is the query of a list: filter, page_size and page_token; ""
// for none.
func pageQuery(filter url.Values, size int, token string) string {
	q := url.Values{}
	for k, v := range filter {
		q[k] = v
	}
	if size > 0 {
		q.Set("page_size", strconv.Itoa(size))
	}
	if token != "" {
		q.Set("page_token", token)
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// EgressGetCmd is `egress get`.
type EgressGetCmd struct {
	Name string `arg:"" name:"name"`
}

func (c *EgressGetCmd) Run(g *Globals) error {
	var e api.Egress
	raw, err := g.call("GET", egressPath(c.Name), nil, &e)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	line := func(label, format string, args ...any) {
		g.printf("%-12s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	line("Name", "%s", e.Name)
	line("SOCKS5", "%s", e.SOCKS5)
	line("Revision", "%d", e.Revision)
	line("Username", "%s", dash(e.Username))
	line("Password", "%s", credentialsColumn(&e))
	line("Workspaces", "%d", e.Workspaces)
	line("Version", "%d", e.Version)
	line("Created", "%s", stamp(e.CreatedAt))
	line("Updated", "%s", stamp(e.UpdatedAt))
	return nil
}

// EgressDeleteCmd is `egress delete`.
type EgressDeleteCmd struct {
	Name            string  `arg:"" name:"name"`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Egress must still be at."`
}

func (c *EgressDeleteCmd) Run(g *Globals) error {
	raw, err := g.call("POST", egressPath(c.Name, "delete"), writeMeta(c.CommandID, c.ExpectedVersion), nil)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("egress %s deleted\n", c.Name)
	return nil
}
