package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/internal/recordfmt"
)

// There is no rollback: a release may write records an older one cannot
// read (or would misread), so the newest release that ever ran a member
// is recorded in its data directory and an older one refuses to start on
// it, before it writes anything. Unreleased builds neither check nor
// record: they are development builds that run on anything.

// ReleaseFile records the newest release that ran this member.
func (d Dir) ReleaseFile() string { return d.path("release.json") }

var releaseRange = recordfmt.Current(1)

type releaseRecord struct {
	FormatVersion int    `json:"format_version"`
	Newest        string `json:"newest"`
}

// newestRelease is the recorded release, "" when none is.
func (d Dir) newestRelease() (string, error) {
	raw, err := os.ReadFile(d.ReleaseFile())
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if err := releaseRange.CheckJSON(d.ReleaseFile(), raw, 1); err != nil {
		return "", fmt.Errorf("release record %w", err)
	}
	var r releaseRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return "", fmt.Errorf("release record %s is corrupt: %w", d.ReleaseFile(), err)
	}
	return r.Newest, nil
}

// CheckRelease refuses to run release (this build's) on the member when
// a newer release already ran it.
func (d Dir) CheckRelease(release string) error {
	cur, err := buildinfo.ParseRelease(release)
	if err != nil {
		return nil // unreleased
	}
	newest, err := d.newestRelease()
	if err != nil {
		return api.Errorf(api.CodeFailedPrecondition, "%v", err)
	}
	if n, err := buildinfo.ParseRelease(newest); err == nil && cur.Compare(n) < 0 {
		return api.Errorf(api.CodeFailedPrecondition, "data directory %s was run by kibotos %s; this is %s and there is no rollback (%s may have written records %s cannot read): run %s or later", d, n, cur, n, cur, n)
	}
	return nil
}

// RecordRelease records release as the newest that ran the member, when
// it is a release newer than the one recorded.
func (d Dir) RecordRelease(release string) error {
	cur, err := buildinfo.ParseRelease(release)
	if err != nil {
		return nil
	}
	newest, err := d.newestRelease()
	if err != nil {
		return err
	}
	if n, err := buildinfo.ParseRelease(newest); err == nil && cur.Compare(n) <= 0 {
		return nil
	}
	raw, _ := json.Marshal(releaseRecord{FormatVersion: releaseRange.Max, Newest: cur.String()})
	return WriteFileAtomic(d.ReleaseFile(), append(raw, '\n'), 0o600)
}
