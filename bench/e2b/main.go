// Command e2b is the native side of bench/e2b.sh: the same operations as
// e2b.mjs makes through the official E2B SDK, made through the Go SDK
// (sdk/kibotos) against the same dev cluster, timed in this process (its
// start, Connect and the first data-plane call stay out of the figures,
// as the Node side's start and first API call do). Prints one JSON object:
//
//	{"path": "go", "op": "create"|"exec"|"upload", "ms": [...], "workspace": ID}
//
// Modes:
//
//	-op create -template T       create T, then Exec true: one figure (the
//	                             Workspace is left for the driver to delete)
//	-op exec -workspace ID -n N  N sequential Exec of true (-shell: of
//	                             /bin/bash -l -c true, the command line E2B's
//	                             commands.run('true') starts)
//	-op upload -workspace ID -n N -size BYTES   N Files.WriteFile of BYTES
//	-op upload-e2b ...           N of the request files.write sends (POST
//	                             /files, multipart, through
//	                             E2B_SANDBOX_URL), from Go's HTTP client:
//	                             the E2B path without the Node SDK; takes
//	                             E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY
//	                             and NODE_EXTRA_CA_CERTS (dev's e2b.env)
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/sdk/kibotos"
)

type result struct {
	Path      string    `json:"path"`
	Op        string    `json:"op"`
	Cmd       string    `json:"cmd,omitempty"`
	MS        []float64 `json:"ms"`
	Workspace string    `json:"workspace"`
}

func main() {
	apiURL := flag.String("api-url", "", "https://HOST:PORT of the dev cluster's API listener")
	tokenFile := flag.String("token-file", "", "file holding the API key (kibotos dev's api-key)")
	caFile := flag.String("ca-file", "", "the cluster CA (tls/ca.crt of the dev data directory)")
	op := flag.String("op", "", "create, exec or upload")
	tmpl := flag.String("template", "e2b-base", "template of -op create")
	id := flag.String("workspace", "", "Workspace of -op exec and upload")
	n := flag.Int("n", 10, "timed operations of -op exec and upload")
	shell := flag.Bool("shell", false, "-op exec runs /bin/bash -l -c true instead of true")
	size := flag.Int("size", 10<<20, "bytes of each -op upload")
	dst := flag.String("path", "/home/user/go.bin", "guest file of -op upload")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, *apiURL, *tokenFile, *caFile, *op, *tmpl, *id, *n, *shell, *size, *dst)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/e2b:", err)
		os.Exit(1)
	}
	json.NewEncoder(os.Stdout).Encode(res)
}

func run(ctx context.Context, apiURL, tokenFile, caFile, op, tmpl, id string, n int, shell bool, size int, dst string) (*result, error) {
	raw, err := os.ReadFile(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("API key: %w (give -token-file, the dev data directory's api-key)", err)
	}
	c, err := kibotos.Connect(ctx, apiURL, strings.TrimSpace(string(raw)), &kibotos.Options{CAFile: caFile})
	if err != nil {
		return nil, err
	}
	res := &result{Path: "go", Op: op, Workspace: id}
	switch op {
	case "create":
		t0 := time.Now()
		// E2B's size of every sandbox, and a create's default one (the
		// size warm guests are kept at).
		ws, err := c.Workspaces.Create(ctx, kibotos.WorkspaceSpec{Template: tmpl, CPU: 1, Memory: 512 * kibotos.MiB})
		if err != nil {
			return nil, fmt.Errorf("create a Workspace of %s: %w", tmpl, err)
		}
		res.Workspace = ws.ID
		if err := execTrue(ctx, ws, []string{"true"}); err != nil {
			return nil, err
		}
		res.MS = append(res.MS, ms(time.Since(t0)))
		return res, nil
	case "exec":
		ws, err := c.Workspaces.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		argv := []string{"true"}
		if shell {
			argv = []string{"/bin/bash", "-l", "-c", "true"}
		}
		res.Cmd = strings.Join(argv, " ")
		return res, timed(res, n, func() error { return execTrue(ctx, ws, argv) })
	case "upload-e2b":
		data := make([]byte, size)
		rand.Read(data)
		write, err := e2bUpload(ctx, id, dst)
		if err != nil {
			return nil, err
		}
		res.Path, res.Cmd = "go-e2b", "POST /files"
		return res, timed(res, n, func() error { return write(data) })
	case "upload":
		ws, err := c.Workspaces.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		data := make([]byte, size)
		rand.Read(data)
		write := func() error { return ws.Files.WriteFile(ctx, dst, data, 0o644) }
		if err := timed(res, n, write); err != nil {
			return nil, err
		}
		// Every byte arrived: the figures are of whole uploads.
		fi, err := ws.Files.Stat(ctx, dst)
		if err != nil {
			return nil, err
		}
		if fi.Size != int64(size) {
			return nil, fmt.Errorf("workspace %s: %s holds %d bytes after the upload, not %d", id, dst, fi.Size, size)
		}
		return res, nil
	}
	return nil, fmt.Errorf("-op %q: want create, exec, upload or upload-e2b", op)
}

// e2bUpload is the upload of files.write to sandbox id's dst, made with
// Go's HTTP client: the sandbox's envd token from a connect, then each
// upload one POST /files of the data as the SDK sends a buffer, a
// multipart body (its octet-stream upload is for streams and gzip).
func e2bUpload(ctx context.Context, id, dst string) (func([]byte) error, error) {
	pem, err := os.ReadFile(os.Getenv("NODE_EXTRA_CA_CERTS"))
	if err != nil {
		return nil, fmt.Errorf("the CA of the E2B API: %w (source dev's e2b.env)", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	do := func(req *http.Request, out any) error {
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%s %s: %s %s", req.Method, req.URL.Path, resp.Status, body)
		}
		if out != nil {
			return json.Unmarshal(body, out)
		}
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, "POST", os.Getenv("E2B_API_URL")+"/sandboxes/"+id+"/connect", strings.NewReader("{}"))
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", os.Getenv("E2B_API_KEY"))
	req.Header.Set("Content-Type", "application/json")
	var sbx struct {
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := do(req, &sbx); err != nil {
		return nil, err
	}
	return func(data []byte) error {
		// A buffer goes as the SDK sends it: one multipart part, file.
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		part, err := mw.CreateFormFile("file", dst)
		if err != nil {
			return err
		}
		part.Write(data)
		mw.Close()
		req, err := http.NewRequestWithContext(ctx, "POST", os.Getenv("E2B_SANDBOX_URL")+"/files?username=user&path="+url.QueryEscape(dst), &body)
		if err != nil {
			return err
		}
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "49983")
		req.Header.Set("X-Access-Token", sbx.EnvdAccessToken)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		return do(req, nil)
	}, nil
}

// timed runs f once untimed (the first call pays for what a long-running
// program pays once), then n times, each figure in res.MS.
func timed(res *result, n int, f func() error) error {
	if err := f(); err != nil {
		return err
	}
	for range n {
		t0 := time.Now()
		if err := f(); err != nil {
			return err
		}
		res.MS = append(res.MS, ms(time.Since(t0)))
	}
	return nil
}

func execTrue(ctx context.Context, ws *kibotos.Workspace, argv []string) error {
	r, err := ws.Exec(ctx, argv, nil)
	if err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return errors.New("workspace " + ws.ID + ": " + strings.Join(argv, " ") + " exited " + fmt.Sprint(r.ExitCode))
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
