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
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/kibotos/kibotos/internal/hostprobe"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

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

func (b *bench) kibo(timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(b.bin, "kibo"), args...)
	cmd.Env = append(hostprobe.CleanEnv(), "KIBOTOS_DATA_DIR="+b.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

func (b *bench) up() error {
	t0 := time.Now()
	b.bin = filepath.Join(b.tmp, "bin")
	b.dir = filepath.Join(b.tmp, "d")
	cmd := exec.Command("go", "build", "-o", filepath.Join(b.bin, "kibotos"), "github.com/kibotos/kibotos")
	if *kibotos != "" {
		cmd = exec.Command("cp", *kibotos, filepath.Join(b.bin, "kibotos"))
		os.MkdirAll(b.bin, 0o755)
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build kibotos: %v\n%s", err, out)
	}
	if err := os.Symlink("kibotos", filepath.Join(b.bin, "kibo")); err != nil {
		return err
	}
	port, release, err := hostprobe.ReservePorts(4) // API, gossip, data plane, metrics
	if err != nil {
		return err
	}
	b.releasePorts = release
	b.addr = "127.0.0.1:" + strconv.Itoa(port)
	logf, err := os.Create(filepath.Join(b.tmp, "dev.log"))
	if err != nil {
		return err
	}
	b.dev = exec.Command(filepath.Join(b.bin, "kibotos"), "dev", "--data-dir", b.dir, "--advertise", b.addr,
		"--no-demo", "--platform-cache-dir", *cache)
	b.dev.Stdout, b.dev.Stderr, b.dev.Env = logf, logf, hostprobe.CleanEnv()
	b.dev.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := b.dev.Start(); err != nil {
		return err
	}
	b.devDone = make(chan struct{})
	go func() { b.dev.Wait(); logf.Close(); close(b.devDone) }()
	fmt.Printf("kibotos dev pid %d in %s\n", b.dev.Process.Pid, b.tmp)

	deadline := time.Now().Add(5 * time.Minute)
	for {
		select {
		case <-b.devDone:
			return fmt.Errorf("kibotos dev exited; see %s/dev.log", b.tmp)
		default:
		}
		out, err := b.kibo(10*time.Second, "node", "get", "dev", "--json")
		if err == nil && bytes.Contains(out, []byte(`"data_plane_address"`)) && bytes.Contains(out, []byte(`"acknowledged": true`)) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node dev not ready: %s", out)
		}
		time.Sleep(300 * time.Millisecond)
	}
	fmt.Printf("dev ready in %s\n", time.Since(t0).Round(time.Millisecond))
	out, err := b.kibo(5*time.Minute, "workspace", "create", "--template", "kibotos-base", "-q")
	if err != nil {
		return fmt.Errorf("workspace create: %v: %s", err, out)
	}
	b.ws = strings.TrimSpace(string(out))
	out, err = b.kibo(time.Minute, "workspace", "get", b.ws, "--json")
	if err != nil {
		return fmt.Errorf("workspace get: %v: %s", err, out)
	}
	var view struct {
		Result struct {
			InstanceID string `json:"instance_id"`
		} `json:"result"`
	}
	if err := json.Unmarshal(out, &view); err != nil {
		return err
	}
	b.instance = view.Result.InstanceID
	filepath.WalkDir(b.dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "data.sock" && strings.Contains(p, b.instance) {
			b.dataSock = p
		}
		return nil
	})
	if b.dataSock == "" {
		return fmt.Errorf("no data.sock of %s under %s", b.instance, b.dir)
	}
	fmt.Printf("workspace %s (instance %s) available after %s; data socket %s\n", b.ws, b.instance, time.Since(t0).Round(time.Millisecond), b.dataSock)
	return nil
}

