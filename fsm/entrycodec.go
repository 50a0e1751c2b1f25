package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	json "github.com/segmentio/encoding/json"
)

// LevelEntryFormat is the level of the binary entry format: the leader
// writes entries with EncodeEntry only once every voter reaches it, and
// JSON before (an older build reads only JSON). DecodeEntry reads both,
// so logs and snapshots from before stay readable. Entries of that level
// also key their command records by digest (Entry.CommandDigest).
const LevelEntryFormat = 6

// entryFormatV1 is the first byte of a version-1 binary entry. A JSON
// entry starts with '{'; a later format takes another byte, so a build
// never misreads an entry written by a newer one: it stops on it
// instead, as on an op it does not know.
const entryFormatV1 byte = 0x01

// Flag bits of a version-1 entry. A bit this build does not know makes
// the entry unreadable, never silently dropped.
const (
	flagExpectedVersion byte = 1 << iota
	flagIgnoreUnknown
	flagCountPlacements
	flagCommandDigest
	flagCommandLog
	knownEntryFlags = flagExpectedVersion | flagIgnoreUnknown | flagCountPlacements | flagCommandDigest | flagCommandLog
)

// EncodeEntry writes e in the binary format (version 1):
//
//	0x01, flags, IssuedAt (varint, Unix ns), [ExpectedVersion (uvarint)],
//	CommandID, Actor, Op (each uvarint length + bytes), Args (the rest)
//
// Args stay the JSON the handler decodes: what made the old envelope slow
// was JSON inside JSON (every byte of the arguments scanned twice on
// encode and twice on decode), not the arguments themselves. Nothing is
// escaped, so the bytes of Args are exactly those given.
func EncodeEntry(e *Entry) []byte {
	var flags byte
	if e.ExpectedVersion != nil {
		flags |= flagExpectedVersion
	}
	if e.IgnoreUnknown {
		flags |= flagIgnoreUnknown
	}
	if e.CountPlacements {
		flags |= flagCountPlacements
	}
	if e.CommandDigest {
		flags |= flagCommandDigest
	}
	if e.CommandLog {
		flags |= flagCommandLog
	}
	b := make([]byte, 0, 2+3*binary.MaxVarintLen64+len(e.CommandID)+len(e.Actor)+len(e.Op)+len(e.Args))
	b = append(b, entryFormatV1, flags)
	b = binary.AppendVarint(b, e.IssuedAt.UnixNano())
	if e.ExpectedVersion != nil {
		b = binary.AppendUvarint(b, *e.ExpectedVersion)
	}
	for _, s := range []string{e.CommandID, e.Actor, e.Op} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return append(b, e.Args...)
}

// EncodeEntryJSON writes e in the JSON format every level reads.
func EncodeEntryJSON(e *Entry) ([]byte, error) { return json.Marshal(e) }

// DecodeEntry reads an entry in either format. Every length is checked
// against what is left, so a damaged entry is an error, never a panic or
// an allocation of its claimed size.
func DecodeEntry(data []byte) (Entry, error) {
	var e Entry
	if len(data) == 0 {
		return e, errors.New("empty entry")
	}
	switch data[0] {
	case '{':
		err := json.Unmarshal(data, &e)
		return e, err
	case entryFormatV1:
	default:
		return e, fmt.Errorf("entry format 0x%02x is unknown to this build (a newer kibotos wrote it)", data[0])
	}
	d := entryDecoder{b: data[1:]}
	flags := d.byte()
	if flags&^knownEntryFlags != 0 {
		return e, fmt.Errorf("entry flags 0x%02x are unknown to this build (a newer kibotos wrote it)", flags)
	}
	e.IssuedAt = time.Unix(0, d.varint()).UTC()
	if flags&flagExpectedVersion != 0 {
		v := d.uvarint()
		e.ExpectedVersion = &v
	}
	e.IgnoreUnknown = flags&flagIgnoreUnknown != 0
	e.CountPlacements = flags&flagCountPlacements != 0
	e.CommandDigest = flags&flagCommandDigest != 0
	e.CommandLog = flags&flagCommandLog != 0
	e.CommandID = d.string()
	e.Actor = d.string()
	e.Op = d.string()
	if d.err != nil {
		return Entry{}, d.err
	}
	if len(d.b) > 0 {
		// A copy: the entry outlives nothing of the log's buffer.
		e.Args = append(json.RawMessage(nil), d.b...)
	}
	return e, nil
}

// entryDecoder reads the fields of a binary entry; the first error sticks.
type entryDecoder struct {
	b   []byte
	err error
}

var errEntryTruncated = errors.New("binary entry is truncated")

func (d *entryDecoder) byte() byte {
	if d.err != nil || len(d.b) < 1 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *entryDecoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if d.err != nil || n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *entryDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if d.err != nil || n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *entryDecoder) string() string {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.fail()
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *entryDecoder) fail() {
	if d.err == nil {
		d.err = errEntryTruncated
	}
}
