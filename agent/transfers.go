package agent

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/internal/tarfile"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/template"
)

// A Transfer archive is a tar of:
//
//	transfer.json        the manifest (without the archive's own digest)
//	layer.qcow2          the retained writable layer, as the node keeps it
//	volumes/<n>.qcow2    each Volume, in mount order, converted from its
//	                     raw file (qcow2 skips the unwritten space)
//
// Exports and imports stage files in the pool, in
// volumes/transfer-staging/, under names that start with the node's id
// (process-model seed: .node-a.download-import-<n>.tar). An archive is
// untrusted when it comes back: only those names are read, each bounded,
// and every qcow2 must stand alone (no backing or data file of its own:
// qemu-img would read a host file into the Workspace).

// Archive members.
const (
	transferManifestName = "transfer.json"
	transferLayerName    = "layer.qcow2"
	transferVolumeDir    = "volumes/"
	// stagingDir is in a pool.
	stagingDir = "volumes/transfer-staging"
)

var volumeMemberRE = regexp.MustCompile(`^volumes/([0-9]{1,2})\.qcow2$`)

// importArchivePurpose names an import's archive in staging:
// .<node>.download-import-<n>.tar, fetched through <that>.partial under
// <that>.lock.
const importArchivePurpose = "download-import"

var importArchiveRE = regexp.MustCompile(`^\.[^.]+\.` + importArchivePurpose + `-[0-9]+\.tar(` +
	regexp.QuoteMeta(artifacts.PartialSuffix) + `|` + regexp.QuoteMeta(artifacts.LockSuffix) + `)?$`)

// sweepImportArchives deletes what interrupted imports left in the
// staging directory of the pool at root, by the rule of its temporary
// files (all of them in a standalone pool, only node's in a shared one,
// where another member may be importing): the archive does not end in
// .tmp, so storagepool's sweep passes it by, and the next attempt
// fetches under a new name rather than continuing it.
func sweepImportArchives(root string, shared bool, node string) (int, error) {
	dir := filepath.Join(root, stagingDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !importArchiveRE.MatchString(name) || shared && !storagepool.WrittenBy(name, node) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, err
		}
		n++
	}
	return n, nil
}

// exports runs one export of a Transfer at a time: a new leader's driver
// asking again waits for the one in progress.
type exports struct {
	mu      sync.Mutex
	running map[string]*exportRun
}

type exportRun struct {
	done chan struct{}
	res  api.TransferExportResult
	err  error
	// written of total bytes of the archive are in the store's hands.
	written, total atomic.Int64
}

// ExportProgress is how far the export of a Transfer in progress here is;
// false when none is.
func (a *Agent) ExportProgress(id string) (api.TransferProgress, bool) {
	a.exports.mu.Lock()
	run, ok := a.exports.running[id]
	a.exports.mu.Unlock()
	if !ok {
		return api.TransferProgress{}, false
	}
	total := run.total.Load()
	return api.TransferProgress{DoneBytes: min(run.written.Load(), total), TotalBytes: total}, true
}

// ExportTransfer writes the archive of a stopped Workspace's layer and
// Volumes and its manifest into the artifact store (ctrl asks for it).
func (a *Agent) ExportTransfer(ctx context.Context, t api.TransferExportTask) (api.TransferExportResult, error) {
	a.exports.mu.Lock()
	if a.exports.running == nil {
		a.exports.running = map[string]*exportRun{}
	}
	run, ok := a.exports.running[t.TransferID]
	if !ok {
		run = &exportRun{done: make(chan struct{})}
		a.exports.running[t.TransferID] = run
		a.bg.spawn(ctx, func(ctx context.Context) {
			// Not the caller's context: an export outlives one call
			// (but not the node).
			ctx, cancel := context.WithTimeout(ctx, 2*time.Hour)
			defer cancel()
			run.res, run.err = a.exportTransfer(ctx, t, run)
			close(run.done)
			a.exports.mu.Lock()
			delete(a.exports.running, t.TransferID)
			a.exports.mu.Unlock()
		})
	}
	a.exports.mu.Unlock()
	select {
	case <-run.done:
		return run.res, run.err
	case <-ctx.Done():
		return api.TransferExportResult{}, api.Errorf(api.CodeUnavailable, "transfer %s: still exporting on node %s", t.TransferID, a.cfg.NodeID)
	}
}

