// Command cp measures file transfer into and out of a Workspace hop by hop,
// with real micro-VMs, so each hop's figure is a ratio against a reference
// measured in the same run:
//
//   - loopback: the guest agent in this process on a unix socket (no VM):
//     the protocol's own cost on the host;
//   - direct: a guest protocol session straight on the Instance's data
//     socket (<instance dir>/data.sock, the virtio-serial port
//     kibotos.data), as the data-plane process holds it. Since the data
//     plane dials a new target at once (it holds the socket, and QEMU serves
//     one client) this path is skipped with a note;
//   - vnet: a prototype bulk path over the guest's virtio-net (busybox nc
//     in the Workspace, dialled from inside the Instance's netns), not a
//     product path;
//   - dataplane: the same calls through the node's data-plane process
//     (TLS + yamux, relayed to its guest session), as `kibo workspace cp`;
//   - cli: `kibo workspace cp` itself, in and out.
//
// On each: exec `cat >/dev/null` fed N bytes on stdin and `head -c N
// /dev/zero` read from stdout (raw stream bytes over the channel, no
// files), and WriteFile/ReadFile of N bytes to the guest's tmpfs (/tmp) and
// to the Workspace's ext4 (/rootfs/root). CPU seconds of this process, the
// VMM (its vCPU threads apart) and the data-plane process are printed for
// every transfer.
//
// It builds kibotos from this work tree, starts `kibotos dev` in a fresh
// temporary directory (a short path: unix socket paths are limited), creates
// one Workspace, measures, and tears everything down by PID and
// `kibotos dev down --purge`. Needs what the e2e tests need (root, QEMU, a
// private systemd).
//
//	go run ./bench/cp                 # 100 MiB, 2 rounds, every path
//	go run ./bench/cp -mib 32 -rounds 1 -only loopback,dataplane
//	go run ./bench/cp -kibotos OLD/kibotos   # the guest agent and data plane of another build
//
// Guest CPU (user/sys of the whole guest and of the agent, PID 1) is read
// from /proc/stat and /proc/1/stat in the guest with ReadFile around each
// transfer.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/vmm/guest"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

var (
	mib     = flag.Int("mib", 100, "transfer size in MiB")
	rounds  = flag.Int("rounds", 2, "rounds of every measurement; the best is reported")
	only    = flag.String("only", "loopback,direct,vnet,dataplane,cli", "which paths to measure (vnet: a prototype bulk path over virtio-net, busybox nc in the guest)")
	keep    = flag.Bool("keep", false, "keep the temporary directory")
	kibotos = flag.String("kibotos", "", "a static kibotos binary to run instead of building this work tree")
	cpuProf = flag.String("cpuprofile", "", "write a CPU profile of this process (the loopback guest agent included) to this file")
	cache   = flag.String("platform-cache", filepath.Join(os.TempDir(), "kibotos-test-platform"), "kernel package cache shared with the tests")
)

func main() {
	flag.Parse()
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	if err := run(); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "bench/cp:", err)
		os.Exit(1)
	}
}

type bench struct {
	tmp, bin, dir, addr string
	dev                 *exec.Cmd
	devDone             chan struct{}
	releasePorts        func() // the reservation of addr's ports, kept while dev runs
	ws, instance        string
	dataSock            string
	size                int64
	results             []result
}

type result struct {
	path, op string
	mbps     float64
	cpu      string
}

