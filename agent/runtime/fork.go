package runtime

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Forks of a paused Workspace. A fork restores its source's snapshot, so
// it needs the source's memory and disk as they were at the pause, while
// the source may resume and write on, and either may be deleted first.
//
// Memory: the state file is written once and only ever read, so the
// fork's snapshot directory holds a hard link to it (the file system
// counts the references; removing either directory leaves the other's)
// and a copy of snapshot.json, written last as a pause writes it.
//
// Disk: the source's layer at the pause becomes a frozen base,
// <pool>/bases/<source>@<instance>.qcow2 (a hard link, so a crash leaves
// the file under one of its two names), and both the source and the fork
// get an empty qcow2 overlay over it. Every layer or base over a base
// holds a reference to it, a file named after its Workspace in
// <base>.refs/; a base goes when its last reference does (RemoveLayer),
// and drops its own reference to the base under it. A base is named in
// the header of what is over it by a path relative to that file's
// directory ("../bases/NAME"): layers/ and bases/ are siblings in every
// pool, wherever a node mounts it. A template image is named absolutely.

// baseDir is the directory of the frozen bases in a pool, beside layers/.
const baseDir = "bases"

// baseRef is how a layer or base names the base under it.
func baseRef(name string) string { return "../" + baseDir + "/" + name }

// ForkFiles are the files PrepareFork works on, all in one pool.
type ForkFiles struct {
	Source, Fork string // Workspace ids
	// SourceInstance is the Instance the source's snapshot was saved from:
	// it names the base, one per pause.
	SourceInstance string
	SourceLayer    string // <pool>/layers/<source>.qcow2
	SourceSnapshot string // <pool>/snapshots/<source>
	Layer          string // the fork's layer
	Snapshot       string // the fork's snapshot directory
}

// PrepareFork makes a fork's layer and snapshot from its source's, which
// must be paused and stay so until the fork's first start is done (ctrl
// starts nothing of the source meanwhile). Every step is skipped when
// done already, so a retry after a crash or on another node of a shared
// pool completes it.
func PrepareFork(ctx context.Context, node string, f ForkFiles) error {
	if err := linkSnapshot(node, f); err != nil {
		return fmt.Errorf("fork %s of workspace %s: %w", f.Fork, f.Source, err)
	}
	base, err := freezeLayer(ctx, node, f)
	if err != nil {
		return fmt.Errorf("fork %s of workspace %s: %w", f.Fork, f.Source, err)
	}
	if err := overlay(ctx, node, base, f.Layer, f.Fork); err != nil {
		return fmt.Errorf("fork %s of workspace %s: %w", f.Fork, f.Source, err)
	}
	return nil
}

// linkSnapshot gives the fork its own names of the source's snapshot.
func linkSnapshot(node string, f ForkFiles) error {
	if _, err := os.Stat(filepath.Join(f.Snapshot, SnapshotMetaFile)); err == nil {
		return nil // complete: snapshot.json comes last
	}
	meta, err := os.ReadFile(filepath.Join(f.SourceSnapshot, SnapshotMetaFile))
	if err != nil {
		return fmt.Errorf("%w: the source's snapshot: %v", ErrSnapshotUnusable, err)
	}
	if err := os.MkdirAll(f.Snapshot, 0o700); err != nil {
		return err
	}
	tmp, err := storagepool.TempPath(f.Snapshot, storagepool.Temp{Node: node, Purpose: "fork-state"})
	if err != nil {
		return err
	}
	if err := os.Link(filepath.Join(f.SourceSnapshot, SnapshotStateFile), tmp); err != nil {
		return fmt.Errorf("%w: link the source's snapshot state: %v", ErrSnapshotUnusable, err)
	}
	if err := storagepool.Commit(tmp, filepath.Join(f.Snapshot, SnapshotStateFile)); err != nil {
		return err
	}
	return storagepool.WriteFile(filepath.Join(f.Snapshot, SnapshotMetaFile), meta, 0o600, storagepool.Temp{Node: node, Purpose: "snapshot"})
}

// freezeLayer makes the source's layer the base of this pause, with an
// empty overlay in its place, and returns the base's path.
func freezeLayer(ctx context.Context, node string, f ForkFiles) (string, error) {
	name := f.Source + "@" + f.SourceInstance + ".qcow2"
	base := filepath.Join(filepath.Dir(filepath.Dir(f.SourceLayer)), baseDir, name)
	backing, _, err := qcow2Header(f.SourceLayer)
	if err != nil {
		return "", fmt.Errorf("the source's layer: %w", err)
	}
	if backing == baseRef(name) {
		return base, nil // frozen by an earlier fork of this pause
	}
	if err := os.MkdirAll(base+".refs", 0o700); err != nil {
		return "", err
	}
	switch err := os.Link(f.SourceLayer, base); {
	case errors.Is(err, os.ErrExist):
		// A crash between link and overlay: the same file under both
		// names, or something else that must not be used.
		if !sameFile(f.SourceLayer, base) {
			return "", fmt.Errorf("base %s exists and is not the source's layer %s: remove it by hand only if no layer names it", base, f.SourceLayer)
		}
	case err != nil:
		return "", err
	}
	// Read-only from now on: QEMU opens a base only to read it.
	if err := os.Chmod(base, 0o440); err != nil {
		return "", err
	}
	if err := overlay(ctx, node, base, f.SourceLayer, f.Source); err != nil {
		return "", err
	}
	return base, nil
}

