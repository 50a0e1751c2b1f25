// Command volumeio measures block I/O where it runs (inside a guest, put
// there by agent/runtime's BenchmarkVolumeIO): sequential writes and reads
// in 1 MiB blocks and random 4 KiB writes and reads, all O_DIRECT so the
// guest's page cache does not turn a disk figure into a memory one, on a
// file of a mounted filesystem or on a raw block device. It prints one
// line: mode, bytes, seconds, MB/s, IO/s.
//
//	volumeio -path /vol/f -size 134217728 -mode seqwrite
package main

import (
	"flag"
	"fmt"
	"math/rand"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	path := flag.String("path", "", "file or block device")
	size := flag.Int64("size", 128<<20, "bytes the test covers")
	mode := flag.String("mode", "seqwrite", "seqwrite, seqread, randwrite or randread")
	ops := flag.Int("ops", 2000, "random I/Os")
	flag.Parse()
	if err := run(*path, *size, *mode, *ops); err != nil {
		fmt.Fprintln(os.Stderr, "volumeio:", err)
		os.Exit(1)
	}
}

func run(path string, size int64, mode string, ops int) error {
	block := 1 << 20
	if mode == "randwrite" || mode == "randread" {
		block = 4096
	}
	// O_DIRECT wants an aligned buffer: a mapping is page aligned.
	buf, err := unix.Mmap(-1, 0, block, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	flags := os.O_RDWR | unix.O_DIRECT
	if mode == "seqwrite" {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	r := rand.New(rand.NewSource(1))
	var done int64
	t0 := time.Now()
	switch mode {
	case "seqwrite", "seqread":
		for off := int64(0); off+int64(block) <= size; off += int64(block) {
			if mode == "seqwrite" {
				_, err = f.WriteAt(buf, off)
			} else {
				_, err = f.ReadAt(buf, off)
			}
			if err != nil {
				return err
			}
			done += int64(block)
		}
	case "randwrite", "randread":
		blocks := size / int64(block)
		for i := 0; i < ops; i++ {
			off := r.Int63n(blocks) * int64(block)
			if mode == "randwrite" {
				_, err = f.WriteAt(buf, off)
			} else {
				_, err = f.ReadAt(buf, off)
			}
			if err != nil {
				return err
			}
			done += int64(block)
		}
	default:
		return fmt.Errorf("mode %q: want seqwrite, seqread, randwrite or randread", mode)
	}
	if mode == "seqwrite" || mode == "randwrite" {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	s := time.Since(t0).Seconds()
	fmt.Printf("%s %d %.3f %.1f %.0f\n", mode, done, s, float64(done)/1e6/s, float64(done)/float64(block)/s)
	return nil
}
