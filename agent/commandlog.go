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

// The node's commands on storage objects are recorded in
// volume-commands.json (runtime.VolumeCommandsFile) before they run and
// again when they ended, and kept there 24 hours: a command ctrl sends
// again after a node restart is answered from the record instead of
// being run twice, and one the restart interrupted runs again (every step
// is safe to repeat: a create finds its file complete or makes it from
// scratch, a grow never shrinks, a remove of a missing file is done).

// commandsKeep is how long an ended command's record is kept.
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
)

// commandRecord is one record of volume-commands.json.
type commandRecord struct {
	CommandID  string `json:"command_id"`
	Kind       string `json:"kind"`
	VolumeID   string `json:"volume_id"`
	PoolID     string `json:"pool_id"`
	Path       string `json:"path,omitempty"`
	SizeBytes  uint64 `json:"size_bytes,omitempty"`
	InstanceID string `json:"instance_id,omitempty"`
	// WorkspaceID: a start made the Volume (--new-volume).
	WorkspaceID       string     `json:"workspace_id,omitempty"`
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

func (l *commandLog) find(id string) (commandRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.CommandID == id {
			return r, true
		}
	}
	return commandRecord{}, false
}

// put records r (replacing the record of its command), drops ended
// records past commandsKeep and writes the file.
func (l *commandLog) put(r commandRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	kept := l.recs[:0]
	for _, x := range l.recs {
		if x.CommandID == r.CommandID || (x.EndedAt != nil && now.Sub(*x.EndedAt) > commandsKeep) {
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