func run() error {
	b := &bench{size: int64(*mib) << 20}
	var err error
	// Short: the instance sockets live under it.
	if b.tmp, err = os.MkdirTemp("/tmp", "kbc"); err != nil {
		return err
	}
	defer func() {
		if !*keep {
			os.RemoveAll(b.tmp)
		} else {
			fmt.Println("kept", b.tmp)
		}
	}()
	want := func(p string) bool { return slices.Contains(strings.Split(*only, ","), p) }

	if want("loopback") {
		if err := b.loopback(); err != nil {
			return err
		}
	}
	if !want("direct") && !want("dataplane") && !want("cli") {
		b.report()
		return nil
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer b.down()
	go func() {
		<-sig
		b.down()
		os.Exit(1)
	}()
	if err := b.up(); err != nil {
		return err
	}
	if want("direct") {
		// Since the data plane dials a new target's guest at once, it
		// holds the data socket (QEMU serves one client): direct then
		// times out and is skipped.
		if err := b.direct(); err != nil {
			fmt.Println("direct skipped:", err)
		}
	}
	if want("vnet") {
		if err := b.vnet(); err != nil {
			fmt.Println("vnet prototype:", err)
		}
	}
	if want("dataplane") {
		if err := b.viaDataPlane(); err != nil {
			return err
		}
	}
	if want("cli") {
		if err := b.cli(); err != nil {
			return err
		}
	}
	b.report()
	return nil
}

// ---- the calls measured on every path ----

type pathEnv struct {
	name    string
	c       *guestproto.Client
	tmpDir  string // a tmpfs directory on the guest side
	diskDir string // "" on loopback
	root    string // exec chroot
	procs   func() []procCPU
}

func (b *bench) measureAll(e pathEnv) error {
	ops := []struct {
		name string
		f    func() error
	}{
		{"stream in  (exec dd of=/dev/null bs=1M)", func() error { return b.execIn(e) }},
		{"stream out (exec dd if=/dev/zero bs=1M)", func() error { return b.execOut(e) }},
		{"WriteFile tmpfs", func() error { return b.writeFile(e, e.tmpDir) }},
		{"ReadFile  tmpfs", func() error { return b.readFile(e, e.tmpDir) }},
	}
	if e.diskDir != "" {
		ops = append(ops,
			struct {
				name string
				f    func() error
			}{"WriteFile ext4", func() error { return b.writeFile(e, e.diskDir) }},
			struct {
				name string
				f    func() error
			}{"ReadFile  ext4", func() error { return b.readFile(e, e.diskDir) }})
	}
	for _, op := range ops {
		best := result{path: e.name, op: op.name}
		for range *rounds {
			before := snapshot(e.procs)
			gBefore := b.guestCPU(e)
			t0 := time.Now()
			if err := op.f(); err != nil {
				return fmt.Errorf("%s: %s: %w", e.name, op.name, err)
			}
			d := time.Since(t0)
			after := snapshot(e.procs)
			for k, v := range b.guestCPU(e) {
				before[k], after[k] = gBefore[k], v
			}
			mbps := float64(b.size) / d.Seconds() / 1e6
			cpu := cpuDelta(before, after, d)
			fmt.Printf("%-10s %-40s %7.1f MB/s  %s\n", e.name, op.name, mbps, cpu)
			if mbps > best.mbps {
				best.mbps, best.cpu = mbps, cpu
			}
		}
		b.results = append(b.results, best)
	}
	return nil
}

var zeros = make([]byte, 1<<20)

// zeroReader gives n zero bytes without a WriterTo, as a file would.
type zeroReader struct{ n int64 }

func (z *zeroReader) Read(p []byte) (int, error) {
	if z.n == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), z.n, int64(len(zeros))))
	copy(p, zeros[:n])
	z.n -= int64(n)
	return n, nil
}

