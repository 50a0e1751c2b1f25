package fsm

import (
	bolt "go.etcd.io/bbolt"
)

// applyCtx is what the apply of one entry works with, handed down
// explicitly from ApplyBatch to the op's handler and every helper that
// writes: the batch's transaction, the entry, the batch's derived indexes
// and what this entry's placements decided. Nothing reaches a handler
// any other way, so two FSMs applying at once (a test's replicas) share
// nothing. Read-only queries, which run outside any apply, take the
// *bolt.Tx alone.
type applyCtx struct {
	tx *bolt.Tx
	e  *Entry

	// Derived from the state, never part of it, and owned by the FSM:
	// the placement cache (placecache.go) and the command log's index
	// (commandlog.go), both brought up to date for this batch.
	cache    *placeCache
	commands *commandIndex

	// tally is what this entry's placements decided (placements.go);
	// nil when the entry counts none (Entry.CountPlacements unset).
	tally *placementTally

	// scope is the namespace and role of the API key the entry was
	// written for (scope.go); nil for every other actor.
	scope *keyScope
}

// handler applies one op. It either succeeds or rejects the entry with
// an *api.Error before its first write (see the package comment).
type handler func(ac *applyCtx) (any, error)
