package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// E2B's files: GET and POST /files and the filesystem service's Stat,
// ListDir, MakeDir, Move and Remove. envd does them as the sandbox's
// user; here each is a small shell command run as the template's user,
// so what that user may not read or write is refused by the guest's own
// permissions, and what it writes is its own. A relative path is relative
// to the user's home (the template's working directory).

// Exit codes of the commands below, for the errors E2B's SDKs map.
const (
	exitNotFound = 44
	exitExists   = 45
	exitIsDir    = 46
)

// absolute is the shell prefix that makes $p the absolute form of $1.
const absolute = `case "$1" in /*) p="$1";; *) p="$PWD/$1";; esac; `

// statFormat is find's -printf of an entry: type, size, mode, symbolic
// mode, owner, group, modification time, link target, path; NUL-ended,
// the path last (it may hold tabs).
const statFormat = `%y\t%s\t%m\t%M\t%u\t%g\t%T@\t%l\t%p\0`

// runIn runs the shell script in sandbox id's guest as the request's user
// with args ($1, $2, ...), stdin as its input (nil: none) and its output
// to stdout.
func (h *handler) runIn(r *http.Request, id, script string, args []string, stdin io.Reader, stdout io.Writer) (exit int, stderr string, err error) {
	gc, release, err := h.openGuest(r, id)
	if err != nil {
		return 0, "", err
	}
	defer release()
	return runScript(r.Context(), gc, scriptExec(r, script, args, stdin != nil), stdin, stdout)
}

// scriptExec is the exec of the shell script with args ($1, $2, ...) as
// the request's user.
func scriptExec(r *http.Request, script string, args []string, stdin bool) guestproto.ExecRequest {
	return withUser(r, guestproto.ExecRequest{Argv: append([]string{"/bin/sh", "-c", script, "sh"}, args...), Root: guestproto.WorkspaceRoot, Stdin: stdin})
}

func runScript(ctx context.Context, gc *guestproto.Client, req guestproto.ExecRequest, stdin io.Reader, stdout io.Writer) (int, string, error) {
	p, err := startExec(ctx, gc, req)
	if err != nil {
		return 0, "", rpcErrorf("unavailable", "start a command in the sandbox: %v", err)
	}
	stop := context.AfterFunc(ctx, func() { p.Signal(9) })
	defer stop()
	var errb bytes.Buffer
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(&errb, io.LimitReader(p.Stderr, 64<<10))
		io.Copy(io.Discard, p.Stderr)
	})
	if stdin != nil {
		// Ends at the input's end, or at the first write after the
		// command's end.
		wg.Go(func() {
			io.Copy(p.Stdin, stdin)
			p.Stdin.Close()
		})
	}
	_, cerr := io.Copy(stdout, p.Stdout)
	if cerr != nil {
		p.Signal(9)
		io.Copy(io.Discard, p.Stdout)
	}
	exit, err := p.Wait()
	wg.Wait()
	if err != nil {
		return 0, "", rpcErrorf("unavailable", "lost the command in the sandbox: %v", err)
	}
	if cerr != nil {
		return 0, "", cerr
	}
	if exit.Signal != 0 {
		return 0, "", rpcErrorf("aborted", "the command was killed by signal %d", exit.Signal)
	}
	return exit.ExitCode, strings.TrimSpace(errb.String()), nil
}

// fileError is the error of a command that exited with code.
func fileError(code int, stderr, p string) *connectError {
	switch {
	case code == exitNotFound:
		return rpcErrorf("not_found", "%s: no such file or directory", p)
	case code == exitExists:
		return rpcErrorf("already_exists", "%s: it exists already", p)
	case code == exitIsDir:
		return rpcErrorf("invalid_argument", "%s is a directory", p)
	case strings.Contains(stderr, "ermission denied"):
		return rpcErrorf("permission_denied", "%s: %s", p, stderr)
	case strings.Contains(stderr, "o such file or directory"):
		return rpcErrorf("not_found", "%s: %s", p, stderr)
	}
	return rpcErrorf("internal", "%s: exit %d: %s", p, code, stderr)
}