func (b *bench) exec(e pathEnv, argv []string, stdin bool) (*guestproto.Process, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return e.c.Exec(ctx, guestproto.ExecRequest{Argv: argv, Root: e.root, Stdin: stdin,
		Env: []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin"}})
}

func (b *bench) execIn(e pathEnv) error {
	p, err := b.exec(e, []string{"dd", "of=/dev/null", "bs=1M"}, true)
	if err != nil {
		return err
	}
	go io.Copy(io.Discard, p.Stdout)
	go io.Copy(io.Discard, p.Stderr)
	buf := make([]byte, 256<<10)
	if _, err := io.CopyBuffer(p.Stdin, &zeroReader{b.size}, buf); err != nil {
		return err
	}
	p.Stdin.Close()
	ex, err := p.Wait()
	if err == nil && ex.ExitCode != 0 {
		err = fmt.Errorf("exit %d", ex.ExitCode)
	}
	return err
}

func (b *bench) execOut(e pathEnv) error {
	p, err := b.exec(e, []string{"dd", "if=/dev/zero", "bs=1M", "count=" + strconv.FormatInt(b.size>>20, 10)}, false)
	if err != nil {
		return err
	}
	go io.Copy(io.Discard, p.Stderr)
	n, err := io.CopyBuffer(io.Discard, onlyReader{p.Stdout}, make([]byte, 256<<10))
	if err != nil {
		return err
	}
	if n != b.size {
		return fmt.Errorf("read %d bytes, want %d", n, b.size)
	}
	ex, err := p.Wait()
	if err == nil && ex.ExitCode != 0 {
		err = fmt.Errorf("exit %d", ex.ExitCode)
	}
	return err
}

type onlyReader struct{ io.Reader }

func (b *bench) writeFile(e pathEnv, dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fi, err := e.c.WriteFile(ctx, dir+"/kbc.bin", 0o644, &zeroReader{b.size})
	if err == nil && fi.Size != b.size {
		err = fmt.Errorf("wrote %d bytes, want %d", fi.Size, b.size)
	}
	return err
}

type countW struct{ n int64 }

func (c *countW) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func (b *bench) readFile(e pathEnv, dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var w countW
	if _, err := e.c.ReadFile(ctx, dir+"/kbc.bin", &w); err != nil {
		return err
	}
	if w.n != b.size {
		return fmt.Errorf("read %d bytes, want %d", w.n, b.size)
	}
	return nil
}

// ---- paths ----

// loopback runs the guest agent in this process on a unix socket.
func (b *bench) loopback() error {
	sock := filepath.Join(b.tmp, "lo.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- guest.Serve(ctx, func() (io.ReadWriteCloser, error) { return ln.Accept() }, guest.Options{BootID: "loopback"})
	}()
	defer func() { cancel(); ln.Close(); <-done }()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return err
	}
	c, err := guestproto.Dial(ctx, conn)
	if err != nil {
		return err
	}
	defer c.Close()
	tmp := "/dev/shm"
	if _, err := os.Stat(tmp); err != nil {
		tmp = b.tmp
	}
	tmp, _ = os.MkdirTemp(tmp, "kbc")
	defer os.RemoveAll(tmp)
	return b.measureAll(pathEnv{name: "loopback", c: c, tmpDir: tmp,
		procs: func() []procCPU { return []procCPU{{name: "bench+agent", pid: os.Getpid()}} }})
}

func (b *bench) direct() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var conn net.Conn
	var err error
	// The data-plane process may hold the socket (QEMU serves one client at
	// a time): it only dials on its first client, which has not come yet.
	conn, err = net.Dial("unix", b.dataSock)
	if err != nil {
		return err
	}
	c, err := guestproto.Dial(ctx, conn)
	if err != nil {
		return fmt.Errorf("direct session on %s: %w", b.dataSock, err)
	}
	defer c.Close()
	return b.measureAll(pathEnv{name: "direct", c: c, tmpDir: "/tmp", diskDir: "/rootfs/root", root: "/rootfs", procs: b.vmProcs(false)})
}

func (b *bench) credential(ctx context.Context) (api.DataPlaneCredential, error) {
	var cred api.DataPlaneCredential
	dir := datadir.Dir(b.dir)
	ident, err := dir.LoadIdentity()
	if err != nil {
		return cred, err
	}
	tlsConf, err := dir.AdminClient()
	if err != nil {
		return cred, err
	}
	_, err = api.NewClient(ident.Advertise, tlsConf).Do(ctx, "POST", "/v1/workspaces/"+b.ws+"/credentials", struct{}{}, &cred)
	return cred, err
}