func (a *Agent) exportTransfer(ctx context.Context, t api.TransferExportTask, run *exportRun) (api.TransferExportResult, error) {
	store := a.cfg.Artifacts
	if store == nil {
		return api.TransferExportResult{}, api.Errorf(api.CodeFailedPrecondition, "transfer %s: node %s has no artifact store: set [artifacts] url in its configuration file and restart it", t.TransferID, a.cfg.NodeID)
	}
	if err := api.ValidTransferNamespace(t.Namespace); err != nil {
		return api.TransferExportResult{}, err
	}
	if !api.IsWorkspaceID(t.WorkspaceID) {
		return api.TransferExportResult{}, api.Errorf(api.CodeInvalidArgument, "transfer %s: %.80q is not a Workspace id", t.TransferID, t.WorkspaceID)
	}
	if err := t.Shape.Check("transfer " + t.TransferID); err != nil {
		return api.TransferExportResult{}, err
	}
	log := a.log.With("transfer_id", t.TransferID, "workspace_id", t.WorkspaceID)
	start := time.Now()
	layer, err := a.layerPath(t.LayerPool, t.WorkspaceID)
	if err != nil {
		return api.TransferExportResult{}, err
	}
	running := a.instanceWriting(layer)
	info, err := qcowInfo(ctx, layer)
	if err != nil {
		return api.TransferExportResult{}, fmt.Errorf("transfer %s: layer of workspace %s: %w", t.TransferID, t.WorkspaceID, err)
	}
	if runtime.OverBase(info.BackingFilename) {
		return api.TransferExportResult{}, api.Errorf(api.CodeFailedPrecondition, "transfer %s: the layer of workspace %s is over the frozen layer of a fork (kibo workspace create --from): an export of a fork or of a forked source is not supported yet", t.TransferID, t.WorkspaceID)
	}
	// The layer is written over the template build whose directory holds
	// its backing image: the importing node must boot the same build.
	tmplID := filepath.Base(filepath.Dir(info.BackingFilename))
	if !api.ValidTemplateID(tmplID) {
		tmplID = ""
	}
	staging, err := a.stagingDir(t.LayerPool)
	if err != nil {
		return api.TransferExportResult{}, err
	}
	var staged []string
	defer func() {
		for _, p := range staged {
			os.Remove(p)
		}
	}()
	stage := func(purpose string) (string, error) {
		dst, err := storagepool.TempPath(staging, storagepool.Temp{Node: a.cfg.NodeID, Purpose: purpose})
		if err == nil {
			staged = append(staged, dst)
		}
		return dst, err
	}
	// copyDisks stages each Volume as a qcow2 image, and the layer too
	// when a running guest keeps writing it (a stopped one's stays put:
	// ctrl starts nothing of the Workspace while it exports).
	layerSrc, volumes := layer, []string{}
	copyDisks := func() error {
		if running != "" {
			dst, err := stage("export-layer")
			if err != nil {
				return err
			}
			// The file as it is: QEMU flushed it when it stopped the
			// guest, and a copy of the file is all of what it wrote.
			if out, err := exec.CommandContext(ctx, "cp", "--reflink=auto", "--sparse=always", layer, dst).CombinedOutput(); err != nil {
				return fmt.Errorf("layer: cp: %v: %s", err, strings.TrimSpace(string(out)))
			}
			layerSrc = dst
		}
		for i, v := range t.Volumes {
			src, err := a.volumePath(v.PoolID, v.VolumeID)
			if err != nil {
				return err
			}
			if inst := a.instanceWriting(src); inst != "" && inst != running {
				return fmt.Errorf("volume %s is in use by instance %s, which is not this Workspace's", v.VolumeID, inst)
			}
			dst, err := stage(fmt.Sprintf("export-%d", i))
			if err != nil {
				return err
			}
			if err := qemuImg(ctx, "convert", "-U", "-f", "raw", "-O", "qcow2", src, dst); err != nil {
				return fmt.Errorf("volume %s: %w", v.VolumeID, err)
			}
			volumes = append(volumes, dst)
		}
		return nil
	}
	if running != "" && a.cfg.Runtime != nil {
		err = a.cfg.Runtime.WhilePaused(ctx, running, copyDisks)
	} else {
		err = copyDisks()
	}
	if err != nil {
		return api.TransferExportResult{}, fmt.Errorf("transfer %s: %w", t.TransferID, err)
	}
	shape := t.Shape
	shape.TemplateID = tmplID
	manifest := api.TransferManifest{FormatVersion: api.TransferFormatFor(t.Env), TransferID: t.TransferID, WorkspaceID: t.WorkspaceID, Shape: shape, Env: t.Env}
	members := []archiveMember{{name: transferLayerName, path: layerSrc}}
	for i, p := range volumes {
		members = append(members, archiveMember{name: fmt.Sprintf("%s%d.qcow2", transferVolumeDir, i), path: p})
	}
	var total int64
	for _, mb := range members {
		if st, err := os.Stat(mb.path); err == nil {
			total += st.Size()
		}
	}
	run.total.Store(total)
	pr, wait := pipeFrom(func(w io.Writer) error {
		return writeTransferArchive(countingWriter{w, &run.written}, manifest, members)
	})
	key := api.TransferArchiveKey(t.Namespace, t.TransferID)
	o, err := store.PutNamed(ctx, key, pr)
	pr.CloseWithError(errors.New("upload ended"))
	wait()
	if err != nil {
		return api.TransferExportResult{}, fmt.Errorf("transfer %s: write %s: %w", t.TransferID, key, err)
	}
	manifest.Digest, manifest.SizeBytes, manifest.ExportedAt = string(o.Digest), o.Size, time.Now().UTC()
	raw, _ := json.MarshalIndent(manifest, "", "  ")
	if _, err := store.PutNamed(ctx, api.TransferManifestKey(t.Namespace, t.TransferID), strings.NewReader(string(raw))); err != nil {
		return api.TransferExportResult{}, fmt.Errorf("transfer %s: write its manifest: %w", t.TransferID, err)
	}
	log.Info("transfer exported", "key", key, "bytes", o.Size, "seconds", time.Since(start).Seconds())
	return api.TransferExportResult{Digest: string(o.Digest), SizeBytes: o.Size, TemplateID: tmplID}, nil
}

