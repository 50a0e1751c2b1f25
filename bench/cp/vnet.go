package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// vnet is a prototype of a bulk path over the guest's virtio-net (not a
// product path): busybox nc in the Workspace, this process dialling
// 169.254.100.2 from inside the Instance's network namespace (the VMM's).
func (b *bench) vnet() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := b.dataPlaneClient(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	e := pathEnv{name: "vnet", c: c, tmpDir: "/tmp", diskDir: "/rootfs/root", root: "/rootfs", procs: b.vmProcs(false)}
	var qemu int
	for _, p := range e.procs() {
		if p.name == "qemu" {
			qemu = p.pid
		}
	}
	if qemu == 0 {
		return errors.New("no VMM process found")
	}
	dial := func(addr string) (net.Conn, error) {
		type res struct {
			c   net.Conn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			// This thread enters the Instance's netns for the dial and
			// goes back before it is unlocked; it must not end (a thread
			// that forked `kibotos dev` ending would kill it: Pdeathsig).
			runtime.LockOSThread()
			self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
			if err != nil {
				ch <- res{nil, err}
				return
			}
			defer self.Close()
			f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", qemu))
			if err != nil {
				ch <- res{nil, err}
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				ch <- res{nil, err}
				return
			}
			defer func() {
				if unix.Setns(int(self.Fd()), unix.CLONE_NEWNET) == nil {
					runtime.UnlockOSThread()
				}
			}()
			var c net.Conn
			for i := 0; i < 50; i++ {
				if c, err = net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			ch <- res{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
	n := strconv.FormatInt(b.size>>20, 10)
	in := func() error {
		p, err := b.exec(e, []string{"sh", "-c", "nc -l -p 5001 >/dev/null"}, false)
		if err != nil {
			return err
		}
		go io.Copy(io.Discard, p.Stdout)
		go io.Copy(io.Discard, p.Stderr)
		tc, err := dial("169.254.100.2:5001")
		if err != nil {
			p.Close()
			return err
		}
		_, err = io.CopyBuffer(tc, &zeroReader{b.size}, make([]byte, 256<<10))
		tc.(*net.TCPConn).CloseWrite()
		if err != nil {
			return err
		}
		ex, err := p.Wait()
		tc.Close()
		if err == nil && ex.ExitCode != 0 {
			err = fmt.Errorf("nc exit %d", ex.ExitCode)
		}
		return err
	}
	out := func() error {
		p, err := b.exec(e, []string{"sh", "-c", "dd if=/dev/zero bs=1M count=" + n + " 2>/dev/null | nc -l -p 5002"}, false)
		if err != nil {
			return err
		}
		go io.Copy(io.Discard, p.Stdout)
		go io.Copy(io.Discard, p.Stderr)
		defer p.Close()
		tc, err := dial("169.254.100.2:5002")
		if err != nil {
			return err
		}
		defer tc.Close()
		got, err := io.CopyN(io.Discard, tc, b.size)
		if got != b.size {
			return fmt.Errorf("read %d of %d bytes: %v", got, b.size, err)
		}
		return nil
	}
	for _, op := range []struct {
		name string
		f    func() error
	}{{"tcp in  (nc -l >/dev/null)", in}, {"tcp out (dd | nc -l)", out}} {
		best := result{path: "vnet", op: op.name}
		for range *rounds {
			before := snapshot(e.procs)
			t0 := time.Now()
			if err := op.f(); err != nil {
				return fmt.Errorf("%s: %w", op.name, err)
			}
			d := time.Since(t0)
			mbps := float64(b.size) / d.Seconds() / 1e6
			cpu := cpuDelta(before, snapshot(e.procs), d)
			fmt.Printf("%-10s %-40s %7.1f MB/s  %s\n", "vnet", op.name, mbps, cpu)
			if mbps > best.mbps {
				best.mbps, best.cpu = mbps, cpu
			}
		}
		b.results = append(b.results, best)
	}
	return nil
}

// ---- the dev cluster ----