func (b *bench) dataPlaneClient(ctx context.Context) (*guestproto.Client, error) {
	cred, err := b.credential(ctx)
	if err != nil {
		return nil, fmt.Errorf("credential: %w", err)
	}
	roots, err := datadir.Dir(b.dir).CAPool()
	if err != nil {
		return nil, err
	}
	return dataplane.Connect(ctx, cred, roots)
}

func (b *bench) viaDataPlane() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := b.dataPlaneClient(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return b.measureAll(pathEnv{name: "dataplane", c: c, tmpDir: "/tmp", diskDir: "/rootfs/root", root: "/rootfs", procs: b.vmProcs(true)})
}

// cli times `kibo workspace cp` of a local file in and out (ext4).
func (b *bench) cli() error {
	local := filepath.Join(b.tmp, "local.bin")
	f, err := os.Create(local)
	if err != nil {
		return err
	}
	chunk := make([]byte, 1<<20)
	rand.Read(chunk)
	for i := int64(0); i < b.size>>20; i++ {
		f.Write(chunk)
	}
	f.Close()
	defer os.Remove(local)
	for _, dir := range []struct{ name, args string }{{"cp in ", "in"}, {"cp out", "out"}} {
		best := result{path: "cli", op: "kibo workspace " + dir.name + " (ext4)"}
		for range *rounds {
			args := []string{"workspace", "cp", local, b.ws + ":/root/kbc-cli.bin"}
			if dir.args == "out" {
				args = []string{"workspace", "cp", b.ws + ":/root/kbc-cli.bin", local + ".out"}
			}
			before := snapshot(b.vmProcs(true))
			t0 := time.Now()
			if out, err := b.kibo(10*time.Minute, args...); err != nil {
				return fmt.Errorf("kibo %v: %v\n%s", args, err, out)
			}
			d := time.Since(t0)
			mbps := float64(b.size) / d.Seconds() / 1e6
			cpu := cpuDelta(before, snapshot(b.vmProcs(true)), d)
			fmt.Printf("%-10s %-40s %7.1f MB/s  %s\n", "cli", best.op, mbps, cpu)
			if mbps > best.mbps {
				best.mbps, best.cpu = mbps, cpu
			}
		}
		b.results = append(b.results, best)
	}
	os.Remove(local + ".out")
	return nil
}

func errOrNil(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// ---- CPU accounting ----

func (b *bench) report() {
	fmt.Printf("\n%d MiB per transfer, best of %d; ratios: against the same op on direct (the VM's data channel without the data plane), and against the raw stream of the same direction on the same path\n", *mib, *rounds)
	find := func(path, op string) float64 {
		for _, r := range b.results {
			if r.path == path && r.op == op {
				return r.mbps
			}
		}
		return 0
	}
	fmt.Printf("%-10s %-40s %9s %10s %10s  %s\n", "path", "op", "MB/s", "/direct", "/stream", "")
	for _, r := range b.results {
		rel := func(v float64) string {
			if v == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", r.mbps/v)
		}
		in := strings.Contains(r.op, "in ") || strings.Contains(r.op, "tcp in") || strings.Contains(r.op, "Write") || strings.Contains(r.op, "cp in")
		stream := "stream out (exec dd if=/dev/zero bs=1M)"
		if in {
			stream = "stream in  (exec dd of=/dev/null bs=1M)"
		}
		streamPath := r.path
		switch r.path {
		case "cli":
			streamPath = "dataplane"
		case "vnet":
			streamPath = "direct"
		}
		fmt.Printf("%-10s %-40s %9.1f %10s %10s  %s\n", r.path, r.op, r.mbps, rel(find("direct", r.op)), rel(find(streamPath, stream)), r.cpu)
	}
}