type archiveMember struct{ name, path string }

// countingWriter counts what passes into n.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func writeTransferArchive(w io.Writer, m api.TransferManifest, members []archiveMember) error {
	tw := tar.NewWriter(w)
	raw, _ := json.MarshalIndent(m, "", "  ")
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: transferManifestName, Mode: 0o600, Size: int64(len(raw)), ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	if _, err := tw.Write(raw); err != nil {
		return err
	}
	for _, mb := range members {
		if err := tarfile.Add(tw, mb.name, mb.path, 0o600); err != nil {
			return fmt.Errorf("archive %s: %w", mb.name, err)
		}
	}
	return tw.Close()
}

// stagingDir is the transfer staging directory of a pool, made if needed.
func (a *Agent) stagingDir(pool string) (string, error) {
	dir := a.poolPath(pool)
	if dir == "" {
		return "", fmt.Errorf("storage pool %s is not configured on node %s", pool, a.cfg.NodeID)
	}
	dir = filepath.Join(dir, stagingDir)
	return dir, os.MkdirAll(dir, 0o700)
}

// imported is what an import unpacked for a start: the staged Volumes by
// mount path, converted into the Volume files as they are made.
type imported struct {
	volumes map[string]string
	staged  []string
}

func (im *imported) cleanup() {
	if im == nil {
		return
	}
	for _, p := range im.staged {
		os.Remove(p)
	}
}

