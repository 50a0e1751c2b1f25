// Package recordfmt is how every local record of a node (identity,
// incarnation, launch and ended-Instance records, volume-commands.json,
// holder records, snapshots, installations, templates) says which format
// it is in, and how a build refuses one it does not read: whole, before
// anything of it is used, in the upgrade seed's words (`<path> has
// version 7, this build reads [8 9]`). A record older than a build reads
// is migrated one way by the build that owns the migration; one newer is
// never read (there is no rollback).
package recordfmt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Range is the format versions a build reads of one kind of record.
type Range struct{ Min, Max int }

// Current is the range of a kind of record that has had one format: v.
func Current(v int) Range { return Range{Min: v, Max: v} }

// ErrOutOfRange marks a record of a version the build does not read.
var ErrOutOfRange = errors.New("record format out of range")

// Error is a record of a version outside the range.
type Error struct {
	Path    string
	Version int
	Range   Range
}

func (e *Error) Error() string {
	vs := make([]string, 0, e.Range.Max-e.Range.Min+1)
	for v := e.Range.Min; v <= e.Range.Max; v++ {
		vs = append(vs, strconv.Itoa(v))
	}
	msg := fmt.Sprintf("%s has version %d, this build reads [%s]", e.Path, e.Version, strings.Join(vs, " "))
	if e.Version > e.Range.Max {
		msg += ": a newer kibotos wrote it; run that release again (there is no rollback)"
	}
	return msg
}

func (e *Error) Unwrap() error { return ErrOutOfRange }

// Check refuses version v of the record at path when r does not hold it.
func (r Range) Check(path string, v int) error {
	if v < r.Min || v > r.Max {
		return &Error{Path: path, Version: v, Range: r}
	}
	return nil
}

// Version reads the format_version of a JSON record; a record written
// before it had one is version legacy (0 when the kind never lacked one).
func Version(raw []byte, legacy int) (int, error) {
	var head struct {
		FormatVersion *int `json:"format_version"`
	}
	if err := json.NewDecoder(bytes.NewReader(raw)).Decode(&head); err != nil {
		return 0, err
	}
	if head.FormatVersion == nil {
		return legacy, nil
	}
	return *head.FormatVersion, nil
}

// CheckJSON reads the version of a JSON record and checks it: the one
// call a reader makes before it decodes the rest.
func (r Range) CheckJSON(path string, raw []byte, legacy int) error {
	v, err := Version(raw, legacy)
	if err != nil {
		return fmt.Errorf("%s is corrupt: %w", path, err)
	}
	return r.Check(path, v)
}
