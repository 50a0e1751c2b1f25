package dataplane

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// benchClients returns a guest client straight on a guest agent's socket and
// one through the data plane to another agent (a data socket takes one
// client at a time).
func benchClients(b *testing.B) (direct, viaDP *guestproto.Client) {
	dir := b.TempDir()
	conn, err := net.Dial("unix", startGuest(b, dir, "direct"))
	if err != nil {
		b.Fatal(err)
	}
	direct, err = guestproto.Dial(ctxT(b), conn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { direct.Close() })
	p := newPKI(b, "node-a")
	s := startServer(b, time.Second)
	s.push(b, p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: startGuest(b, dir, "relayed")}))
	return direct, connect(b, p, p.cred(b, s.Addr(), "ws-a", "inst-1"))
}

func execTrue(b *testing.B, c *guestproto.Client) {
	p, err := c.Exec(context.Background(), guestproto.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, p.Stdout)
	io.Copy(io.Discard, p.Stderr)
	if exit, err := p.Wait(); err != nil || exit.ExitCode != 0 {
		b.Fatalf("true: %+v, %v", exit, err)
	}
}

// BenchmarkExecTrue is one exec round trip (start, stdio, exit) of `true`.
func BenchmarkExecTrue(b *testing.B) {
	direct, viaDP := benchClients(b)
	for _, bc := range []struct {
		name string
		c    *guestproto.Client
	}{{"direct", direct}, {"dataplane", viaDP}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				execTrue(b, bc.c)
			}
		})
	}
}

// BenchmarkFile writes a 16 MiB file and reads it back; bytes/op counts both.
func BenchmarkFile(b *testing.B) {
	direct, viaDP := benchClients(b)
	const size = 16 << 20
	data := make([]byte, size)
	rand.NewChaCha8([32]byte{3}).Read(data)
	path := filepath.Join(b.TempDir(), "f")
	for _, bc := range []struct {
		name string
		c    *guestproto.Client
	}{{"direct", direct}, {"dataplane", viaDP}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(2 * size)
			for b.Loop() {
				if _, err := bc.c.WriteFile(context.Background(), path, 0o600, bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
				if _, err := bc.c.ReadFile(context.Background(), path, io.Discard); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
