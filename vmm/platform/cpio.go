package platform

import (
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
)

// The initramfs is written by hand in the newc format instead of by cpio(1)
// so that it is reproducible: fixed inode numbers, owners and mtimes mean the
// same inputs give the same bytes and therefore the same Platform id.

const (
	modeDir  = 0o040000
	modeFile = 0o100000
	modeLink = 0o120000
	modeChr  = 0o020000
)

// cpioEntry is one file of the archive; exactly one of src, data or link
// carries the content of a regular file or symlink.
type cpioEntry struct {
	name         string // relative, no leading slash
	mode         uint32 // type and permission bits
	src          string // regular file copied from the host
	data         []byte // regular file given inline
	link         string // symlink target
	major, minor uint32 // device nodes
}

// cpioTree collects entries by path; writing sorts them so parents come
// before their children.
type cpioTree map[string]*cpioEntry

func (t cpioTree) dir(name string) {
	name = strings.Trim(name, "/")
	for d := name; d != "." && d != ""; d = path.Dir(d) {
		if _, ok := t[d]; !ok {
			t[d] = &cpioEntry{name: d, mode: modeDir | 0o755}
		}
	}
}

func (t cpioTree) add(e *cpioEntry) {
	e.name = strings.Trim(e.name, "/")
	t.dir(path.Dir(e.name))
	t[e.name] = e
}

func (t cpioTree) file(name, src string, perm uint32) {
	t.add(&cpioEntry{name: name, mode: modeFile | perm, src: src})
}

func (t cpioTree) bytes(name string, data []byte, perm uint32) {
	t.add(&cpioEntry{name: name, mode: modeFile | perm, data: data})
}

func (t cpioTree) symlink(name, target string) {
	t.add(&cpioEntry{name: name, mode: modeLink | 0o777, link: target})
}

func (t cpioTree) chardev(name string, perm, major, minor uint32) {
	t.add(&cpioEntry{name: name, mode: modeChr | perm, major: major, minor: minor})
}

// write emits the archive in newc format with root ownership and mtime 0.
func (t cpioTree) write(w io.Writer) error {
	names := make([]string, 0, len(t))
	for n := range t {
		names = append(names, n)
	}
	sort.Strings(names)
	cw := &cpioWriter{w: w}
	for i, n := range names {
		if err := cw.entry(uint32(i+1), t[n]); err != nil {
			return fmt.Errorf("initramfs entry %s: %w", n, err)
		}
	}
	return cw.trailer()
}

type cpioWriter struct {
	w   io.Writer
	off int64
}

func (c *cpioWriter) put(b []byte) error {
	n, err := c.w.Write(b)
	c.off += int64(n)
	return err
}

func (c *cpioWriter) pad() error {
	if r := c.off % 4; r != 0 {
		return c.put(make([]byte, 4-r))
	}
	return nil
}

func (c *cpioWriter) header(ino, mode uint32, size int64, major, minor uint32, name string) error {
	if size > 0xFFFFFFFF {
		return fmt.Errorf("file of %d bytes is too large for newc", size)
	}
	h := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, 1, 0, uint32(size), 0, 0, major, minor, len(name)+1, 0)
	if err := c.put([]byte(h + name + "\x00")); err != nil {
		return err
	}
	return c.pad()
}

func (c *cpioWriter) entry(ino uint32, e *cpioEntry) error {
	switch {
	case e.mode&0o170000 == modeLink:
		if err := c.header(ino, e.mode, int64(len(e.link)), 0, 0, e.name); err != nil {
			return err
		}
		if err := c.put([]byte(e.link)); err != nil {
			return err
		}
	case e.src != "":
		f, err := os.Open(e.src)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if err := c.header(ino, e.mode, st.Size(), 0, 0, e.name); err != nil {
			return err
		}
		n, err := io.Copy(c.w, f)
		c.off += n
		if err != nil {
			return err
		}
		if n != st.Size() {
			return fmt.Errorf("%s changed size while being copied", e.src)
		}
	default:
		if err := c.header(ino, e.mode, int64(len(e.data)), e.major, e.minor, e.name); err != nil {
			return err
		}
		if err := c.put(e.data); err != nil {
			return err
		}
	}
	return c.pad()
}

func (c *cpioWriter) trailer() error {
	if err := c.header(0, 0, 0, 0, 0, "TRAILER!!!"); err != nil {
		return err
	}
	return nil
}