// entryInfo is filesystem.proto's EntryInfo in JSON.
type entryInfo struct {
	Name          string `json:"name"`
	Type          string `json:"type"`
	Path          string `json:"path"`
	Size          string `json:"size"` // int64: a string in JSON
	Mode          uint32 `json:"mode"`
	Permissions   string `json:"permissions"`
	Owner         string `json:"owner"`
	Group         string `json:"group"`
	ModifiedTime  string `json:"modifiedTime"`
	SymlinkTarget string `json:"symlinkTarget,omitempty"`
}

// parseEntries reads find's statFormat records.
func parseEntries(out []byte) ([]entryInfo, error) {
	entries := []entryInfo{}
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		f := strings.SplitN(string(rec), "\t", 9)
		if len(f) != 9 {
			return nil, rpcErrorf("internal", "an entry the sandbox listed is not one: %q", rec)
		}
		mode, _ := strconv.ParseUint(f[2], 8, 32)
		secs, _ := strconv.ParseFloat(f[6], 64)
		whole, frac := math.Modf(secs)
		e := entryInfo{Name: path.Base(f[8]), Path: f[8], Size: f[1], Mode: uint32(mode), Permissions: f[3], Owner: f[4], Group: f[5],
			ModifiedTime: time.Unix(int64(whole), int64(frac*1e9)).UTC().Format(time.RFC3339Nano)}
		switch f[0] {
		case "f":
			e.Type = "FILE_TYPE_FILE"
		case "d":
			e.Type = "FILE_TYPE_DIRECTORY"
		case "l":
			e.Type = "FILE_TYPE_SYMLINK"
			e.SymlinkTarget = f[7]
		default:
			e.Type = "FILE_TYPE_UNSPECIFIED"
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// filesystemUnary serves the filesystem service's unary calls.
func (h *handler) filesystemUnary(w http.ResponseWriter, r *http.Request, id, method string) {
	var req struct {
		Path        string `json:"path"`
		Depth       int    `json:"depth"`
		Source      string `json:"source"`
		Destination string `json:"destination"`
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxEnvelope))
	if err == nil && len(raw) > 0 {
		err = json.Unmarshal(raw, &req)
	}
	if err != nil {
		unaryError(w, rpcErrorf("invalid_argument", "request: %v", err))
		return
	}
	if method == "Move" {
		req.Path = req.Source
	}
	if req.Path == "" || (method == "Move" && req.Destination == "") {
		unaryError(w, rpcErrorf("invalid_argument", "%s: the path is empty", method))
		return
	}
	stat := `find "$p" -maxdepth 0 -printf '` + statFormat + `'`
	var script string
	args := []string{req.Path}
	switch method {
	case "Stat":
		script = absolute + `[ -e "$p" ] || [ -L "$p" ] || exit 44; ` + stat
	case "ListDir":
		depth := max(req.Depth, 1)
		script = absolute + `[ -e "$p" ] || exit 44; [ -d "$p" ] || { echo "$p is not a directory" >&2; exit 1; }; find "$p" -mindepth 1 -maxdepth ` + strconv.Itoa(depth) + ` -printf '` + statFormat + `'`
	case "MakeDir":
		script = absolute + `[ -e "$p" ] && exit 45; mkdir -p -- "$p" && ` + stat
	case "Move":
		args = append(args, req.Destination)
		script = absolute + `[ -e "$p" ] || [ -L "$p" ] || exit 44; case "$2" in /*) d="$2";; *) d="$PWD/$2";; esac; mv -- "$p" "$d" && p="$d" && ` + stat
	case "Remove":
		script = absolute + `[ -e "$p" ] || [ -L "$p" ] || exit 44; rm -rf -- "$p"`
	default:
		unaryError(w, rpcErrorf("unimplemented", "filesystem.Filesystem/%s is not served by Kibotos's E2B sandbox API yet (docs/e2b.md)", method))
		return
	}
	var out bytes.Buffer
	code, stderr, err := h.runIn(r, id, script, args, nil, &limitedBuffer{b: &out, max: 16 << 20})
	if err != nil {
		unaryError(w, err)
		return
	}
	if code != 0 {
		unaryError(w, fileError(code, stderr, req.Path))
		return
	}
	entries, err := parseEntries(out.Bytes())
	if err != nil {
		unaryError(w, err)
		return
	}
	var answer any = struct{}{}
	switch method {
	case "ListDir":
		answer = struct {
			Entries []entryInfo `json:"entries"`
		}{entries}
	case "Stat", "MakeDir", "Move":
		if len(entries) != 1 {
			unaryError(w, rpcErrorf("internal", "%s: the sandbox gave %d entries, want 1", req.Path, len(entries)))
			return
		}
		answer = struct {
			Entry entryInfo `json:"entry"`
		}{entries[0]}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(answer)
}

// limitedBuffer refuses output past max: a listing of a huge tree.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if l.b.Len()+len(p) > l.max {
		return 0, rpcErrorf("resource_exhausted", "the answer is more than %d MiB: list less deep", l.max>>20)
	}
	return l.b.Write(p)
}

