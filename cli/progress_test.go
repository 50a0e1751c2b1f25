package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/internal/testenv"
)

// On a terminal, template publish shows how far the node's upload into
// the artifact store is, as the node counts it (here node-2's image is a
// FIFO the test feeds, so the upload is caught half done); once it is
// done the node lists nothing under the publish any more.
func TestPublishProgressBar(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, Artifacts: t.TempDir()})
	n2 := e.c.Members[1]
	tp := buildOn(t, n2, "slow")
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		n2.Agent.PushReport()
		n, err := e.c.Node(e.c.Members[0], "node-2")
		return err == nil && len(n.Report.Templates) == 1, "template not reported yet"
	})
	if err := os.Remove(tp.Image()); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(tp.Image(), 0o600); err != nil {
		t.Fatal(err)
	}

	master, slave := openPTY(t)
	var screen testenv.Buffer
	go io.Copy(&screen, master)
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	go func() {
		var out strings.Builder
		devnull, _ := os.Open(os.DevNull)
		defer devnull.Close()
		code := Main(context.Background(), "kibo", []string{"--data-dir", e.dataDir, "template", "publish", "slow"}, devnull, &out, slave)
		done <- result{out.String(), code}
	}()
	fifo, err := os.OpenFile(tp.Image(), os.O_WRONLY, 0) // once node-2 opened it
	if err != nil {
		t.Fatal(err)
	}
	defer fifo.Close()
	chunk := make([]byte, 3<<20)
	if _, err := fifo.Write(chunk); err != nil {
		t.Fatal(err)
	}
	clustertest.WaitFor(t, 20*time.Second, func() (bool, string) {
		s := screen.String()
		return strings.Contains(s, "template slow: template publish") && strings.Contains(s, formatBytes(3<<20)+"/"), s
	})
	if _, ok := n2.Agent.Progress(api.TemplatePublishProgressKey("slow")); !ok {
		t.Fatal("node-2 lists no publish of slow while it uploads")
	}
	if _, err := fifo.Write(chunk[:1<<20]); err != nil {
		t.Fatal(err)
	}
	fifo.Close()
	r := <-done
	if r.code != 0 || !strings.Contains(r.out, "template slow published from node node-2") {
		t.Fatalf("publish: exit %d, %q; terminal:\n%s", r.code, r.out, screen.String())
	}
	if p, ok := n2.Agent.Progress(api.TemplatePublishProgressKey("slow")); ok {
		t.Fatalf("node-2 still lists the publish once it is done: %+v", p)
	}
	t.Logf("terminal: %q", screen.String())
	if e := e.catalogEntry("slow"); e == nil || e.SizeBytes != 4<<20 {
		t.Fatalf("catalog entry after the publish: %+v, want 4 MiB", e)
	}
}

// openPTY is a pseudo-terminal: what the CLI writes to slave is read from
// master.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slave.Close() })
	return master, slave
}
