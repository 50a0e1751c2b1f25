package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kibotos/kibotos/storagepool"
)

// EnsureLayer creates a Workspace's retained writable layer, a qcow2 file
// whose backing file is the template image, unless it exists already (a
// restart of the same Workspace keeps what it wrote). It is made under a
// temporary name of node's (the pool may be shared) and renamed once
// qemu-img is done. Start calls it; the node's agent calls it first, to
// record the layer's creation as a command of its own.
func EnsureLayer(ctx context.Context, node, layer, base string) error {
	if _, err := os.Stat(layer); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("retained layer %s: %w", layer, err)
	}
	if _, err := os.Stat(base); err != nil {
		return fmt.Errorf("template image %s: %w", base, err)
	}
	if err := os.MkdirAll(filepath.Dir(layer), 0o700); err != nil {
		return err
	}
	tmp, err := storagepool.TempPath(filepath.Dir(layer), storagepool.Temp{Node: node, Purpose: "layer"})
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("create retained layer %s over %s: %v: %s (qemu-img is in the Debian package qemu-utils)", layer, base, err, strings.TrimSpace(string(out)))
	}
	return storagepool.Commit(tmp, layer)
}