func (b *bench) down() {
	if b.dev == nil {
		return
	}
	if b.ws != "" {
		b.kibo(2*time.Minute, "workspace", "delete", b.ws, "--force")
	}
	select {
	case <-b.devDone:
	default:
		b.dev.Process.Signal(syscall.SIGINT)
		select {
		case <-b.devDone:
		case <-time.After(30 * time.Second):
			b.dev.Process.Kill()
			<-b.devDone
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(b.bin, "kibotos"), "dev", "down", "--data-dir", b.dir, "--purge")
	cmd.Env = hostprobe.CleanEnv()
	out, err := cmd.CombinedOutput()
	fmt.Printf("kibotos dev down --purge: %s %v\n", strings.TrimSpace(string(out)), errOrNil(err))
	b.dev = nil
	b.releasePorts()
}

func errOrNil(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// ---- CPU accounting ----

type procCPU struct {
	name string
	pid  int
	tid  int // 0: the whole process
}

// vmProcs finds the VMM of the Instance and, with dp, the data-plane
// process (read-only: their CPU time is all this looks at).
func (b *bench) vmProcs(dp bool) func() []procCPU {
	var qemu, plane int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cl := string(raw)
		switch {
		case strings.Contains(cl, b.dataSock) && strings.Contains(cl, "microvm"):
			qemu = pid
		case strings.Contains(cl, "dataplane\x00--socket-dir") && strings.Contains(cl, b.tmp):
			plane = pid
		}
	}
	return func() []procCPU {
		ps := []procCPU{{name: "bench", pid: os.Getpid()}}
		if qemu != 0 {
			ps = append(ps, procCPU{name: "qemu", pid: qemu})
			tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", qemu))
			for _, t := range tasks {
				tid, _ := strconv.Atoi(t.Name())
				// Threads are unnamed: all but the main loop are the
				// vCPU (TCG) and I/O workers.
				if tid != qemu {
					ps = append(ps, procCPU{name: "qemu-threads", pid: qemu, tid: tid})
				}
			}
		}
		if dp && plane != 0 {
			ps = append(ps, procCPU{name: "dataplane", pid: plane})
		}
		return ps
	}
}

type cpuSnap map[string]float64

func snapshot(procs func() []procCPU) cpuSnap {
	s := cpuSnap{}
	for _, p := range procs() {
		path := fmt.Sprintf("/proc/%d/stat", p.pid)
		if p.tid != 0 {
			path = fmt.Sprintf("/proc/%d/task/%d/stat", p.pid, p.tid)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		s[p.name] += (ut + st) / 100 // USER_HZ
	}
	return s
}

func cpuDelta(a, b cpuSnap, d time.Duration) string {
	var parts []string
	for _, k := range []string{"bench", "bench+agent", "qemu", "qemu-threads", "dataplane", "guest-user", "guest-sys", "guest-irq", "agent-user", "agent-sys"} {
		if v, ok := b[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", k, 100*(v-a[k])/d.Seconds()))
		}
	}
	return "cpu: " + strings.Join(parts, ", ")
}

// guestCPU reads the guest's CPU split (/proc/stat) and the agent's
// (PID 1) with ReadFile; nothing on loopback.
func (b *bench) guestCPU(e pathEnv) cpuSnap {
	s := cpuSnap{}
	if e.diskDir == "" {
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st, one bytes.Buffer
	if _, err := e.c.ReadFile(ctx, "/proc/stat", &st); err != nil {
		return s
	}
	if _, err := e.c.ReadFile(ctx, "/proc/1/stat", &one); err != nil {
		return s
	}
	line, _, _ := strings.Cut(st.String(), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq
	num := func(i int) float64 { v, _ := strconv.ParseFloat(f[i], 64); return v / 100 }
	if len(f) > 7 {
		s["guest-user"] = num(1) + num(2)
		s["guest-sys"] = num(3)
		s["guest-irq"] = num(6) + num(7)
	}
	raw := one.Bytes()
	if i := bytes.LastIndexByte(raw, ')'); i > 0 && i+2 < len(raw) {
		g := strings.Fields(string(raw[i+2:]))
		ut, _ := strconv.ParseFloat(g[11], 64)
		stt, _ := strconv.ParseFloat(g[12], 64)
		s["agent-user"], s["agent-sys"] = ut/100, stt/100
	}
	return s
}

// ---- report ----

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
