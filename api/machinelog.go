package api

import (
	"bytes"
	"net/url"
	"regexp"
	"strconv"
)

// Bounds of `workspace logs`: what one read returns of each log (the
// guest console and the VMM's own), so an answer never grows with what a
// guest wrote. The node keeps at most 8 MiB of a running guest's console
// and 64 KiB of each log of an ended Instance.
const (
	MachineLogDefaultBytes = 256 << 10
	MachineLogMaxBytes     = 1 << 20
	// MachineLogMaxLines bounds --tail.
	MachineLogMaxLines = 100000
)

// MachineLog is `workspace logs`: the tail of one Instance's machine logs
// as the node holding them has them.
type MachineLog struct {
	WorkspaceID string `json:"workspace_id,omitempty"`
	InstanceID  string `json:"instance_id"`
	NodeID      string `json:"node_id"`
	// Live: read from the Instance the node still holds (running, or
	// ended and not yet removed); else from the tails the node kept in
	// machine-logs/ when it removed the Instance.
	Live bool `json:"live"`
	// Running: the Instance is starting or running; its console may grow.
	Running bool   `json:"running"`
	Console string `json:"console"`
	// ConsoleTruncated: the node has more of the console than this.
	ConsoleTruncated bool   `json:"console_truncated,omitempty"`
	VMM              string `json:"vmm"`
	VMMTruncated     bool   `json:"vmm_truncated,omitempty"`
	// ConsoleCursor (live only) is where this read of the console ended:
	// a read with after= it returns only what the guest wrote since
	// (--follow). Opaque to the caller.
	ConsoleCursor string `json:"console_cursor,omitempty"`
}

// MachineLogQuery is what a read asks for: the last MaxBytes of each log,
// then of that the last Lines lines (0: all); with After (a
// ConsoleCursor of an earlier read) only the console written since.
type MachineLogQuery struct {
	MaxBytes int64
	Lines    int
	After    string
}

// Values encodes the query for a URL.
func (q MachineLogQuery) Values() url.Values {
	v := url.Values{}
	if q.MaxBytes != 0 {
		v.Set("max_bytes", strconv.FormatInt(q.MaxBytes, 10))
	}
	if q.Lines != 0 {
		v.Set("tail", strconv.Itoa(q.Lines))
	}
	if q.After != "" {
		v.Set("after", q.After)
	}
	return v
}

// ParseMachineLogQuery reads max_bytes (default MachineLogDefaultBytes,
// at most MachineLogMaxBytes) and tail (lines, 0 for all).
func ParseMachineLogQuery(v url.Values) (MachineLogQuery, error) {
	q := MachineLogQuery{MaxBytes: MachineLogDefaultBytes}
	if s := v.Get("max_bytes"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 || n > MachineLogMaxBytes {
			return q, Errorf(CodeInvalidArgument, "max bytes %q: give a count from 1 to %d", s, MachineLogMaxBytes)
		}
		q.MaxBytes = n
	}
	if s := v.Get("tail"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > MachineLogMaxLines {
			return q, Errorf(CodeInvalidArgument, "tail %q: give a number of lines from 0 (all) to %d", s, MachineLogMaxLines)
		}
		q.Lines = n
	}
	if s := v.Get("after"); s != "" {
		if !cursorPattern.MatchString(s) {
			return q, Errorf(CodeInvalidArgument, "after %q is not a console cursor of an earlier read", s)
		}
		q.After = s
	}
	return q, nil
}

// Apply keeps the last q.Lines lines of l's logs (it was read within
// q.MaxBytes), marking what it cut as truncated.
func (q MachineLogQuery) Apply(l *MachineLog) {
	var cut bool
	l.Console, cut = lastLines(l.Console, q.Lines)
	l.ConsoleTruncated = l.ConsoleTruncated || cut
	l.VMM, cut = lastLines(l.VMM, q.Lines)
	l.VMMTruncated = l.VMMTruncated || cut
}

// lastLines is the last n lines of s (n 0: s); a final line without a
// newline counts as a line.
func lastLines(s string, n int) (string, bool) {
	if n <= 0 {
		return s, false
	}
	b := []byte(s)
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	for i := end; i > 0; {
		j := bytes.LastIndexByte(b[:i], '\n')
		if j < 0 {
			break
		}
		n--
		if n == 0 {
			return s[j+1:], true
		}
		i = j
	}
	return s, false
}

// instanceIDPattern is what ctrl makes Instance ids of ("inst-" and 26
// base32 characters); anything else names no Instance, and never a path.
var instanceIDPattern = regexp.MustCompile(`^inst-[a-z2-7]{26}$`)

// cursorPattern is a console cursor's form (an inode and an offset).
var cursorPattern = regexp.MustCompile(`^[0-9]{1,20}\.[0-9]{1,19}$`)

// ValidInstanceID reports whether s has the form of an Instance id.
func ValidInstanceID(s string) bool { return instanceIDPattern.MatchString(s) }
