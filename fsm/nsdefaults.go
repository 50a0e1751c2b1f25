package fsm

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Lifetime defaults of a namespace (issue 45): the timeout and action a
// Workspace created there without one gets, and the longest timeout its
// Workspaces may have. With a maximum, no Workspace of the namespace
// lives without an end: a create without a timeout gets the default, or
// the maximum; a set-timeout may neither exceed it nor clear the end.

// OpNamespaceDefaults sets a namespace's lifetime defaults (LevelLifetimes).
const OpNamespaceDefaults = "namespace.set_defaults"

// NamespaceDefaultsArgs replaces a namespace's lifetime defaults.
type NamespaceDefaultsArgs struct {
	Name     string                `json:"name"`
	Defaults api.NamespaceDefaults `json:"defaults"`
}

func applyNamespaceDefaults(ac *applyCtx) (any, error) {
	var a NamespaceDefaultsArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := api.ValidNamespace(a.Name); err != nil {
		return nil, err
	}
	if a.Name == api.DefaultNamespace {
		return nil, api.Errorf(api.CodeFailedPrecondition, "namespace default has no lifetime defaults: it is the operators'; give tenants namespaces of their own")
	}
	if err := namespaceExists(ac.tx, a.Name); err != nil {
		return nil, err
	}
	if err := a.Defaults.Check(a.Name); err != nil {
		return nil, err
	}
	var rec namespaceRecord
	if _, err := getJSON(ac.tx, bucketNamespaces, []byte(a.Name), &rec); err != nil {
		return nil, err
	}
	rec.Defaults = &a.Defaults
	if a.Defaults == (api.NamespaceDefaults{}) {
		rec.Defaults = nil
	}
	if err := putJSON(ac.tx, bucketNamespaces, []byte(a.Name), rec); err != nil {
		return nil, err
	}
	return namespaceView(ac.tx, rec)
}

func namespaceDefaults(tx *bolt.Tx, ns string) (api.NamespaceDefaults, error) {
	var rec namespaceRecord
	if ns == "" {
		return api.NamespaceDefaults{}, nil
	}
	if _, err := getJSON(tx, bucketNamespaces, []byte(ns), &rec); err != nil || rec.Defaults == nil {
		return api.NamespaceDefaults{}, err
	}
	return *rec.Defaults, nil
}

// createLifetime is the timeout and action of a Workspace created in
// namespace ns (stored form) with the ones given.
func createLifetime(tx *bolt.Tx, ns string, seconds int64, action string) (int64, string, error) {
	d, err := namespaceDefaults(tx, ns)
	if err != nil {
		return 0, "", err
	}
	if seconds == 0 {
		seconds = d.TimeoutSeconds
		if action == "" {
			action = d.OnTimeout
		}
	}
	if seconds == 0 {
		seconds = d.MaxTimeoutSeconds
	}
	return seconds, action, maxTimeoutAllows(d, ns, seconds)
}

// setTimeoutAllowed refuses a set-timeout over the namespace's maximum,
// or clearing the end of one that has a maximum.
func setTimeoutAllowed(tx *bolt.Tx, ns string, seconds int64) error {
	d, err := namespaceDefaults(tx, ns)
	if err != nil {
		return err
	}
	return maxTimeoutAllows(d, ns, seconds)
}

// maxTimeoutAllows refuses a timeout (0: none) over the maximum of
// namespace ns.
func maxTimeoutAllows(d api.NamespaceDefaults, ns string, seconds int64) error {
	limit := d.MaxTimeoutSeconds
	switch {
	case limit == 0:
		return nil
	case seconds == 0:
		return api.Errorf(api.CodeInvalidArgument, "namespace %s: its Workspaces end within %s; give a timeout of at most that", ns, time.Duration(limit)*time.Second)
	case seconds > limit:
		return api.Errorf(api.CodeInvalidArgument, "namespace %s: timeout %s is over its maximum %s; give a shorter one", ns, time.Duration(seconds)*time.Second, time.Duration(limit)*time.Second)
	}
	return nil
}