// importTransfer unpacks the archive of t.Import for a first start: the
// layer into place (over this node's build of the template) and the
// Volumes into staging, for prepareVolumes. A layer already there (an
// earlier attempt that got that far) is kept.
func (a *Agent) importTransfer(ctx context.Context, t api.WorkspaceTask, tpl *template.Template, layer string) (*imported, error) {
	imp := t.Import
	if err := imp.Check(); err != nil {
		return nil, err
	}
	if imp.TemplateID != "" && imp.TemplateID != tpl.ID {
		return nil, fmt.Errorf("transfer %s was exported over build %s of template %s, and node %s has build %s: publish the build it was made with (kibo template publish) and import again", imp.TransferID, imp.TemplateID, tpl.Name, a.cfg.NodeID, tpl.ID)
	}
	store := a.cfg.Artifacts
	if store == nil {
		return nil, fmt.Errorf("transfer %s: node %s has no artifact store to read the archive from: set [artifacts] url in its configuration", imp.TransferID, a.cfg.NodeID)
	}
	staging, err := a.stagingDir(t.LayerPool)
	if err != nil {
		return nil, err
	}
	name, err := (storagepool.Temp{Node: a.cfg.NodeID, Purpose: importArchivePurpose}).Name()
	if err != nil {
		return nil, err
	}
	archive := filepath.Join(staging, strings.TrimSuffix(name, storagepool.TempSuffix)+".tar")
	im := &imported{volumes: map[string]string{}, staged: []string{archive}}
	fail := func(err error) (*imported, error) {
		im.cleanup()
		return nil, err
	}
	log := a.log.With("transfer_id", imp.TransferID, "workspace_id", t.WorkspaceID)
	log.Info("transfer import started", "key", imp.Key, "bytes", imp.SizeBytes)
	start := time.Now()
	c, end := a.transfers.Begin(api.WorkspaceProgressKey(t.WorkspaceID), "transfer import", imp.SizeBytes)
	err = artifacts.FetchNamed(ctx, store, imp.Key, artifacts.Object{Digest: artifacts.Digest(imp.Digest), Size: imp.SizeBytes}, archive, c.Set)
	end()
	if err != nil {
		return fail(fmt.Errorf("transfer %s: %w", imp.TransferID, err))
	}
	f, err := os.Open(archive)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	var manifest *api.TransferManifest
	layerDone := false
	if _, err := os.Stat(layer); err == nil {
		layerDone = true
	}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail(fmt.Errorf("transfer %s: the archive is not a readable tar: %w", imp.TransferID, err))
		}
		if hdr.Typeflag != tar.TypeReg || hdr.Size < 0 || hdr.Size > imp.SizeBytes {
			return fail(fmt.Errorf("transfer %s: the archive holds %.80q as something other than a bounded regular file", imp.TransferID, hdr.Name))
		}
		switch m := volumeMemberRE.FindStringSubmatch(hdr.Name); {
		case hdr.Name == transferManifestName && manifest == nil:
			var mf api.TransferManifest
			if err := json.NewDecoder(io.LimitReader(tr, api.MaxTransferManifest)).Decode(&mf); err != nil || mf.TransferID != imp.TransferID {
				return fail(fmt.Errorf("transfer %s: the archive's manifest is unreadable or names another Transfer", imp.TransferID))
			}
			if err := mf.Shape.Check("transfer " + imp.TransferID); err != nil {
				return fail(err)
			}
			manifest = &mf
		case manifest == nil:
			return fail(fmt.Errorf("transfer %s: the archive does not start with %s", imp.TransferID, transferManifestName))
		case hdr.Name == transferLayerName && !layerDone:
			if err := a.unpackLayer(ctx, tr, hdr.Size, layer, tpl.Image()); err != nil {
				return fail(fmt.Errorf("transfer %s: layer: %w", imp.TransferID, err))
			}
			layerDone = true
		case hdr.Name == transferLayerName:
		case m != nil:
			var i int
			fmt.Sscanf(m[1], "%d", &i)
			if i >= len(manifest.Shape.Volumes) {
				return fail(fmt.Errorf("transfer %s: the archive holds %s, beyond its %d Volumes", imp.TransferID, hdr.Name, len(manifest.Shape.Volumes)))
			}
			dst, err := storagepool.TempPath(staging, storagepool.Temp{Node: a.cfg.NodeID, Purpose: "import-" + m[1]})
			if err != nil {
				return fail(err)
			}
			im.staged = append(im.staged, dst)
			if err := tarfile.Extract(tr, hdr.Size, dst, 0o600); err != nil {
				return fail(err)
			}
			if err := standaloneQcow(ctx, dst, manifest.Shape.Volumes[i].SizeBytes); err != nil {
				return fail(fmt.Errorf("transfer %s: %s: %w", imp.TransferID, hdr.Name, err))
			}
			im.volumes[manifest.Shape.Volumes[i].Path] = dst
		default:
			return fail(fmt.Errorf("transfer %s: the archive holds %.80q, which is not part of a Transfer", imp.TransferID, hdr.Name))
		}
	}
	if !layerDone {
		return fail(fmt.Errorf("transfer %s: the archive holds no %s", imp.TransferID, transferLayerName))
	}
	os.Remove(archive)
	log.Info("transfer import unpacked", "seconds", time.Since(start).Seconds())
	return im, nil
}

