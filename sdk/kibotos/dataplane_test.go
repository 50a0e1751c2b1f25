package kibotos_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/sdk/kibotos"
	"github.com/kibotos/kibotos/trust"
	"github.com/kibotos/kibotos/vmm/guest"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// fakeNode is a node's data plane with its guest, in this process: a TLS
// listener with a data-plane certificate of its own cluster CA that takes
// one credential and then hands the connection to a real guest agent,
// which serves a directory of this host as the Workspace's root.
type fakeNode struct {
	caPEM []byte
	addr  string
	root  string
	// connects counts the credentials presented.
	connects atomic.Int32
}

const testCredential = "credential-of-ws-1"

func newFakeNode(t *testing.T) *fakeNode {
	t.Helper()
	ca, err := trust.NewCA("test-cluster")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.IssueKeyPair(trust.Identity{ClusterID: "test-cluster", Kind: trust.KindDataPlane, NodeID: "node-a"}, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{dataplane.ALPN}, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{caPEM: ca.CertPEM, addr: ln.Addr().String(), root: workspaceTree(t)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { n.serve(ctx, conn) })
		}
	})
	return n
}

// serve takes the credential, then lets the guest agent serve conn until
// the client leaves and ctx ends.
func (n *fakeNode) serve(ctx context.Context, conn net.Conn) {
	var req struct {
		Credential string `json:"credential"`
	}
	if err := guestproto.ReadFrame(conn, &req); err != nil {
		conn.Close()
		return
	}
	n.connects.Add(1)
	if req.Credential != testCredential {
		guestproto.WriteFrame(conn, map[string]string{"code": "invalid", "message": "credential not valid"})
		conn.Close()
		return
	}
	if err := guestproto.WriteFrame(conn, map[string]bool{"ok": true}); err != nil {
		conn.Close()
		return
	}
	first := true
	guest.Serve(ctx, func() (io.ReadWriteCloser, error) {
		if first {
			first = false
			return conn, nil
		}
		<-ctx.Done() // one client per connection, as a data plane relays
		return nil, ctx.Err()
	}, guest.Options{})
}

