package fsm

import (
	"bytes"
	"fmt"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/ctrl/placement"
)

// placeCache spares placement from decoding every node record for every
// create: it keeps the candidate list from batch to batch and refreshes
// only the nodes a committed write changed since, and it keeps the decoded
// record of every node, reused while the stored bytes are the same. It
// holds nothing the state does not: a cached answer is always the one a
// fresh decode would give, so replicas stay identical with or without it
// (TestPropertyReplicasAgree compares with a replica that rebuilds the
// list every batch). That rests on every write of a node record or its
// holds marking the node (putNode, moveHolds), and on dropping the list
// whenever the state changes behind the cache's back: a batch rolled back
// (its views may hold writes that never committed) and a restore.
type placeCache struct {
	decoded map[string]decodedNode
	holds   map[string]decodedHolds

	// The candidate list, by node position, and what changed since it
	// was last brought up to date.
	list  []api.Node
	cands []placement.Candidate // of list, element by element
	pos   map[string]int
	dirty map[string]bool
	all   bool // rebuild the whole list
}

type decodedNode struct {
	raw  []byte
	node api.Node
}

type decodedHolds struct {
	raw   []byte
	holds Holds
}

func newPlaceCache() *placeCache {
	return &placeCache{decoded: map[string]decodedNode{}, holds: map[string]decodedHolds{}}
}

// beginBatch readies c for one batch. A batch that does not commit must
// be followed by invalidate.
func (c *placeCache) beginBatch() {
	if c.dirty == nil {
		c.dirty = map[string]bool{}
	}
}

// invalidate drops the candidate list: the state changed in a way the
// cache did not see.
func (c *placeCache) invalidate() {
	c.list, c.cands, c.pos, c.all = nil, nil, nil, false
	clear(c.dirty)
}

// markNodeChanged: the node's record or holds changed in this batch.
func markNodeChanged(ac *applyCtx, node string) {
	ac.cache.dirty[node] = true
}

// markAllNodesChanged: something every node's view depends on changed
// (the overcommit default).
func markAllNodesChanged(ac *applyCtx) {
	ac.cache.all = true
}

// nodeHolds is nodeHolds, reusing the last decode of the same bytes: a
// placement reads every node's, and few change between two batches.
func (c *placeCache) nodeHolds(tx *bolt.Tx, id string) (Holds, error) {
	raw := tx.Bucket(bucketNodeHolds).Get([]byte(id))
	if d, ok := c.holds[id]; ok && bytes.Equal(d.raw, raw) {
		return d.holds, nil
	}
	var h Holds
	if raw != nil {
		if err := jsonRecord(bucketNodeHolds, []byte(id), raw, &h); err != nil {
			return h, err
		}
	}
	c.holds[id] = decodedHolds{raw: bytes.Clone(raw), holds: h}
	return h, nil
}

// node decodes a node record as placement reads it, reusing the last
// decode of the same bytes. The report's Instance list is skipped:
// neither placement nor a first start reads it, and it is as long as the
// node's Instances and changes with every task's report.
func (c *placeCache) node(id string, raw []byte) (api.Node, error) {
	if d, ok := c.decoded[id]; ok && bytes.Equal(d.raw, raw) {
		return d.node, nil
	}
	var p placedNode
	if err := json.Unmarshal(raw, &p); err != nil {
		return api.Node{}, fmt.Errorf("state record nodes/%s is corrupt: %w", id, err)
	}
	n := p.Node
	if p.Report != nil {
		n.Report = &p.Report.Report
	}
	c.decoded[id] = decodedNode{raw: bytes.Clone(raw), node: n}
	return n, nil
}

// placedNode is a node record without its report's Instance list.
type placedNode struct {
	api.Node
	Report *struct {
		api.Report
		InstanceStates []struct{} `json:"instance_states"` // skipped
	} `json:"report"`
}

// viewNode is mustNode for a caller that only reads the record, not its
// report's Instance list, and keeps nothing of it past the apply (the
// decode is shared with the cache): within a batch, a record placement
// has just decoded is not decoded again while its bytes are the same.
func viewNode(ac *applyCtx, id string) (*api.Node, error) {
	raw := ac.tx.Bucket(bucketNodes).Get([]byte(id))
	if raw == nil {
		return mustNode(ac.tx, id) // not_found, worded once
	}
	n, err := ac.cache.node(id, raw)
	return &n, err
}

// candidates returns every node as placement sees it, with allocations
// raised to what ctrl itself has placed there but the node has not
// reported yet, and the nodes' placement.Candidates.
func (c *placeCache) candidates(tx *bolt.Tx) ([]api.Node, []placement.Candidate, error) {
	d, err := getOvercommitDefault(tx)
	if err != nil {
		return nil, nil, err
	}
	view := func(id string, raw []byte) (*api.Node, error) {
		n, err := c.node(id, raw)
		if err != nil {
			return nil, err
		}
		return candidateView(d, &n, func() (Holds, error) { return c.nodeHolds(tx, id) })
	}
	if c.list != nil && !c.all {
		for id := range c.dirty {
			i, ok := c.pos[id]
			if !ok {
				c.all = true // a new node: rebuild in key order
				break
			}
			vn, err := view(id, tx.Bucket(bucketNodes).Get([]byte(id)))
			if err != nil {
				return nil, nil, err
			}
			if vn == nil {
				// No longer a candidate (it lost the node role, e.g.
				// re-admitted as ctrl only): rebuild without it.
				c.all = true
				break
			}
			c.list[i] = *vn
			c.cands[i] = placement.NewCandidate(&c.list[i])
		}
	}
	if c.list == nil || c.all {
		c.list, c.pos = c.list[:0], map[string]int{}
		err := tx.Bucket(bucketNodes).ForEach(func(k, v []byte) error {
			vn, err := view(string(k), v)
			if err != nil || vn == nil {
				return err
			}
			c.pos[vn.NodeID] = len(c.list)
			c.list = append(c.list, *vn)
			return nil
		})
		if err != nil {
			c.list = nil
			return nil, nil, err
		}
		c.cands = placement.Candidates(c.list)
	}
	clear(c.dirty)
	c.all = false
	return c.list, c.cands, nil
}
