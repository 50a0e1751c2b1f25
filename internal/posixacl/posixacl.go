// Package posixacl reads, writes and evaluates a file's POSIX access ACL
// (the system.posix_acl_access extended attribute, linux/posix_acl_xattr.h).
// It only computes what the kernel would decide: it never grants anything
// by itself.
package posixacl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"

	"golang.org/x/sys/unix"
)

// Xattr is the extended attribute that holds a file's access ACL.
const Xattr = "system.posix_acl_access"

// Tags of ACL entries.
const (
	UserObj  = 0x01
	User     = 0x02
	GroupObj = 0x04
	Group    = 0x08
	Mask     = 0x10
	Other    = 0x20
)

// NoID is the id of the entries that name no user or group.
const NoID = 0xffffffff

// Permission bits.
const (
	Execute = 0x1
	Write   = 0x2
	Read    = 0x4
)

const version = 2

// maxBytes bounds what is read: 4096 bytes are 511 entries, far beyond
// what a directory carries; a larger attribute is refused, not cut.
const maxBytes = 4096

// Entry is one ACL entry.
type Entry struct {
	Tag, Perm uint16
	ID        uint32
}

// Get reads path's access ACL; nil and no error when it has none (its
// mode bits decide).
func Get(path string) ([]Entry, error) {
	buf := make([]byte, maxBytes)
	n, err := unix.Getxattr(path, Xattr, buf)
	switch {
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP):
		return nil, nil
	case errors.Is(err, unix.ERANGE):
		return nil, fmt.Errorf("ACL of %s: larger than %d bytes", path, maxBytes)
	case err != nil:
		return nil, fmt.Errorf("read the ACL of %s: %w", path, err)
	}
	ents, err := Decode(buf[:n])
	if err != nil {
		return nil, fmt.Errorf("ACL of %s: %w", path, err)
	}
	return ents, nil
}

// Decode parses the attribute's bytes.
func Decode(b []byte) ([]Entry, error) {
	if len(b) < 4 || binary.LittleEndian.Uint32(b) != version || (len(b)-4)%8 != 0 {
		return nil, fmt.Errorf("%d bytes in an unknown format", len(b))
	}
	var ents []Entry
	for b = b[4:]; len(b) > 0; b = b[8:] {
		ents = append(ents, Entry{binary.LittleEndian.Uint16(b), binary.LittleEndian.Uint16(b[2:]), binary.LittleEndian.Uint32(b[4:])})
	}
	return ents, nil
}

// Encode is the attribute's bytes for ents, in the order the kernel
// wants (by tag, then id).
func Encode(ents []Entry) []byte {
	ents = slices.Clone(ents)
	sort.Slice(ents, func(i, j int) bool {
		if ents[i].Tag != ents[j].Tag {
			return ents[i].Tag < ents[j].Tag
		}
		return ents[i].ID < ents[j].ID
	})
	out := binary.LittleEndian.AppendUint32(nil, version)
	for _, e := range ents {
		out = binary.LittleEndian.AppendUint16(out, e.Tag)
		out = binary.LittleEndian.AppendUint16(out, e.Perm)
		out = binary.LittleEndian.AppendUint32(out, e.ID)
	}
	return out
}

// FromMode is the minimal ACL that mode's permission bits mean.
func FromMode(mode uint32) []Entry {
	return []Entry{
		{UserObj, uint16(mode>>6) & 7, NoID},
		{GroupObj, uint16(mode>>3) & 7, NoID},
		{Other, uint16(mode) & 7, NoID},
	}
}

// Allows says whether a process of uid and groups gets perm from a file
// owned by owner that carries ents, as the kernel's posix_acl_permission
// decides (no capabilities considered): the owner's entry, else a named
// user's (under the mask), else any matching group entry granting it
// (under the mask; groups match but none grants: denied), else other.
func Allows(ents []Entry, owner, fileGroup uint32, uid uint32, groups []uint32, perm uint16) bool {
	mask := uint16(7)
	for _, e := range ents {
		if e.Tag == Mask {
			mask = e.Perm
		}
	}
	for _, e := range ents {
		if e.Tag == UserObj && uid == owner {
			return e.Perm&perm == perm
		}
	}
	for _, e := range ents {
		if e.Tag == User && e.ID == uid {
			return e.Perm&mask&perm == perm
		}
	}
	matched := false
	for _, e := range ents {
		var in bool
		switch e.Tag {
		case GroupObj:
			in = slices.Contains(groups, fileGroup)
		case Group:
			in = slices.Contains(groups, e.ID)
		}
		if !in {
			continue
		}
		matched = true
		if e.Perm&mask&perm == perm {
			return true
		}
	}
	if matched {
		return false
	}
	for _, e := range ents {
		if e.Tag == Other {
			return e.Perm&perm == perm
		}
	}
	return false
}
