package e2e

// A template built from an OCI image (a docker save tarball the test
// makes from the host's static busybox) in the one-host dev cluster of
// TestWorkspace: its layers are flattened with their whiteouts and its
// config's Env, WorkingDir and User are what workspace exec runs with.
// One VM boot.

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
)

// ociLayer is a layer of the test image; entries are name -> content,
// with "->" starting a symbolic link's target and "/" ending a directory.
func (d *wsDev) ociLayer(entries [][2]string) v1.Layer {
	d.t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644, ModTime: time.Unix(1_700_000_000, 0)}
		switch {
		case strings.HasSuffix(e[0], "/"):
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		case strings.HasPrefix(e[1], "->"):
			h.Typeflag, h.Linkname = tar.TypeSymlink, strings.TrimPrefix(e[1], "->")
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e[1]))
			if strings.HasPrefix(e[0], "bin/") {
				h.Mode = 0o755
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			d.t.Fatal(err)
		}
		io.WriteString(tw, e[1])
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		d.t.Fatal(err)
	}
	return l
}

// testOCITemplate: template build --from-oci, a Workspace of it, and
// exec with the image's defaults; then both are deleted again.
func (d *wsDev) testOCITemplate(string) {
	t := d.t
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("the test image is made of the host's static busybox: %v", err)
	}
	base := [][2]string{{"bin/", ""}, {"bin/busybox", string(bb)}, {"etc/", ""}, {"tmp/", ""}, {"app/", ""},
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"},
		{"etc/group", "root:x:0:\napp:x:1000:\n"},
		{"app/a.txt", "alpha from the image\n"}, {"app/b.txt", "beta\n"}}
	for _, a := range []string{"sh", "cat", "env", "pwd", "id", "test"} {
		base = append(base, [2]string{"bin/" + a, "->busybox"})
	}
	img, err := mutate.AppendLayers(empty.Image, d.ociLayer(base), d.ociLayer([][2]string{{"app/.wh.b.txt", ""}, {"app/c.txt", "gamma\n"}}))
	if err == nil {
		img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "GREETING=hello-from-oci"}, WorkingDir: "/app", User: "app"})
	}
	archive := filepath.Join(d.tmp, "oci-app.tar")
	if err == nil {
		err = tarball.WriteToFile(archive, name.MustParseReference("oci-app:1"), img)
	}
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if r := d.kibo(2*time.Minute, nil, "template", "build", "oci-app", "--from-oci", archive); r.Code != 0 || !strings.HasPrefix(r.Stdout, "sha256-") {
		t.Fatalf("template build --from-oci: %s", r)
	}
	t.Logf("TIMING template build --from-oci: %s", time.Since(t0).Round(time.Millisecond))

	// The node reports its templates every second; until ctrl heard of
	// this one a create is refused.
	var id string
	t0 = time.Now()
	testenv.WaitFor(t, 5*time.Minute, "a Workspace of template oci-app", func() (bool, string) {
		r := d.kibo(3*time.Minute, nil, "workspace", "create", "--template", "oci-app", "--cpu", "1", "--memory", "256MiB", "-q")
		if r.Code == api.ExitFailedPrecondition || r.Code == api.ExitNotFound {
			return false, r.String()
		}
		if r.Code != 0 || !wsIDRe.MatchString(r.Stdout) {
			t.Fatalf("create of a Workspace of oci-app: %s", r)
		}
		id = strings.TrimSpace(r.Stdout)
		return true, ""
	})
	t.Logf("TIMING create of the OCI Workspace (to AVAILABLE): %s", time.Since(t0).Round(time.Millisecond))

	inWS := func(args ...string) clusterlab.Result {
		return d.kibo(time.Minute, nil, append([]string{"workspace", "exec", id}, args...)...)
	}
	if r := inWS("--", "cat", "/app/a.txt"); r.Code != 0 || r.Stdout != "alpha from the image\n" {
		t.Errorf("cat /app/a.txt: %s (stdout %q)", r, r.Stdout)
	}
	if r := inWS("--", "test", "!", "-e", "/app/b.txt"); r.Code != 0 {
		t.Errorf("/app/b.txt, whited out by the second layer, is there: %s", r)
	}
	if r := inWS("--", "cat", "/app/c.txt"); r.Code != 0 || r.Stdout != "gamma\n" {
		t.Errorf("cat /app/c.txt: %s (stdout %q)", r, r.Stdout)
	}
	// The image's Env replaces the node's defaults (no LANG); HOME is the
	// user's.
	if r := inWS("--", "env"); r.Code != 0 || !strings.Contains(r.Stdout, "GREETING=hello-from-oci\n") || !strings.Contains(r.Stdout, "HOME=/home/app\n") || strings.Contains(r.Stdout, "LANG=") {
		t.Errorf("env: %s (stdout %q); want the image's GREETING, HOME=/home/app and no LANG", r, r.Stdout)
	}
	if r := inWS("--", "pwd"); r.Code != 0 || r.Stdout != "/app\n" {
		t.Errorf("pwd: %s (stdout %q), want the image's WorkingDir /app", r, r.Stdout)
	}
	if r := inWS("--", "id", "-u"); r.Code != 0 || r.Stdout != "1000\n" {
		t.Errorf("id -u: %s (stdout %q), want the image's user app, 1000", r, r.Stdout)
	}
	if r := inWS("-e", "GREETING=mine", "-w", "/tmp", "--", "sh", "-c", `echo "$GREETING $(pwd)"`); r.Code != 0 || r.Stdout != "mine /tmp\n" {
		t.Errorf("-e and -w override the image's: %s (stdout %q)", r, r.Stdout)
	}

	for _, verb := range []string{"stop", "delete"} {
		if r := d.kibo(3*time.Minute, nil, "workspace", verb, id); r.Code != 0 {
			t.Fatalf("workspace %s of the OCI Workspace: %s", verb, r)
		}
	}
	if r := d.must("template", "delete", "oci-app", "--local"); !strings.Contains(r.Stdout, "1 build(s) deleted") {
		t.Errorf("template delete --local: %s", r)
	}
}
