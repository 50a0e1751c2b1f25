package fsm

import (
	"time"

	json "github.com/segmentio/encoding/json"

	"github.com/kibotos/kibotos/api"
)

// Entry is one Raft log entry: one write. Everything the FSM decides comes
// from the entry and the state, so every replica reaches the same result.
type Entry struct {
	CommandID       string          `json:"command_id,omitempty"`
	ExpectedVersion *uint64         `json:"expected_version,omitempty"`
	IssuedAt        time.Time       `json:"issued_at"` // leader clock, set when the leader appends it
	Actor           string          `json:"actor,omitempty"`
	Op              string          `json:"op"`
	Args            json.RawMessage `json:"args,omitempty"`
	// IgnoreUnknown lets an older FSM skip an op it does not know instead of
	// stopping; only for ops whose loss cannot change any other decision.
	IgnoreUnknown bool `json:"ignore_unknown,omitempty"`
	// CountPlacements: the apply counts its placement decisions in the
	// state (placements.go). The leader sets it on the ops that may place
	// (CountsPlacements) once every voter reaches LevelPlacementCounts;
	// an entry without it counts nothing, as an older build applies it.
	CountPlacements bool `json:"count_placements,omitempty"`
	// CommandDigest: the command record is keyed by a digest of
	// CommandID (commands.go). The leader sets it on entries with a
	// command id once every voter reaches LevelEntryFormat.
	CommandDigest bool `json:"command_digest,omitempty"`
	// CommandLog: the command record goes to the command log
	// (commandlog.go), keyed by its time and the id's digest. The leader
	// sets it on entries with a command id once every voter reaches
	// LevelCommandLog.
	CommandLog bool `json:"command_log,omitempty"`
}

// Result is the outcome of one entry.
type Result struct {
	Error *api.Error      `json:"error,omitempty"`
	Value json.RawMessage `json:"value,omitempty"`
	// Replayed is set when the result comes from the command log.
	Replayed bool `json:"replayed,omitempty"`
}

// Err returns the result's error as an error, or nil.
func (r Result) Err() error {
	if r.Error == nil {
		return nil
	}
	return r.Error
}
