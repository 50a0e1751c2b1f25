//go:build sdkexamples

// The examples run against a cluster: go test -tags sdkexamples with
// KIBOTOS_API_URL, KIBOTOS_TOKEN (an API key of role sandbox),
// KIBOTOS_CA_FILE (the cluster CA) and KIBOTOS_TEMPLATE (a Template of
// the catalog with /bin/sh). Each makes its own Workspaces and deletes
// them.

package kibotos_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/kibotos/kibotos/sdk/kibotos"
)

// exampleConnect connects with the environment the examples run in.
func exampleConnect(ctx context.Context) *kibotos.Client {
	c, err := kibotos.Connect(ctx, os.Getenv("KIBOTOS_API_URL"), os.Getenv("KIBOTOS_TOKEN"),
		&kibotos.Options{CAFile: os.Getenv("KIBOTOS_CA_FILE")})
	if err != nil {
		log.Fatal(err)
	}
	return c
}

// exampleSpec is a small Workspace of the examples' Template that ends
// itself if an example dies before it deletes it.
func exampleSpec() kibotos.WorkspaceSpec {
	return kibotos.WorkspaceSpec{
		Template: os.Getenv("KIBOTOS_TEMPLATE"),
		CPU:      1,
		Memory:   512 * kibotos.MiB,
		Timeout:  15 * time.Minute,
		Labels:   map[string]string{"made-by": "sdk-example"},
	}
}

// A Workspace's whole life: create, run a command, move a file in and
// out, move its end, delete.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := exampleConnect(ctx)

	ws, err := c.Workspaces.Create(ctx, exampleSpec())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("state:", ws.State)

	res, err := ws.Exec(ctx, []string{"sh", "-c", "echo hello"}, &kibotos.ExecOptions{Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code:", res.ExitCode)

	if err := ws.Files.WriteFile(ctx, "/tmp/greeting.txt", []byte("hello from a file\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	data, err := ws.Files.Read(ctx, "/tmp/greeting.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(data))

	if err := ws.SetTimeout(ctx, 2*time.Hour); err != nil {
		log.Fatal(err)
	}
	ends := time.Until(ws.EndsAt)
	fmt.Println("timeout:", ws.Timeout, "ends in 2h at most:", !ws.EndsAt.IsZero() && ends <= 2*time.Hour)

	if err := ws.Delete(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = c.Workspaces.Get(ctx, ws.ID)
	fmt.Println("gone:", errors.Is(err, kibotos.ErrNotFound))
	// Output:
	// state: AVAILABLE
	// hello
	// exit code: 0
	// hello from a file
	// timeout: 2h0m0s ends in 2h at most: true
	// gone: true
}

// A command's exit status and its two output streams.
func ExampleWorkspace_Exec() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := exampleConnect(ctx)
	ws, err := c.Workspaces.Create(ctx, exampleSpec())
	if err != nil {
		log.Fatal(err)
	}
	defer ws.Delete(context.WithoutCancel(ctx))

	var stdout, stderr strings.Builder
	res, err := ws.Exec(ctx, []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, &kibotos.ExecOptions{
		Stdout: &stdout, Stderr: &stderr, Stdin: strings.NewReader("unused\n"),
		Env: []string{"GREETING=hi"}, Dir: "/tmp",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d, stdout %q, stderr %q\n", res.ExitCode, stdout.String(), stderr.String())

	res, err = ws.Exec(ctx, []string{"sh", "-c", `cat; echo "$GREETING from $(pwd)"`}, &kibotos.ExecOptions{
		Stdout: os.Stdout, Stdin: strings.NewReader("piped in\n"), Env: []string{"GREETING=hi"}, Dir: "/tmp",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", res.ExitCode)

	_, err = ws.Exec(ctx, []string{"no-such-command"}, nil)
	fmt.Println("not found:", errors.Is(err, kibotos.ErrNotFound))
	// Output:
	// exit 3, stdout "out\n", stderr "err\n"
	// piped in
	// hi from /tmp
	// exit 0
	// not found: true
}

// Files in and out of a Workspace, and a directory's entries.
func ExampleFiles_List() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := exampleConnect(ctx)
	ws, err := c.Workspaces.Create(ctx, exampleSpec())
	if err != nil {
		log.Fatal(err)
	}
	defer ws.Delete(context.WithoutCancel(ctx))

	if _, err := ws.Exec(ctx, []string{"mkdir", "-p", "/tmp/example/sub"}, nil); err != nil {
		log.Fatal(err)
	}
	for name, body := range map[string]string{"a.txt": "a", "b c.txt": "two words", ".hidden": "dot"} {
		if err := ws.Files.WriteFile(ctx, "/tmp/example/"+name, []byte(body), 0o600); err != nil {
			log.Fatal(err)
		}
	}
	entries, err := ws.Files.List(ctx, "/tmp/example")
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			fmt.Printf("%s/\n", e.Name)
		} else {
			fmt.Printf("%s: %d bytes, mode %v\n", e.Name, e.Size, e.Mode)
		}
	}
	_, err = ws.Files.Read(ctx, "/tmp/example/missing")
	fmt.Println("missing:", errors.Is(err, kibotos.ErrNotFound))
	// Output:
	// .hidden: 3 bytes, mode -rw-------
	// a.txt: 1 bytes, mode -rw-------
	// b c.txt: 9 bytes, mode -rw-------
	// sub/
	// missing: true
}

// Pause keeps a Workspace's memory; a fork goes on from the same point.
func ExampleWorkspace_Fork() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := exampleConnect(ctx)
	ws, err := c.Workspaces.Create(ctx, exampleSpec())
	if err != nil {
		log.Fatal(err)
	}
	defer ws.Delete(context.WithoutCancel(ctx))
	if err := ws.Files.WriteFile(ctx, "/root/note.txt", []byte("written before the pause\n"), 0o644); err != nil {
		log.Fatal(err)
	}

	if err := ws.Pause(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("paused:", ws.State)
	fork, err := ws.Fork(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer fork.Delete(context.WithoutCancel(ctx))
	note, err := fork.Files.Read(ctx, "note.txt") // relative: under /root
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print("fork reads: ", string(note))

	if err := ws.Resume(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("resumed:", ws.State)
	// Output:
	// paused: PAUSED
	// fork reads: written before the pause
	// resumed: AVAILABLE
}

// Errors name their class: a Workspace of another namespace, or none, is
// not found.
func ExampleError() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := exampleConnect(ctx)
	_, err := c.Workspaces.Get(ctx, "ws-does-not-exist")
	var e *kibotos.Error
	if errors.As(err, &e) {
		fmt.Println("code:", e.Code, "exit code:", e.ExitCode(), "not found:", errors.Is(err, kibotos.ErrNotFound))
	}
	// Output:
	// code: not_found exit code: 12 not found: true
}
