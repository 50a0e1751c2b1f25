package qemu_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// bootTimeout bounds QEMU start → first console line of /init. Under TCG on
// the development machines it takes about 3 s.
const bootTimeout = 60 * time.Second

// requireBootHost skips (fails under KIBOTOS_REQUIRE_ALL=1), saying why on stderr, when this host cannot build
// and boot a Platform at all. Slowness is never a reason to skip.
func requireBootHost(t *testing.T) {
	t.Helper()
	var missing []string
	for tool, pkg := range map[string]string{qemu.DefaultBinary: "qemu-system-x86", "dpkg": "dpkg"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" (Debian package "+pkg+")")
		}
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root (apt-get download, depmod on the unpacked kernel)")
	}
	if len(missing) > 0 {
		testenv.Skipf(t, "missing %s", strings.Join(missing, ", "))
	}
}

// buildKibotos builds the kibotos executable the way a Platform needs it:
// static, no cgo.
func buildKibotos(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "kibotos")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "github.com/kibotos/kibotos")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build kibotos: %v\n%s", err, b)
	}
	return out
}

func TestBootPlatformUnderTCG(t *testing.T) {
	requireBootHost(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()

	bin := buildKibotos(t, dir)
	// The kernel .deb and its unpacked tree are kept between runs, keyed by
	// package and version inside; everything else lives in the test's dir.
	cache := filepath.Join(os.TempDir(), "kibotos-test-platform")
	t0 := time.Now()
	in, err := platform.Build(ctx, platform.Options{
		StorageRoot: filepath.Join(dir, "storage"),
		CacheDir:    cache,
		AgentBinary: bin,
		Logger:      slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("platform %s (kernel %s) ready in %v", in.ID, in.KernelVersion, time.Since(t0).Round(time.Millisecond))
	// The same inputs give the same bytes: a second build finds the first.
	again, err := platform.Build(ctx, platform.Options{StorageRoot: filepath.Join(dir, "storage"), CacheDir: cache, AgentBinary: bin})
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != in.ID || again.Dir != in.Dir || !again.CreatedAt.Equal(in.CreatedAt) {
		t.Fatalf("rebuild gave %s (%s, created %v), want the existing %s (created %v)", again.ID, again.Dir, again.CreatedAt, in.ID, in.CreatedAt)
	}
	if l, err := platform.List(filepath.Join(dir, "storage")); err != nil || len(l) != 1 || l[0].ID != in.ID {
		t.Fatalf("list: %v, %v", l, err)
	}

	choice, err := qemu.SelectAccel(qemu.AccelTCG, qemu.Host{})
	if err != nil {
		t.Fatal(err)
	}
	khz, err := qemu.Host{}.TSCKHz()
	if err != nil {
		t.Fatal(err)
	}
	console := filepath.Join(dir, "console.log")
	// Three small raw disks with serials: which vdX each becomes, that the
	// guest reads the serials back, and QMP block_resize of the last.
	var disks []qemu.Disk
	for _, serial := range []string{"layer", "scratch", "vol-0123456789abcdef"} {
		path := filepath.Join(dir, serial+".img")
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, 8<<20); err != nil {
			t.Fatal(err)
		}
		disks = append(disks, qemu.Disk{ID: "v-" + serial, Path: path, Serial: serial})
	}
	cfg := qemu.Config{
		Accel:      choice.Accel,
		TSCKHz:     khz,
		Kernel:     in.Kernel(),
		Initrd:     in.Initrd(),
		ConsoleLog: console,
		// The port name is the default of `kibotos guest-agent --port-name`.
		Channels:  []qemu.Channel{{Name: "kibotos.agent", Socket: filepath.Join(dir, "agent.sock")}},
		Disks:     disks,
		QMPSocket: filepath.Join(dir, "qmp.sock"),
	}
	argv, err := cfg.Argv()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s; %s", choice.Reason, strings.Join(argv, " "))

	var stderr bytes.Buffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// Only the process this test started, by its PID.
		cmd.Process.Kill()
		<-exited
	})

	bootTime, err := waitConsoleLine(console, platform.InitStartedLine, exited, bootTimeout)
	if err != nil {
		b, _ := os.ReadFile(console)
		t.Fatalf("%v\nqemu stderr: %s\nconsole tail:\n%s", err, stderr.String(), tail(b, 30))
	}
	t.Logf("boot (QEMU start → %s on the console): %v", platform.InitStartedLine, bootTime.Round(time.Millisecond))

	// The guest agent: handshake over the virtio-serial port, one exec, stop.
	actx, acancel := context.WithTimeout(ctx, bootTimeout)
	defer acancel()
	conn, err := net.Dial("unix", cfg.Channels[0].Socket)
	if err != nil {
		t.Fatalf("connect to the agent channel: %v", err)
	}
	c, err := guestproto.Dial(actx, conn)
	if err != nil {
		b, _ := os.ReadFile(console)
		t.Fatalf("guest agent handshake: %v\nconsole tail:\n%s", err, tail(b, 30))
	}
	defer c.Close()
	info := c.Info()
	t.Logf("agent answered %v after QEMU start: protocol %d, agent %s, boot id %s, capabilities %v",
		time.Since(start).Round(time.Millisecond), info.Protocol, info.AgentVersion, info.BootID, info.Capabilities)

	t1 := time.Now()
	p, err := c.Exec(actx, guestproto.ExecRequest{Argv: []string{"/bin/uname", "-r"}})
	if err != nil {
		t.Fatalf("exec uname: %v", err)
	}
	out, _ := io.ReadAll(p.Stdout)
	io.Copy(io.Discard, p.Stderr)
	exit, err := p.Wait()
	p.Close()
	if err != nil || exit.ExitCode != 0 {
		t.Fatalf("uname -r: exit %+v, %v", exit, err)
	}
	if got := strings.TrimSpace(string(out)); got != in.KernelVersion {
		t.Fatalf("guest runs kernel %q, the Platform says %q", got, in.KernelVersion)
	}
	t.Logf("exec uname -r in the guest: %q in %v", strings.TrimSpace(string(out)), time.Since(t1).Round(time.Millisecond))

	checkDisksAndResize(t, actx, c, cfg)

	t2 := time.Now()
	if _, err := c.Stop(actx, 2*time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		if err != nil {
			t.Fatalf("QEMU exit after the agent powered off: %v", err)
		}
		t.Logf("agent stop → QEMU exit 0: %v", time.Since(t2).Round(time.Millisecond))
		b, _ := os.ReadFile(console)
		t.Logf("console tail:\n%s", tail(b, 15))
	case <-time.After(30 * time.Second):
		t.Fatal("QEMU still running 30s after the agent's stop")
	}
}

