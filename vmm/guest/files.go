package guest

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

func fileInfo(path string, fi os.FileInfo) guestproto.FileInfo {
	out := guestproto.FileInfo{Path: path, Size: fi.Size(), Mode: fi.Mode(), ModTime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		out.UID, out.GID = int(st.Uid), int(st.Gid)
	}
	return out
}

func stat(path string) (guestproto.FileInfo, error) {
	if !filepath.IsAbs(path) {
		return guestproto.FileInfo{}, &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("path %q is not absolute", path)}
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return guestproto.FileInfo{}, err
	}
	return fileInfo(path, fi), nil
}

// writeFile receives the chunks into a temporary file next to path and
// renames it over path once complete, so a broken transfer leaves the old
// file. On an early failure the data is still drained, to keep the stream
// framed for the reply.
func writeFile(s io.Reader, req guestproto.FileWriteRequest) (guestproto.FileInfo, error) {
	data := &guestproto.ChunkReader{R: s}
	fail := func(err error) (guestproto.FileInfo, error) {
		io.Copy(io.Discard, data)
		return guestproto.FileInfo{}, err
	}
	if !filepath.IsAbs(req.Path) {
		return fail(&guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("path %q is not absolute", req.Path)})
	}
	mode := req.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	f, err := os.CreateTemp(filepath.Dir(req.Path), "."+filepath.Base(req.Path)+".kibotos-*.tmp")
	if err != nil {
		return fail(err)
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := io.CopyBuffer(f, data, make([]byte, 256<<10)); err != nil {
		// A failed write (no space left) must still read the rest of the
		// stream, or the sender blocks and never sees the error.
		return fail(fmt.Errorf("write %s: %w", req.Path, err))
	}
	if err := f.Chmod(mode); err != nil {
		return guestproto.FileInfo{}, err
	}
	if err := f.Sync(); err != nil {
		return guestproto.FileInfo{}, err
	}
	if err := f.Close(); err != nil {
		return guestproto.FileInfo{}, err
	}
	if err := os.Rename(tmp, req.Path); err != nil {
		return guestproto.FileInfo{}, err
	}
	done = true
	return stat(req.Path)
}

// readFile answers with the file's info, the data as chunks and a trailer.
func (a *agent) readFile(conn net.Conn, req guestproto.FileReadRequest) {
	// A node that stops reading must not pin this handler forever.
	s := &deadlineWriter{conn: conn, d: 30 * time.Second}
	var f *os.File
	var err error
	switch {
	case req.Root != "":
		f, req.Path, err = openFileAs(req.Root, req.User, req.Path)
	case !filepath.IsAbs(req.Path):
		err = &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("path %q is not absolute", req.Path)}
	default:
		f, err = os.Open(req.Path)
	}
	if err != nil {
		respond(s, nil, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		respond(s, nil, err)
		return
	}
	if !fi.Mode().IsRegular() {
		respond(s, nil, &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("%s is not a regular file", req.Path)})
		return
	}
	if err := respond(s, fileInfo(req.Path, fi), nil); err != nil {
		return
	}
	cw := &guestproto.ChunkWriter{W: s}
	_, cerr := io.CopyBuffer(cw, onlyReader{f}, make([]byte, 256<<10))
	if err := cw.Close(); err != nil {
		return
	}
	if cerr != nil {
		cerr = fmt.Errorf("read %s: %w", req.Path, cerr)
	}
	respond(s, nil, cerr)
}

// onlyReader hides WriterTo so CopyBuffer uses our buffer size.
type onlyReader struct{ io.Reader }

// deadlineWriter gives every write its own deadline.
type deadlineWriter struct {
	conn net.Conn
	d    time.Duration
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.conn.SetWriteDeadline(time.Now().Add(w.d))
	return w.conn.Write(p)
}