// unpackLayer writes the archive's layer beside layer, checks it stands
// alone, points it at this node's template image and puts it in place.
func (a *Agent) unpackLayer(ctx context.Context, r io.Reader, size int64, layer, base string) error {
	if err := os.MkdirAll(filepath.Dir(layer), 0o700); err != nil {
		return err
	}
	tmp, err := storagepool.TempPath(filepath.Dir(layer), storagepool.Temp{Node: a.cfg.NodeID, Purpose: "layer"})
	if err != nil {
		return err
	}
	if err := tarfile.Extract(r, size, tmp, 0o600); err != nil {
		return err
	}
	info, err := qcowInfo(ctx, tmp)
	if err == nil && info.DataFile != "" {
		err = errors.New("it has an external data file")
	}
	if err == nil {
		// Unsafe rebase: only the pointer changes; the content under it
		// is the same build (checked against the manifest).
		err = qemuImg(ctx, "rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", base, tmp)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return storagepool.Commit(tmp, layer)
}

// qcowImage is what qemu-img info says of a qcow2 file.
type qcowImage struct {
	Format          string `json:"format"`
	VirtualSize     uint64 `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
	DataFile        string
}

func qcowInfo(ctx context.Context, path string) (*qcowImage, error) {
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "-U", "-f", "qcow2", "--output=json", path).Output()
	if err != nil {
		return nil, fmt.Errorf("qemu-img info %s: %v", path, err)
	}
	var raw struct {
		qcowImage
		FormatSpecific struct {
			Data struct {
				DataFile string `json:"data-file"`
			} `json:"data"`
		} `json:"format-specific"`
	}
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("qemu-img info %s: %v", path, err)
	}
	raw.qcowImage.DataFile = raw.FormatSpecific.Data.DataFile
	if raw.Format != "qcow2" {
		return nil, fmt.Errorf("%s is %q, not qcow2", path, raw.Format)
	}
	return &raw.qcowImage, nil
}

// standaloneQcow checks a staged Volume: qcow2 with neither a backing nor
// a data file, and no larger than the Volume.
func standaloneQcow(ctx context.Context, path string, size uint64) error {
	info, err := qcowInfo(ctx, path)
	switch {
	case err != nil:
		return err
	case info.BackingFilename != "" || info.DataFile != "":
		return errors.New("it refers to another file (a backing or data file): refused")
	case info.VirtualSize > size:
		return fmt.Errorf("it is %d bytes, larger than its Volume's %d", info.VirtualSize, size)
	}
	return nil
}

func qemuImg(ctx context.Context, args ...string) error {
	if out, err := exec.CommandContext(ctx, "qemu-img", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img %s: %v: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}