// filesError answers GET or POST /files with err as envd does: JSON with
// the status E2B's SDKs map (404: FileNotFoundError).
func filesError(w http.ResponseWriter, err error) {
	var ce *connectError
	if !errors.As(err, &ce) {
		ce = rpcErrorf("internal", "%v", err)
	}
	status := connectStatus(ce.Code)
	if ce.Code == "already_exists" || ce.Code == "failed_precondition" {
		status = http.StatusConflict
	}
	writeError(w, status, ce.Message)
}

// readFile is GET /files?path=: the file's bytes, streamed.
func (h *handler) readFile(w http.ResponseWriter, r *http.Request, id string) {
	p := r.URL.Query().Get("path")
	if p == "" {
		filesError(w, rpcErrorf("invalid_argument", "path is missing"))
		return
	}
	gc, release, err := h.openGuest(r, id)
	if err != nil {
		filesError(w, err)
		return
	}
	defer release()
	if gc.Info().Has(guestproto.CapFilesAs) {
		readAs(w, r, gc, p)
		return
	}
	out := &firstWrite{w: w}
	code, stderr, err := runScript(r.Context(), gc, scriptExec(r, absolute+`[ -e "$p" ] || exit 44; [ -d "$p" ] && exit 46; exec cat -- "$p"`, []string{p}, false), nil, out)
	switch {
	case err != nil && !out.started:
		filesError(w, err)
	case err == nil && code != 0 && !out.started:
		filesError(w, fileError(code, stderr, p))
	case !out.started:
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
	}
}

// readAs streams the file p as the request's user with the guest's own
// file read, which opens it with the user's permissions.
func readAs(w http.ResponseWriter, r *http.Request, gc *guestproto.Client, p string) {
	out := &firstWrite{w: w}
	req := guestproto.FileReadRequest{Path: p, Root: guestproto.WorkspaceRoot, User: withUser(r, guestproto.ExecRequest{}).User}
	fi, err := gc.ReadFileAs(r.Context(), req, out)
	switch {
	case err != nil && !out.started:
		filesError(w, guestFileError(p, err))
	case err == nil && !out.started:
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
		w.WriteHeader(http.StatusOK)
	}
}

// guestFileError is the guest's refusal of a file operation on p.
func guestFileError(p string, err error) error {
	var ge *guestproto.Error
	switch {
	case errors.As(err, &ge) && ge.Code == guestproto.CodePermissionDenied:
		return rpcErrorf("permission_denied", "%s", ge.Message)
	case errors.As(err, &ge) && ge.Code == guestproto.CodeNotFound:
		return rpcErrorf("not_found", "%s: no such file or directory", p)
	case errors.As(err, &ge) && ge.Code == guestproto.CodeInvalid:
		return rpcErrorf("invalid_argument", "%s", ge.Message)
	}
	return rpcErrorf("unavailable", "%s in the sandbox: %v", p, err)
}