// overlay puts an empty qcow2 layer over base at path for Workspace ws,
// whose reference to base it records first; an existing layer over base
// is kept.
func overlay(ctx context.Context, node, base, path, ws string) error {
	ref := baseRef(filepath.Base(base))
	if b, _, err := qcow2Header(path); err == nil && b == ref {
		return nil
	}
	_, size, err := qcow2Header(base)
	if err != nil {
		return err
	}
	if err := storagepool.WriteFile(filepath.Join(base+".refs", ws), nil, 0o600, storagepool.Temp{Node: node, Purpose: "ref"}); err != nil {
		return err
	}
	tmp, err := storagepool.TempPath(filepath.Dir(path), storagepool.Temp{Node: node, Purpose: "layer"})
	if err != nil {
		return err
	}
	// -u: the base's own backing may be another node's template path;
	// the size comes from its header.
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", ref, "-u", tmp, strconv.FormatUint(size, 10)).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("create layer %s over %s: %v: %s", path, base, err, strings.TrimSpace(string(out)))
	}
	return storagepool.Commit(tmp, path)
}

// RemoveLayer removes Workspace ws's layer and, with it, its reference to
// the base under it; a base left without references goes too, and so on
// down. References in ws's name that nothing holds any more go as well
// (dropStrayRefs). A missing layer is no error.
func RemoveLayer(layer, ws string) error {
	if strings.ContainsAny(ws, `/*?[\`) {
		return fmt.Errorf("remove writable layer %s: workspace id %q is no file name", layer, ws)
	}
	// Every header first: the bases under the layer are known only from
	// them, and one that could not be read once the layer above it was
	// gone would leave its base behind for good.
	bases, err := baseChain(layer, chainEnds)
	if errors.Is(err, errTooManyBases) {
		return fmt.Errorf("remove writable layer %s: %w", layer, err)
	}
	if err != nil {
		return fmt.Errorf("remove writable layer %s: %w; try again", layer, err)
	}
	if err := os.Remove(layer); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove writable layer %s: %w", layer, err)
	}
	if err := dropRef(bases, ws); err != nil {
		return fmt.Errorf("remove writable layer %s: %w", layer, err)
	}
	if err := dropStrayRefs(filepath.Dir(filepath.Dir(layer)), ws); err != nil {
		return fmt.Errorf("remove writable layer %s: %w", layer, err)
	}
	return nil
}

// chainEnds says which header errors end a chain that is being removed:
// a base already gone, or a file that is no qcow2 image (nothing under it
// can be known).
func chainEnds(_ string, err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, errNotQcow2)
}

// dropRef drops ws's reference to chain[0], the base its layer or a base
// frozen from it stood on. A base left without references goes, and
// drops its own reference to chain[1] (in the name of the Workspace it
// was frozen from), and so on down. A reference another base frozen from
// the same Workspace still needs is kept (frozenOver).
func dropRef(chain []string, ws string) error {
	for _, base := range chain {
		if held, err := frozenOver(base, ws); err != nil || held {
			return err
		}
		if err := os.Remove(filepath.Join(base+".refs", ws)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("drop the reference of %s to base %s: %w", ws, base, err)
		}
		if err := os.Remove(base + ".refs"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil // still referenced
		}
		// The base was ws's layer when it was frozen: its reference to
		// the base under it is in ws's name.
		ws, _, _ = strings.Cut(filepath.Base(base), "@")
		if err := os.Remove(base); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove unreferenced base %s: %w", base, err)
		}
	}
	return nil
}

// frozenOver says whether a base frozen from Workspace ws's layer stands
// on base, holding ws's reference to it. Normally a base frozen from ws
// stands on the one frozen before it, which is gone once its reference is
// dropped; but a freeze cut short (the layer linked to its base name, the
// overlay never put in its place) leaves a second name of the layer, and
// a later freeze of that layer a sibling over the same base.
func frozenOver(base, ws string) (bool, error) {
	dir := filepath.Dir(base)
	frozen, err := filepath.Glob(filepath.Join(dir, ws+"@*.qcow2"))
	if err != nil {
		return false, err
	}
	for _, f := range frozen {
		backing, _, err := qcow2Header(f)
		if chainEnds(f, err) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("%w; try again", err)
		}
		if OverBase(backing) && filepath.Join(dir, filepath.Base(backing)) == base {
			return true, nil
		}
	}
	return false, nil
}

// dropStrayRefs drops the references in Workspace ws's name that nothing
// of ws holds once its layer is gone. A fork's reference to its base is
// made before its layer, so a fork whose layer was never made over the
// base (the creation failed, or its node died, and the fork booted afresh
// over its template) leaves one; so does a freeze cut short, in the base
// it left. Only a base frozen from ws still holds one (frozenOver).
func dropStrayRefs(pool, ws string) error {
	refs, err := filepath.Glob(filepath.Join(pool, baseDir, "*.qcow2.refs", ws))
	if err != nil {
		return err
	}
	for _, ref := range refs {
		base := strings.TrimSuffix(filepath.Dir(ref), ".refs")
		under, err := baseChain(base, chainEnds)
		if err != nil {
			return fmt.Errorf("%w; try again", err)
		}
		if err := dropRef(append([]string{base}, under...), ws); err != nil {
			return err
		}
	}
	return nil
}

// OverBase says whether a layer whose qcow2 header names backing is over
// a frozen base rather than its template image.
func OverBase(backing string) bool { return strings.HasPrefix(backing, baseRef("")) }

// LayerBases are the frozen bases under a layer, nearest first; none for
// a layer over its template image or not made yet.
func LayerBases(layer string) ([]string, error) {
	bases, err := baseChain(layer, func(p string, err error) bool { return p == layer && errors.Is(err, os.ErrNotExist) })
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", layer, err)
	}
	return bases, nil
}

// errTooManyBases is a chain deeper than any fork makes.
var errTooManyBases = errors.New("more than 64 bases under it")

// baseChain reads the qcow2 headers from layer down and returns the frozen
// bases under it, nearest first. A header error that ends says so for
// ends the chain where it is; any other is returned.
func baseChain(layer string, ends func(path string, err error) bool) ([]string, error) {
	var out []string
	for p := layer; ; {
		backing, _, err := qcow2Header(p)
		if err != nil {
			if ends(p, err) {
				return out, nil
			}
			return nil, err
		}
		if !OverBase(backing) {
			return out, nil
		}
		if len(out) == 64 {
			return nil, errTooManyBases
		}
		p = filepath.Join(filepath.Dir(p), backing)
		out = append(out, p)
	}
}

// errNotQcow2 is a file that reads whole but is no qcow2 image: reading
// it again will not change that.
var errNotQcow2 = errors.New("not a qcow2 image")

// qcow2Header reads the backing file name and the virtual size from a
// qcow2 header (the format's first 32 bytes; the name where they say).
func qcow2Header(path string) (backing string, size uint64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	var h [32]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = errNotQcow2 // shorter than a header
		}
		return "", 0, fmt.Errorf("qcow2 header of %s: %w", path, err)
	}
	if string(h[:4]) != "QFI\xfb" {
		return "", 0, fmt.Errorf("%s: %w", path, errNotQcow2)
	}
	off, n := binary.BigEndian.Uint64(h[8:]), binary.BigEndian.Uint32(h[16:])
	size = binary.BigEndian.Uint64(h[24:])
	if off == 0 || n == 0 {
		return "", size, nil
	}
	if n > 1023 {
		return "", 0, fmt.Errorf("qcow2 header of %s: backing file name of %d bytes: %w", path, n, errNotQcow2)
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, int64(off)); err != nil {
		if errors.Is(err, io.EOF) {
			err = errNotQcow2 // the name past the end
		}
		return "", 0, fmt.Errorf("qcow2 header of %s: backing file name: %w", path, err)
	}
	return string(b), size, nil
}

func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// Identity is what a fork's first restore makes its own (Spec.Identity).
type Identity struct {
	Hostname string
	// Roots are the guest directories whose etc/machine-id is replaced.
	Roots []string
}

// NewIdentity gives a running Instance a new identity: random state,
// and what id names of hostname and machine id.
func (rt *Runtime) NewIdentity(ctx context.Context, id string, ident Identity) error {
	c, err := rt.Guest(id)
	if err != nil {
		return err
	}
	return newIdentity(ctx, c, &ident)
}

// newIdentity gives a restored fork its own random state, hostname and
// machine id, before anything else is asked of the guest.
func newIdentity(ctx context.Context, c *guestproto.Client, id *Identity) error {
	if !c.Info().Has(guestproto.CapIdentity) {
		return fmt.Errorf("%w: its guest agent cannot take a new identity (a Platform older than forks): a fork would share its source's random state", ErrSnapshotUnusable)
	}
	var mid [16]byte
	req := guestproto.IdentityRequest{Entropy: make([]byte, 64), Hostname: id.Hostname, Roots: id.Roots}
	if _, err := rand.Read(req.Entropy); err != nil {
		return err
	}
	if _, err := rand.Read(mid[:]); err != nil {
		return err
	}
	req.MachineID = hex.EncodeToString(mid[:])
	return c.SetIdentity(ctx, req)
}
