package guest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A stop the guest cannot prepare leaves the guest running and says why
// in the seed's words: a retained filesystem that cannot be frozen (a
// tmpfs mounted over the Volume), then a process stuck in the kernel on a
// frozen filesystem (deadline_exceeded). Once nothing is in the way the
// same agent stops: the disk's filesystem frozen, the guest powered off.
func TestStopPrepare(t *testing.T) {
	dev, _ := loopDisk(t, 16<<20)
	sys := fakeSys(t, map[string]string{filepath.Base(dev): "vol-1"})
	var powerOffs atomic.Int32
	h := startAgent(t, Options{SysRoot: sys, DiskWait: 2 * time.Second, PowerOff: func() error {
		powerOffs.Add(1)
		return nil
	}})
	c := h.dial()
	ctx := ctxT(t)
	target := filepath.Join(t.TempDir(), "rootfs", "data")
	t.Cleanup(func() {
		freeze(target, false)
		for unix.Unmount(target, unix.MNT_DETACH) == nil {
		}
	})
	m := guestproto.Mount{Source: "serial:vol-1", Target: target, FSType: "ext4"}
	if err := c.Configure(ctx, guestproto.ConfigureRequest{Mounts: []guestproto.Mount{m}}); err != nil {
		t.Fatalf("mount by serial: %v", err)
	}
	if !c.Info().Has(guestproto.CapStopPrepare) {
		t.Fatalf("capabilities %v lack %s", c.Info().Capabilities, guestproto.CapStopPrepare)
	}

	// The Volume's mount point moved away from where it was mounted: it
	// cannot even be opened to sync.
	root := filepath.Dir(target)
	if err := os.Rename(root, root+".moved"); err != nil {
		t.Fatal(err)
	}
	_, err := c.Stop(ctx, 100*time.Millisecond)
	if err := os.Rename(root+".moved", root); err != nil {
		t.Fatal(err)
	}
	if ge := guestErr(err); ge == nil || ge.Code != guestproto.CodeFailed || !strings.HasPrefix(ge.Message, "retained filesystem sync failed: "+target+": ") {
		t.Fatalf("stop with the Volume's mount point moved: %v; want retained filesystem sync failed", err)
	}

	// Something mounted over the Volume that cannot be frozen.
	if err := unix.Mount("tmpfs", target, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	_, err = c.Stop(ctx, 100*time.Millisecond)
	if ge := guestErr(err); ge == nil || ge.Code != guestproto.CodeFailed || !strings.HasPrefix(ge.Message, "retained filesystem freeze failed: "+target+": ") {
		t.Fatalf("stop with a tmpfs over the Volume: %v; want retained filesystem freeze failed", err)
	}
	if r, _, _ := run(t, c, nil, "echo", "alive"); r != "alive\n" || powerOffs.Load() != 0 {
		t.Fatalf("after a stop that was not prepared: exec %q, %d poweroffs; want the guest running", r, powerOffs.Load())
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}

	// A process writing to the frozen filesystem is stuck in the kernel:
	// neither SIGTERM nor SIGKILL ends it.
	if err := freeze(target, true); err != nil {
		t.Fatal(err)
	}
	stuck, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sh", "-c", "echo x > " + filepath.Join(target, "f")}})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the writer blocked on the frozen filesystem", func() (bool, string) {
		st := testenv.ProcState(stuck.PID)
		return st == "D", fmt.Sprintf("process state %q", st)
	})
	_, err = c.Stop(ctx, 100*time.Millisecond)
	if ge := guestErr(err); ge == nil || ge.Code != guestproto.CodeDeadlineExceeded || !strings.Contains(ge.Message, "1 managed processes did not end") {
		t.Fatalf("stop with a process stuck on a frozen filesystem: %v; want deadline_exceeded", err)
	}
	if powerOffs.Load() != 0 {
		t.Fatal("the guest powered off after a stop that was not prepared")
	}
	// Thawed, the writer meets the signals sent to it.
	if err := freeze(target, false); err != nil {
		t.Fatal(err)
	}
	if exit, err := stuck.Wait(); err != nil || exit.Signal == 0 {
		t.Fatalf("the writer after the thaw: %+v, %v", exit, err)
	}
	res, err := c.Stop(ctx, 100*time.Millisecond)
	if err != nil || len(res.Frozen) != 1 || res.Frozen[0] != target {
		t.Fatalf("stop with nothing in the way: %+v, %v; want %s frozen", res, err, target)
	}
	if err := freeze(target, false); err != nil {
		t.Errorf("thaw after the stop (was it frozen?): %v", err)
	}
	select {
	case <-h.done:
		h.done <- nil
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after Stop")
	}
	if powerOffs.Load() != 1 {
		t.Fatalf("poweroff called %d times, want 1", powerOffs.Load())
	}
}

// A prepared stop powers the guest off only once the node has read the
// answer (it closes the call's stream): powering off at once could lose
// the answer in the guest's transmit queue, and the node would see its
// connection end with no answer, as after a crash. Here the node's reads
// are held back after the answer was written; the guest waits for them.
func TestStopAnswerReadBeforePowerOff(t *testing.T) {
	var powerOffs atomic.Int32
	h := startAgent(t, Options{PowerOff: func() error {
		powerOffs.Add(1)
		return nil
	}})
	conn := &heldConn{Conn: h.plug()}
	c := h.dialOn(conn)
	ctx := ctxT(t)

	release := conn.hold()
	t.Cleanup(release) // a failed test must not leave the node's reads held
	stopped := make(chan error, 1)
	go func() {
		_, err := c.Stop(ctx, 100*time.Millisecond)
		stopped <- err
	}()
	testenv.WaitFor(t, 20*time.Second, "the stop's answer written", func() (bool, string) {
		return strings.Contains(h.logs.String(), "waiting for the node to read the answer"), ""
	})
	if n := powerOffs.Load(); n != 0 {
		t.Fatalf("the guest powered off (%d) before the node read the stop's answer", n)
	}
	release()
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	testenv.WaitFor(t, 20*time.Second, "the poweroff after the node read the answer", func() (bool, string) {
		n := powerOffs.Load()
		return n == 1, fmt.Sprintf("%d poweroffs", n)
	})
}

// heldConn is a node-side connection whose reads can be held back: what
// arrives while held is read from the socket but returned only once
// released.
type heldConn struct {
	net.Conn
	gate atomic.Pointer[chan struct{}]
}

func (c *heldConn) hold() (release func()) {
	ch := make(chan struct{})
	c.gate.Store(&ch)
	return sync.OnceFunc(func() { close(ch) })
}

func (c *heldConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if g := c.gate.Load(); g != nil {
		<-*g
	}
	return n, err
}