// firstWrite sends the 200 and its headers at the first byte, so that an
// error before any is still answered as one.
type firstWrite struct {
	w       http.ResponseWriter
	started bool
}

func (f *firstWrite) Write(b []byte) (int, error) {
	if !f.started {
		f.started = true
		f.w.Header().Set("Content-Type", "application/octet-stream")
		f.w.WriteHeader(http.StatusOK)
	}
	return f.w.Write(b)
}

// writeAs writes body to p as the request's user with the guest's own
// file write, which takes the user's permissions and makes the file and
// its directories the user's, as the shell's cat below would.
func writeAs(r *http.Request, gc *guestproto.Client, p string, body io.Reader) (writtenFile, error) {
	req := guestproto.FileWriteRequest{Path: p, Root: guestproto.WorkspaceRoot, MakeDirs: true, User: withUser(r, guestproto.ExecRequest{}).User}
	fi, err := gc.WriteFileAs(r.Context(), req, body)
	if err != nil {
		return writtenFile{}, guestFileError(p, err)
	}
	return writtenFile{Name: path.Base(fi.Path), Type: "file", Path: fi.Path}, nil
}

// writtenFile is POST /files' answer for each file.
type writtenFile struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// writeFiles is POST /files: each part of a multipart body (or an
// octet-stream body) written to path, or to the part's file name, its
// directories made as needed.
func (h *handler) writeFiles(w http.ResponseWriter, r *http.Request, id string) {
	q := r.URL.Query()
	var gc *guestproto.Client // opened at the first file
	release := func() {}
	defer func() { release() }()
	write := func(p string, body io.Reader) (writtenFile, error) {
		if p == "" {
			return writtenFile{}, rpcErrorf("invalid_argument", "a file without a path: give path, or the part's file name")
		}
		if gc == nil {
			g, rel, err := h.openGuest(r, id)
			if err != nil {
				return writtenFile{}, err
			}
			gc, release = g, rel
		}
		if gc.Info().Has(guestproto.CapFilesAs) {
			return writeAs(r, gc, p, body)
		}
		var out bytes.Buffer
		code, stderr, err := h.runIn(r, id, absolute+`[ -d "$p" ] && exit 46; mkdir -p -- "$(dirname -- "$p")" && cat > "$p" && printf '%s' "$p"`,
			[]string{p}, body, &limitedBuffer{b: &out, max: 64 << 10})
		if err != nil {
			return writtenFile{}, err
		}
		if code != 0 {
			return writtenFile{}, fileError(code, stderr, p)
		}
		return writtenFile{Name: path.Base(out.String()), Type: "file", Path: out.String()}, nil
	}
	var written []writtenFile
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/") {
		// The SDKs' octet-stream upload, gzip-compressed when asked.
		body := io.Reader(r.Body)
		switch enc := r.Header.Get("Content-Encoding"); enc {
		case "", "identity":
		case "gzip":
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				filesError(w, rpcErrorf("invalid_argument", "body: not gzip: %v", err))
				return
			}
			defer zr.Close()
			body = zr
		default:
			filesError(w, rpcErrorf("invalid_argument", "Content-Encoding %.40q: send the file as it is or gzip-compressed", enc))
			return
		}
		f, err := write(q.Get("path"), body)
		if err != nil {
			filesError(w, err)
			return
		}
		written = append(written, f)
	} else {
		mr, err := r.MultipartReader()
		if err != nil {
			filesError(w, rpcErrorf("invalid_argument", "body: %v", err))
			return
		}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				filesError(w, rpcErrorf("invalid_argument", "body: %v", err))
				return
			}
			if part.FormName() != "file" {
				continue
			}
			p := q.Get("path")
			if p == "" {
				// The full path: Part.FileName keeps only its base.
				_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				p = params["filename"]
			}
			f, err := write(p, part)
			if err != nil {
				filesError(w, err)
				return
			}
			written = append(written, f)
		}
	}
	if len(written) == 0 {
		filesError(w, rpcErrorf("invalid_argument", "no file in the body: send it as the multipart part file"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(written)
}
