package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/recordfmt"
	"github.com/kibotos/kibotos/storagepool"
)

// The node's commands on storage objects and templates are recorded in
// volume-commands.json (runtime.VolumeCommandsFile) before they run and
// again when they ended, and kept there 24 hours (the process-model
// seed): a command ctrl sends again after a node restart is answered from
// the record instead of being run twice, and one the restart interrupted
// runs again (every step is safe to repeat: a create finds its file
// complete or makes it from scratch, a grow never shrinks, a remove of a
// missing file is done, a fetch continues where it stopped). Recorded are
//   - Volume commands, and a start's creation of a Volume made with its
//     Workspace (the start's command id with the Volume's);
//   - the writable layer's: a start's creation of the layer it boots
//     over, a delete's removal of it;
//   - Template preparation: a start's fetch of a published template the
//     node lacks.
// The last two are steps of a Workspace command, recorded under its
// command id with "/layer" or "/template": the rest of the command runs
// again when ctrl sends it again (it finds its Instance taken over, or
// starts it afresh), the step is answered from its record.
//
// The format stays 1: a build that knows Volume commands alone decodes
// the file leniently and looks records up by a Volume command's id, which
// never names a step, so it keeps the other records (without the fields
// it does not know) until they expire.

// commandsKeep is how long a command's record is kept after it ended (or
// started, while it has not ended).
const commandsKeep = 24 * time.Hour

// maxCommands bounds the records kept (the oldest ended go first).
const maxCommands = 10000

// maxCommandsBytes bounds what is read of the file.
const maxCommandsBytes = 16 << 20

// commandsFormat is the format version this build reads and writes.
const commandsFormat = 1

// Command record states.
const (
	cmdRunning = "running"
	cmdOK      = "ok"
	cmdFailed  = "failed"
	// cmdRefused: the node did not take the command now (a template
	// fetch from a store it cannot reach); the Error says why.
	cmdRefused = "refused"
)

// Kinds of the steps of Workspace commands (Volume commands are recorded
// by their own kind: api.VolCmdCreate...).
const (
	cmdLayerCreate   = "layer_create"
	cmdLayerDelete   = "layer_delete"
	cmdTemplateFetch = "template_fetch"
)

// commandRecord is one record of volume-commands.json.
type commandRecord struct {
	CommandID string `json:"command_id"`
	Kind      string `json:"kind"`
	// VolumeID: a Volume's command; PoolID and Path: a Volume's or a
	// layer's.
	VolumeID   string `json:"volume_id,omitempty"`
	PoolID     string `json:"pool_id,omitempty"`
	Path       string `json:"path,omitempty"`
	SizeBytes  uint64 `json:"size_bytes,omitempty"`
	InstanceID string `json:"instance_id,omitempty"`
	// WorkspaceID: the Workspace whose command made the Volume
	// (--new-volume), or whose layer or template the step is for.
	WorkspaceID string `json:"workspace_id,omitempty"`
	// Template and Digest: the published template a fetch installs.
	Template          string     `json:"template,omitempty"`
	Digest            string     `json:"digest,omitempty"`
	State             string     `json:"state"`
	Error             string     `json:"error,omitempty"`
	FilesystemPending bool       `json:"filesystem_pending,omitempty"`
	StartedAt         time.Time  `json:"started_at"`
	EndedAt           *time.Time `json:"ended_at,omitempty"`
}

type commandsFile struct {
	FormatVersion int             `json:"format_version"`
	Commands      []commandRecord `json:"commands"`
}

// commandLog is the node's volume-commands.json.
type commandLog struct {
	mu   sync.Mutex
	path string
	recs []commandRecord
	// now is the clock of the records' times and their expiry (a test's
	// stand-in; nil: time.Now).
	now func() time.Time
}

func (l *commandLog) clock() time.Time {
	if l.now != nil {
		return l.now().UTC()
	}
	return time.Now().UTC()
}