// workspaceTree is a root for the guest: a static busybox as /bin/sh and
// the few commands the tests run, and /tmp.
func workspaceTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		testenv.Skipf(t, "no busybox to run in the test's Workspace root (apt-get install busybox-static)")
		return root
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"bin", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "cat", "sleep", "mkdir", "pwd"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// connectToNode is a client of an API fake whose Workspace ws-1 runs on
// node n, trusting the API's and the node's CA, and Workspace ws-1.
func connectToNode(t *testing.T, n *fakeNode, extraCA []byte) *kibotos.Workspace {
	t.Helper()
	testenv.RequireRoot(t, "the guest agent chroots a command into the Workspace's root")
	t.Cleanup(kibotos.SetWorkspaceRoot(n.root))
	f := newFakeAPI(t)
	f.handle("GET /v1/workspaces/ws-1", (&stateScript{states: []string{api.WorkspaceAvailable}}).get)
	f.handle("POST /v1/workspaces/ws-1/credentials", func(*http.Request, []byte) (int, http.Header, any) {
		return 200, nil, api.DataPlaneCredential{WorkspaceID: "ws-1", NodeID: "node-a", InstanceID: "i-1", Address: n.addr,
			Credential: testCredential, ExpiresAt: time.Now().Add(10 * time.Minute)}
	})
	c, err := kibotos.Connect(context.Background(), f.srv.URL, testKey, &kibotos.Options{CAPEM: append(f.caPEM(), extraCA...)})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := c.Workspaces.Get(context.Background(), "ws-1")
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

func TestExecStreamsOutputAndReturnsTheExitCode(t *testing.T) {
	n := newFakeNode(t)
	ws := connectToNode(t, n, n.caPEM)
	ctx := context.Background()

	var stdout, stderr safeBuffer
	res, err := ws.Exec(ctx, []string{"sh", "-c", `echo out; echo err >&2; cat; echo "$GREETING from $(pwd)"; exit 3`}, &kibotos.ExecOptions{
		Stdout: &stdout, Stderr: &stderr, Stdin: strings.NewReader("piped in\n"), Env: []string{"GREETING=hi"}, Dir: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || stdout.String() != "out\npiped in\nhi from /tmp\n" || stderr.String() != "err\n" {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q; want 3, the output with stdin and env, and err", res.ExitCode, stdout.String(), stderr.String())
	}

	// One writer for both streams takes one Write at a time (-race).
	var both safeBuffer
	if _, err := ws.Exec(ctx, []string{"sh", "-c", "for i in 1 2 3 4 5; do echo o; echo e >&2; done"}, &kibotos.ExecOptions{Stdout: &both, Stderr: &both}); err != nil {
		t.Fatal(err)
	}
	if len(both.String()) != 20 {
		t.Errorf("both streams into one writer: %q; want 10 lines", both.String())
	}

	if _, err := ws.Exec(ctx, []string{"no-such-command"}, nil); !errors.Is(err, kibotos.ErrNotFound) {
		t.Errorf("exec of a command not in PATH: %v; want ErrNotFound", err)
	}
	if _, err := ws.Exec(ctx, []string{"/no/such/program"}, nil); !errors.Is(err, kibotos.ErrFailedPrecondition) {
		t.Errorf("exec of a program that cannot start: %v; want ErrFailedPrecondition", err)
	}
}

func TestEndingTheContextKillsTheCommand(t *testing.T) {
	n := newFakeNode(t)
	ws := connectToNode(t, n, n.caPEM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The first output says the command runs: then ctx ends.
	started := writerFunc(func(b []byte) (int, error) { cancel(); return len(b), nil })
	start := time.Now()
	_, err := ws.Exec(ctx, []string{"sh", "-c", "echo $$ > /tmp/pid; echo started; exec sleep 60"}, &kibotos.ExecOptions{Stdout: started})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("exec whose context ended: %v; want context.Canceled", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("exec returned %v after its context ended; want at once", d)
	}
	// The guest here is this host: its process is ours to look at.
	b, err := os.ReadFile(filepath.Join(n.root, "tmp", "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the command to be killed", func() (bool, string) {
		err := syscall.Kill(pid, 0)
		return errors.Is(err, syscall.ESRCH), fmt.Sprintf("kill(%d, 0): %v", pid, err)
	})
}

func TestFilesWriteReadStatAndList(t *testing.T) {
	n := newFakeNode(t)
	ws := connectToNode(t, n, n.caPEM)
	ctx := context.Background()

	if err := ws.Files.WriteFile(ctx, "/tmp/a.txt", []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ws.Files.WriteFile(ctx, "note", []byte("in root's home"), 0); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(n.root, "root", "note")); err != nil || string(b) != "in root's home" {
		t.Fatalf("a relative path: %q, %v; want the file under /root", b, err)
	}
	data, err := ws.Files.Read(ctx, "/tmp/a.txt")
	if err != nil || string(data) != "hello" {
		t.Fatalf("Read: %q, %v", data, err)
	}
	fi, err := ws.Files.Stat(ctx, "/tmp/a.txt")
	if err != nil || fi.Size != 5 || fi.Mode.Perm() != 0o600 || fi.Path != "/tmp/a.txt" || fi.Name != "a.txt" {
		t.Fatalf("Stat: %+v, %v; want 5 bytes, 0600, its Workspace path", fi, err)
	}
	if err := os.Mkdir(filepath.Join(n.root, "tmp", "sub dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	list, err := ws.Files.List(ctx, "/tmp")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "a.txt" || list[0].Size != 5 || list[1].Name != "sub dir" || !list[1].IsDir() {
		t.Fatalf("List /tmp: %+v; want a.txt (5 bytes) and the directory sub dir", list)
	}
	if _, err := ws.Files.Read(ctx, "/tmp/missing"); !errors.Is(err, kibotos.ErrNotFound) {
		t.Errorf("Read of a missing file: %v; want ErrNotFound", err)
	}
	if err := ws.Files.WriteFile(ctx, "/nodir/x", []byte("x"), 0); !errors.Is(err, kibotos.ErrNotFound) {
		t.Errorf("Write under a missing directory: %v; want ErrNotFound", err)
	}
	if _, err := ws.Files.List(ctx, "/tmp/a.txt"); !errors.Is(err, kibotos.ErrInvalidArgument) {
		t.Errorf("List of a file: %v; want ErrInvalidArgument", err)
	}
}

func TestANodeTheClusterCADidNotIssueGetsNoCredential(t *testing.T) {
	n := newFakeNode(t)
	ws := connectToNode(t, n, otherCA(t))
	_, err := ws.Exec(context.Background(), []string{"true"}, nil)
	if !errors.Is(err, kibotos.ErrUnavailable) {
		t.Fatalf("exec through a data plane of another CA: %v; want refused", err)
	}
	if got := n.connects.Load(); got != 0 {
		t.Fatalf("the untrusted data plane received %d credentials; want none", got)
	}
}

// safeBuffer is a buffer the test reads while Exec may still write.
type safeBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
