// Package tarfile writes and reads the plain archives kibotos puts into
// the artifact store (Platforms, Transfers): regular files only, with
// fixed modes and times so an archive depends on content alone, and
// bounded reads of members into files.
package tarfile

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"time"
)

// Add writes the file at path as member name.
func Add(tw *tar.Writer, name, path string, mode int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: st.Size(), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}

// Extract writes the size bytes r yields to a new file at path (never an
// existing one), synced; a short member is an error.
func Extract(r io.Reader, size int64, path string, mode os.FileMode) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, io.LimitReader(r, size))
	if err == nil && n != size {
		err = fmt.Errorf("%s: truncated at %d of %d bytes", path, n, size)
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