func openCommandLog(storageRoot string) (*commandLog, error) {
	l := &commandLog{path: filepath.Join(runtime.RegistryDir(storageRoot), runtime.VolumeCommandsFile)}
	f, err := os.Open(l.path)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCommandsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", l.path, err)
	}
	if len(b) > maxCommandsBytes {
		return nil, fmt.Errorf("%s is over %d bytes: not a record this node wrote; move it aside", l.path, maxCommandsBytes)
	}
	var cf commandsFile
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&cf); err != nil {
		return nil, fmt.Errorf("%s is not valid: %v; move it aside (the node then runs commands ctrl sends again once more)", l.path, err)
	}
	if err := recordfmt.Current(commandsFormat).Check(l.path, cf.FormatVersion); err != nil {
		return nil, err
	}
	l.recs = cf.Commands
	return l, nil
}

// find is the unexpired record of command id of kind: by kind as well,
// so a record never answers a command of another kind.
func (l *commandLog) find(id, kind string) (commandRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock()
	for _, r := range l.recs {
		if r.CommandID == id && r.Kind == kind && !r.expired(now) {
			return r, true
		}
	}
	return commandRecord{}, false
}

// put records r (replacing the record of its command), drops the
// expired records and writes the file.
func (l *commandLog) put(r commandRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock()
	kept := l.recs[:0]
	for _, x := range l.recs {
		if x.CommandID == r.CommandID && x.Kind == r.Kind || x.expired(now) {
			continue
		}
		kept = append(kept, x)
	}
	kept = append(kept, r)
	if over := len(kept) - maxCommands; over > 0 {
		kept = kept[over:]
	}
	l.recs = kept
	b, err := json.MarshalIndent(commandsFile{FormatVersion: commandsFormat, Commands: l.recs}, "", " ")
	if err != nil {
		return err
	}
	// Made by the first command: a node that never ran one has none.
	if err := os.MkdirAll(filepath.Dir(l.path), 0o700); err != nil {
		return err
	}
	return storagepool.WriteFile(l.path, append(b, '\n'), 0o600, storagepool.Temp{Purpose: "volume-commands"})
}

// expired says whether r ended more than commandsKeep before now, or
// started that long ago and never ended: it is dropped at the next write,
// and answers nothing meanwhile (a node that was down for days reads such
// records). A command the node's restart interrupted is run again when it
// comes again, with a record or without; one that never comes again (a
// start whose layer was made when the node stopped finds it there next
// time and makes none) would otherwise stay in the file for good.
func (r commandRecord) expired(now time.Time) bool {
	if r.EndedAt == nil {
		return now.Sub(r.StartedAt) > commandsKeep
	}
	return now.Sub(*r.EndedAt) > commandsKeep
}

// answers says whether r answers its command when it comes again: it
// ended, and a fetch did not succeed (a fetched template's answer is the
// template itself, which the start looked for first: one gone since is
// fetched again).
func (r commandRecord) answers() bool {
	if r.Kind == cmdTemplateFetch {
		return r.State == cmdFailed || r.State == cmdRefused
	}
	return r.State != cmdRunning
}

// recorded runs do as the command rec names (CommandID, Kind and what it
// acts on), unless its record answers it; then do does not run and the
// answer is the recorded one. do's refusal, non-empty, says the node does
// not take the command now. The record is written before do runs: a
// command that cannot be recorded does not run.
func (a *Agent) recorded(rec commandRecord, do func() (refusal string, err error)) (string, error) {
	if old, ok := a.commands.find(rec.CommandID, rec.Kind); ok && old.answers() {
		a.log.Info("command answered from its record", "command_id", rec.CommandID, "kind", rec.Kind, "state", old.State, "ended_at", old.EndedAt)
		switch old.State {
		case cmdRefused:
			return old.Error, nil
		case cmdFailed:
			return "", errors.New(old.Error)
		}
		return "", nil
	}
	rec.State, rec.StartedAt = cmdRunning, a.commands.clock()
	if err := a.commands.put(rec); err != nil {
		return "", fmt.Errorf("record command %s in %s: %w", rec.CommandID, runtime.VolumeCommandsFile, err)
	}
	refusal, err := do()
	ended := a.commands.clock()
	rec.State, rec.EndedAt = cmdOK, &ended
	switch {
	case err != nil:
		rec.State, rec.Error = cmdFailed, err.Error()
	case refusal != "":
		rec.State, rec.Error = cmdRefused, refusal
	}
	if perr := a.commands.put(rec); perr != nil {
		a.log.Warn("command result not recorded", "command_id", rec.CommandID, "kind", rec.Kind, "err", perr)
	}
	return refusal, err
}