// checkDisksAndResize finds cfg's disks in the guest by the serial each
// shows in /sys/block/vdX/serial, grows the last one through QMP and waits
// for the guest kernel to see its new capacity.
func checkDisksAndResize(t *testing.T, ctx context.Context, c *guestproto.Client, cfg qemu.Config) {
	t.Helper()
	// serial -> "vdX <512-byte sectors>", polled: virtio-mmio probing may
	// still be under way when the agent first answers.
	blocks := func() map[string]string {
		out := guestSh(t, ctx, c, `for d in /sys/block/vd*; do [ -e "$d" ] && echo "$(cat $d/serial) ${d##*/} $(cat $d/size)"; done; true`)
		m := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) == 3 {
				m[f[0]] = f[1] + " " + f[2]
			}
		}
		return m
	}
	var m map[string]string
	testenv.WaitFor(t, 10*time.Second, "every disk in /sys/block", func() (bool, string) {
		m = blocks()
		return len(m) == len(cfg.Disks), fmt.Sprintf("%v", m)
	})
	var order []string
	for _, d := range cfg.Disks {
		f := strings.Fields(m[d.Serial])
		if len(f) != 2 || f[1] != "16384" {
			t.Fatalf("disk %s (serial %s): guest shows %q; want a vdX of 16384 sectors (8 MiB); all: %v", d.ID, d.Serial, m[d.Serial], m)
		}
		order = append(order, d.Serial+"="+f[0])
	}
	t.Logf("guest names the disks given in this order: %s", strings.Join(order, " "))

	last := cfg.Disks[len(cfg.Disks)-1]
	dev := strings.Fields(m[last.Serial])[0]
	t0 := time.Now()
	q, err := qemu.DialQMP(ctx, cfg.QMPSocket)
	if err != nil {
		t.Fatal(err)
	}
	err = q.BlockResize(ctx, last.ID, 24<<20)
	q.Close()
	if err != nil {
		t.Fatal(err)
	}
	tResize := time.Since(t0)
	if fi, err := os.Stat(last.Path); err != nil || fi.Size() != 24<<20 {
		t.Fatalf("image %s after block_resize to 24 MiB: %v, %v", last.Path, fi, err)
	}
	seen := testenv.WaitFor(t, 10*time.Second, dev+" at 24 MiB in the guest", func() (bool, string) {
		size := strings.TrimSpace(guestSh(t, ctx, c, "cat /sys/block/"+dev+"/size"))
		return size == "49152", size + " sectors"
	})
	t.Logf("QMP block_resize of %s to 24 MiB: %v; guest /sys/block/%s/size showed it %v later",
		last.ID, tResize.Round(time.Millisecond), dev, seen.Round(time.Millisecond))
	// An unknown drive is QEMU's error, named after the command.
	q, err = qemu.DialQMP(ctx, cfg.QMPSocket)
	if err != nil {
		t.Fatalf("dial QMP a second time (one client at a time, the first closed): %v", err)
	}
	defer q.Close()
	var qe *qemu.QMPError
	if err := q.BlockResize(ctx, "v-nope", 24<<20); !errors.As(err, &qe) {
		t.Fatalf("block_resize of an unknown drive: %v; want a QMPError", err)
	}
}

// guestSh runs script under the initramfs's busybox sh and returns stdout.
func guestSh(t *testing.T, ctx context.Context, c *guestproto.Client, script string) string {
	t.Helper()
	p, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var errb bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&errb, p.Stderr); close(done) }()
	out, _ := io.ReadAll(p.Stdout)
	<-done
	if exit, err := p.Wait(); err != nil || exit.ExitCode != 0 {
		t.Fatalf("guest sh -c %q: exit %+v, %v: %s", script, exit, err, errb.String())
	}
	return string(out)
}

// waitConsoleLine polls the console log for line until timeout, or until
// QEMU exits (exited gets the error back for whoever waits next).
func waitConsoleLine(console, line string, exited chan error, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	deadline := time.After(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	seen := func() bool {
		b, _ := os.ReadFile(console)
		return bytes.Contains(b, []byte(line))
	}
	for {
		select {
		case err := <-exited:
			exited <- err
			if seen() {
				return 0, fmt.Errorf("guest printed %q, then QEMU exited (%v): the guest agent died", line, err)
			}
			return 0, fmt.Errorf("QEMU exited before /init ran: %v", err)
		case <-deadline:
			return 0, fmt.Errorf("no %q on the console within %v", line, timeout)
		case <-tick.C:
			if seen() {
				return time.Since(start), nil
			}
		}
	}
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// testWriter sends the build log to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
