package artifacts

import (
	"bytes"
	"os"
)

// holeBlock is the unit a holeWriter leaves unwritten when it is zeros:
// the file systems' block size.
const holeBlock = 4096

var zeroBlock [holeBlock]byte

// holeWriter writes to f from offset off on, leaving every block-aligned
// block of zeros as a hole instead of writing it. Template images are
// sparse (the room a Workspace gets, mostly never written), and written
// byte for byte a 1 GiB image with 20 MiB of files would cost the store
// and every node that fetches it the whole GiB of disk. Reads of a hole
// are zeros, so digests and contents are the same. Blocks are judged at
// the file's alignment whatever sizes the writes come in (a network
// reader's are arbitrary); finish writes what is left and gives the file
// its length when it ends in a hole.
type holeWriter struct {
	f    *os.File
	off  int64  // the file offset of pend[0]: what was written through w before it
	pend []byte // bytes up to the next block boundary, not yet written
}

func (w *holeWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if len(w.pend) > 0 || w.off%holeBlock != 0 {
			k := min(len(p), holeBlock-int(w.off%holeBlock)-len(w.pend))
			w.pend, p = append(w.pend, p[:k]...), p[k:]
			if int(w.off%holeBlock)+len(w.pend) == holeBlock {
				if err := w.flush(); err != nil {
					return 0, err
				}
			}
			continue
		}
		whole := len(p) / holeBlock * holeBlock
		if whole == 0 {
			w.pend, p = append(w.pend, p...), nil
			break
		}
		if err := w.blocks(p[:whole]); err != nil {
			return 0, err
		}
		w.off += int64(whole)
		p = p[whole:]
	}
	return n, nil
}

// blocks writes whole aligned blocks at w.off, runs of data at once, the
// zero blocks between them left as holes.
func (w *holeWriter) blocks(q []byte) error {
	run := 0 // q[run:i] is data not yet written
	for i := 0; i <= len(q); i += holeBlock {
		if i < len(q) && !bytes.Equal(q[i:i+holeBlock], zeroBlock[:]) {
			continue
		}
		if i > run {
			if _, err := w.f.WriteAt(q[run:i], w.off+int64(run)); err != nil {
				return err
			}
		}
		run = i + holeBlock
	}
	return nil
}

// flush writes pend: a whole aligned block of zeros as a hole, anything
// else as it is.
func (w *holeWriter) flush() error {
	if w.off%holeBlock == 0 && len(w.pend) == holeBlock {
		if err := w.blocks(w.pend); err != nil {
			return err
		}
	} else if _, err := w.f.WriteAt(w.pend, w.off); err != nil {
		return err
	}
	w.off += int64(len(w.pend))
	w.pend = w.pend[:0]
	return nil
}

// finish writes what is pending and makes the file as long as what was
// written through w, when it ended in a hole.
func (w *holeWriter) finish() error {
	if len(w.pend) > 0 {
		if err := w.flush(); err != nil {
			return err
		}
	}
	fi, err := w.f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() < w.off {
		return w.f.Truncate(w.off)
	}
	return nil
}
