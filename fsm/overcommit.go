package fsm

import (
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func getOvercommitDefault(tx *bolt.Tx) (api.OvercommitDefault, error) {
	d := api.OvercommitDefault{CPU: 1000, Memory: 1000}
	_, err := getJSON(tx, bucketMeta, keyOvercommit, &d)
	return d, err
}

// ValidMultiplier applies the documented range 0–16.
func ValidMultiplier(item string, m api.Milli) error {
	if m < 0 || m > api.MaxMultiplier {
		return api.Errorf(api.CodeInvalidArgument, "%s multiplier %s is out of range: use a decimal between 0 and 16 with at most three places", item, m)
	}
	return nil
}

func applyOvercommitSetDefault(ac *applyCtx) (any, error) {
	var a OvercommitDefaultArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if a.CPU == nil && a.Memory == nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "overcommit default: give --cpu, --memory or both")
	}
	d, err := getOvercommitDefault(ac.tx)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, d.Version, "the overcommit default"); err != nil {
		return nil, err
	}
	if a.CPU != nil {
		if err := ValidMultiplier("cpu", *a.CPU); err != nil {
			return nil, err
		}
		d.CPU = *a.CPU
	}
	if a.Memory != nil {
		if err := ValidMultiplier("memory", *a.Memory); err != nil {
			return nil, err
		}
		d.Memory = *a.Memory
	}
	d.Version++
	markAllNodesChanged(ac)
	return d, putJSON(ac.tx, bucketMeta, keyOvercommit, d)
}

func applyOvercommitSet(ac *applyCtx) (any, error) {
	var a OvercommitSetArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if a.CPU == nil && a.Memory == nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "overcommit of node %s: give --cpu, --memory or both", a.NodeID)
	}
	// A fixed order (not a map): replicas must report the same error.
	for _, it := range []struct {
		item string
		c    *MultiplierChange
	}{{"cpu", a.CPU}, {"memory", a.Memory}} {
		if it.c != nil && !it.c.Default {
			if err := ValidMultiplier(it.item, it.c.Value); err != nil {
				return nil, err
			}
		}
	}
	return changeAdminNode(ac, a.NodeID, "overcommit set", func(n *api.Node) error {
		o := api.OvercommitOverride{}
		if n.OvercommitOverride != nil {
			o = *n.OvercommitOverride
		}
		o.CPU = applyChange(o.CPU, a.CPU)
		o.Memory = applyChange(o.Memory, a.Memory)
		n.OvercommitOverride = &o
		if o.CPU == nil && o.Memory == nil {
			n.OvercommitOverride = nil
		}
		return nil
	})
}

func applyChange(cur *api.Milli, c *MultiplierChange) *api.Milli {
	switch {
	case c == nil:
		return cur
	case c.Default:
		return nil
	default:
		v := c.Value
		return &v
	}
}

func applyOvercommitAck(ac *applyCtx) (any, error) {
	var a OvercommitAckArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	n, err := currentSession(ac.tx, a.NodeID, a.SessionID)
	if err != nil {
		return nil, err
	}
	v := a.Values
	n.OvercommitAck = &v
	if err := putNode(ac, n); err != nil {
		return nil, err
	}
	return view(ac.tx, n)
}
