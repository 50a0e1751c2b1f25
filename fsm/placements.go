package fsm

import (
	"encoding/binary"
	"fmt"
	"sort"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/ctrl/placement"
)

// Placement counts (LevelPlacementCounts): how many placements of
// Workspace Instances placed one and how many found no node, and for
// those, why. They are state, counted by the apply that decided, so they
// never decrease and are the same on every member at the same index; a
// metrics scrape reads them with one bucket scan.
//
// Only an entry with Entry.CountPlacements counts: the leader sets it
// when every voter applies the level, so an older voter, which counts
// nothing, never sees one. A placement counts as placed when its entry
// is accepted (a create placed and then rejected placed nothing); a
// refusal counts whatever the entry's result: a rejected create and a
// re-placement after a node's refusal that fails the Workspace alike.
// Refused placements count each reason that kept a node out once
// (placement.Decision.Why), so the reasons' counts add up to at least
// the refusals. Requests refused before placement (a lost layer, a busy
// Volume) and the placement of a new Volume are not counted.

// placingOps are the ops whose apply may place an Instance.
var placingOps = map[string]bool{OpWorkspaceCreate: true, OpWorkspaceStart: true, OpWorkspaceResult: true}

// CountsPlacements reports whether op may place an Instance: the leader
// sets Entry.CountPlacements on it when every voter counts placements.
func CountsPlacements(op string) bool { return placingOps[op] }

// Keys of the placement counts bucket: an outcome, or a refusal's reason
// after keyRefusedFor.
var (
	keyPlaced     = []byte("placed")
	keyRefused    = []byte("refused")
	keyRefusedFor = "refused/"
)

// placementTally is what one entry's apply decided, written after its
// handler returned (a rejecting handler writes nothing itself).
type placementTally struct {
	placed, refused uint64
	why             map[string]uint64
}

// add counts one decision; t is nil for an entry that counts nothing.
func (t *placementTally) add(d placement.Decision) {
	if t == nil {
		return
	}
	if d.Err == nil {
		t.placed++
		return
	}
	t.refused++
	if t.why == nil {
		t.why = map[string]uint64{}
	}
	for _, l := range d.Why {
		t.why[l]++
	}
}

// write adds the tally to the state; placements count only when the
// entry was accepted.
func (t *placementTally) write(tx *bolt.Tx, accepted bool) error {
	if t == nil {
		return nil
	}
	adds := map[string]uint64{string(keyRefused): t.refused}
	if accepted {
		adds[string(keyPlaced)] = t.placed
	}
	for l, n := range t.why {
		adds[keyRefusedFor+l] = n
	}
	keys := make([]string, 0, len(adds))
	for k := range adds {
		keys = append(keys, k)
	}
	sort.Strings(keys) // map order must not reach the state
	for _, k := range keys {
		if adds[k] == 0 {
			continue
		}
		n, err := placementCount(tx, []byte(k))
		if err != nil {
			return err
		}
		if err := putUint(tx, bucketPlacements, []byte(k), n+adds[k]); err != nil {
			return fmt.Errorf("count placements %s: %w", k, err)
		}
	}
	return nil
}

func placementCount(tx *bolt.Tx, key []byte) (uint64, error) {
	v := tx.Bucket(bucketPlacements).Get(key)
	switch len(v) {
	case 0:
		return 0, nil
	case 8:
		return binary.BigEndian.Uint64(v), nil
	}
	return 0, fmt.Errorf("state record %s/%s is corrupt: %d bytes, want 8", bucketPlacements, key, len(v))
}

// PlacementCounts are the placements counted in the state.
type PlacementCounts struct {
	Placed, Refused uint64
	// Refusals counts refused placements by the label of each reason
	// that kept a node out.
	Refusals map[string]uint64
}

// placementCounts reads the counts (one scan of a bucket of a few keys).
func placementCounts(tx *bolt.Tx) (PlacementCounts, error) {
	c := PlacementCounts{Refusals: map[string]uint64{}}
	err := tx.Bucket(bucketPlacements).ForEach(func(k, _ []byte) error {
		n, err := placementCount(tx, k)
		switch key := string(k); {
		case err != nil:
			return err
		case key == string(keyPlaced):
			c.Placed = n
		case key == string(keyRefused):
			c.Refused = n
		case strings.HasPrefix(key, keyRefusedFor):
			c.Refusals[strings.TrimPrefix(key, keyRefusedFor)] = n
		}
		return nil
	})
	return c, err
}
