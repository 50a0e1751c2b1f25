package storagepool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/kibotos/kibotos/internal/recordfmt"
	"io"
	"os"
	"time"
)

// Holder records. Ctrl grants the use right of an object in a pool (a
// retained layer, a Volume) to one node incarnation at a time; before it
// opens the object that node writes a holder record next to it, in the
// pool itself. The record is what a node can check without ctrl: one
// that finds the record of an object it is writing naming someone else
// has been replaced (isolated while cut off) and must stop writing at
// once, whether or not it can reach ctrl. Shared pools make this the only
// channel the two nodes have in common.

// HolderSuffix ends a holder record's name: <object>.holder.
const HolderSuffix = ".holder"

// holderRange is the formats of holder records this build reads.
var holderRange = recordfmt.Current(1)

// maxHolderBytes bounds what is read of a holder record: it comes from a
// disk another host writes.
const maxHolderBytes = 4096

// Holder is who holds the use right of an object.
type Holder struct {
	// FormatVersion of the record; records of builds before it had one
	// are version 1.
	FormatVersion int    `json:"format_version"`
	NodeID        string `json:"node_id"`
	Incarnation   uint64 `json:"incarnation"`
	// Grant is ctrl's grant of the use right: the Instance that uses the
	// object (a new one for every start).
	Grant     string    `json:"grant"`
	WrittenAt time.Time `json:"written_at"`
}

// HolderPath is the holder record of object (a path in a pool).
func HolderPath(object string) string { return object + HolderSuffix }

// Names reports whether h names this node's grant.
func (h *Holder) Names(node, grant string) bool { return h.NodeID == node && h.Grant == grant }

func (h *Holder) String() string {
	return fmt.Sprintf("node %s (incarnation %d, grant %s, written %s)", h.NodeID, h.Incarnation, h.Grant, h.WrittenAt.UTC().Format(time.RFC3339))
}

// WriteHolder records h as the holder of object: written under a
// temporary name of h's node, fsynced, renamed over the previous record.
func WriteHolder(object string, h Holder) error {
	if h.NodeID == "" || h.Grant == "" {
		return fmt.Errorf("storagepool: holder record of %s: node and grant are required", object)
	}
	h.FormatVersion = holderRange.Max
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	return WriteFile(HolderPath(object), append(b, '\n'), 0o600, Temp{Node: h.NodeID, Purpose: "holder"})
}

// ReadHolder reads object's holder record; nil without one (an object
// made before holder records, or never opened).
func ReadHolder(object string) (*Holder, error) {
	f, err := os.Open(HolderPath(object))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxHolderBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxHolderBytes {
		return nil, fmt.Errorf("storagepool: holder record %s is over %d bytes: not one of ours", HolderPath(object), maxHolderBytes)
	}
	if err := holderRange.CheckJSON(HolderPath(object), b, 1); err != nil {
		return nil, fmt.Errorf("storagepool: holder record %w", err)
	}
	// Unknown fields of the same version are a newer build's: what this
	// one needs is there.
	var h Holder
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&h); err != nil || h.NodeID == "" || h.Grant == "" {
		return nil, fmt.Errorf("storagepool: holder record %s is not valid: %v", HolderPath(object), err)
	}
	return &h, nil
}

// RemoveHolder removes object's holder record (with the object).
func RemoveHolder(object string) error {
	if err := os.Remove(HolderPath(object)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
