package guestproto

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// ProtocolVersion is the newest protocol this build speaks; MinProtocolVersion
// the oldest it still accepts.
const (
	ProtocolVersion    = 1
	MinProtocolVersion = 1
)

// Handshake framing. The node sends a hello:
//
//	"KIBOHELO" | min u16 | max u16 | nonce [16] | crc32(IEEE) of the preceding 28 bytes
//
// and the guest answers with an info frame:
//
//	"KIBOINFO" | n u32 | GuestInfo JSON [n] | crc32(IEEE) of n and the JSON
//
// Both readers skip anything before a frame whose checksum holds, so stale
// bytes left in a virtio-serial port by an earlier session do no harm.
var (
	helloMagic = []byte("KIBOHELO")
	infoMagic  = []byte("KIBOINFO")
)

// HelloSize is the size of a hello frame.
const HelloSize = 32

// MaxInfoSize bounds the GuestInfo JSON of a handshake reply.
const MaxInfoSize = 60 << 10

// HandshakeBufferSize is the bufio size the handshake readers need.
const HandshakeBufferSize = MaxInfoSize + 64

// Hello is the node's opening frame.
type Hello struct {
	Min, Max int
	Nonce    [16]byte
}

// NewHello makes a hello with a fresh random nonce.
func NewHello(minVersion, maxVersion int) (Hello, error) {
	h := Hello{Min: minVersion, Max: maxVersion}
	if minVersion < 1 || maxVersion < minVersion || maxVersion > 0xffff {
		return h, fmt.Errorf("guestproto: bad protocol range %d..%d", minVersion, maxVersion)
	}
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return h, fmt.Errorf("guestproto: nonce: %w", err)
	}
	return h, nil
}

// NonceString is the nonce as the guest echoes it.
func (h Hello) NonceString() string { return hex.EncodeToString(h.Nonce[:]) }

// Marshal encodes the hello frame.
func (h Hello) Marshal() []byte {
	b := make([]byte, HelloSize)
	copy(b, helloMagic)
	binary.BigEndian.PutUint16(b[8:], uint16(h.Min))
	binary.BigEndian.PutUint16(b[10:], uint16(h.Max))
	copy(b[12:28], h.Nonce[:])
	binary.BigEndian.PutUint32(b[28:], crc32.ChecksumIEEE(b[:28]))
	return b
}

// ParseHello decodes exactly one hello frame.
func ParseHello(b []byte) (Hello, error) {
	var h Hello
	if len(b) != HelloSize {
		return h, fmt.Errorf("guestproto: hello is %d bytes, want %d", len(b), HelloSize)
	}
	if !bytes.Equal(b[:8], helloMagic) {
		return h, errors.New("guestproto: hello: bad magic")
	}
	if binary.BigEndian.Uint32(b[28:]) != crc32.ChecksumIEEE(b[:28]) {
		return h, errors.New("guestproto: hello: bad checksum")
	}
	h.Min = int(binary.BigEndian.Uint16(b[8:]))
	h.Max = int(binary.BigEndian.Uint16(b[10:]))
	copy(h.Nonce[:], b[12:28])
	if h.Min < 1 || h.Max < h.Min {
		return h, fmt.Errorf("guestproto: hello: bad protocol range %d..%d", h.Min, h.Max)
	}
	return h, nil
}

// LastHello returns the offset of the last valid hello frame in b, or -1.
func LastHello(b []byte) int {
	for i := len(b) - HelloSize; i >= 0; i-- {
		if b[i] == helloMagic[0] {
			if _, err := ParseHello(b[i : i+HelloSize]); err == nil {
				return i
			}
		}
	}
	return -1
}

// skipTo discards bytes until br starts with magic. It returns how many
// bytes were discarded.
func skipTo(br *bufio.Reader, magic []byte) (int, error) {
	skipped := 0
	for {
		p, err := br.Peek(len(magic))
		if bytes.Equal(p, magic) {
			return skipped, nil
		}
		if err != nil {
			if err == io.EOF && len(p) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return skipped, err
		}
		// Drop everything buffered up to the next possible start of magic.
		buf, _ := br.Peek(br.Buffered())
		n := bytes.IndexByte(buf[1:], magic[0])
		if n < 0 {
			n = len(buf)
		} else {
			n++
		}
		d, _ := br.Discard(n)
		skipped += d
	}
}

// ReadHello reads the next valid hello from br, skipping garbage. br must
// have at least HandshakeBufferSize bytes of buffer.
func ReadHello(br *bufio.Reader) (Hello, int, error) {
	skipped := 0
	for {
		n, err := skipTo(br, helloMagic)
		skipped += n
		if err != nil {
			return Hello{}, skipped, err
		}
		p, err := br.Peek(HelloSize)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Hello{}, skipped, err
		}
		h, perr := ParseHello(p)
		if perr == nil {
			br.Discard(HelloSize)
			return h, skipped, nil
		}
		br.Discard(1)
		skipped++
	}
}

// MarshalInfo encodes a handshake reply frame.
func MarshalInfo(info GuestInfo) ([]byte, error) {
	j, err := json.Marshal(info)
	if err != nil {
		return nil, err
	}
	if len(j) > MaxInfoSize {
		return nil, fmt.Errorf("guestproto: guest info is %d bytes, limit %d", len(j), MaxInfoSize)
	}
	b := make([]byte, 12+len(j)+4)
	copy(b, infoMagic)
	binary.BigEndian.PutUint32(b[8:], uint32(len(j)))
	copy(b[12:], j)
	binary.BigEndian.PutUint32(b[12+len(j):], crc32.ChecksumIEEE(b[8:12+len(j)]))
	return b, nil
}

// ReadInfo reads the handshake reply carrying nonce from br, skipping
// garbage and replies to other hellos. br must have at least
// HandshakeBufferSize bytes of buffer.
func ReadInfo(br *bufio.Reader, nonce string) (GuestInfo, int, error) {
	return readInfoFor(br, func(n string) bool { return n == nonce })
}

// readInfoFor is ReadInfo for the reply whose nonce accept takes.
func readInfoFor(br *bufio.Reader, accept func(nonce string) bool) (GuestInfo, int, error) {
	skipped := 0
	for {
		n, err := skipTo(br, infoMagic)
		skipped += n
		if err != nil {
			return GuestInfo{}, skipped, err
		}
		info, size, ok, err := peekInfo(br)
		if err != nil {
			return GuestInfo{}, skipped, err
		}
		if !ok {
			br.Discard(1)
			skipped++
			continue
		}
		br.Discard(size)
		if !accept(info.Nonce) {
			skipped += size // a reply to an earlier hello
			continue
		}
		return info, skipped, nil
	}
}

func peekInfo(br *bufio.Reader) (GuestInfo, int, bool, error) {
	var info GuestInfo
	p, err := br.Peek(12)
	if err != nil {
		return info, 0, false, unexpected(err)
	}
	n := binary.BigEndian.Uint32(p[8:])
	if n > MaxInfoSize {
		return info, 0, false, nil
	}
	size := 12 + int(n) + 4
	p, err = br.Peek(size)
	if err != nil {
		return info, 0, false, unexpected(err)
	}
	if binary.BigEndian.Uint32(p[12+n:]) != crc32.ChecksumIEEE(p[8:12+n]) {
		return info, 0, false, nil
	}
	if err := json.Unmarshal(p[12:12+n], &info); err != nil {
		return info, 0, false, nil
	}
	return info, size, true, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// VersionError is a handshake refused because the peers share no protocol
// version. Its message says which side to upgrade.
type VersionError struct {
	Local       string // "node" or "guest agent"
	LocalMin    int
	LocalMax    int
	RemoteMin   int
	RemoteMax   int
	RemoteLabel string
}

func (e *VersionError) Error() string {
	upgrade := "this " + e.Local
	if e.RemoteMax < e.LocalMin {
		upgrade = "the " + e.RemoteLabel
	}
	return fmt.Sprintf("%s speaks protocol %d..%d, this %s speaks %d..%d: upgrade %s",
		e.RemoteLabel, e.RemoteMin, e.RemoteMax, e.Local, e.LocalMin, e.LocalMax, upgrade)
}

// Negotiate picks the highest version both ranges contain.
func Negotiate(localMin, localMax, remoteMin, remoteMax int, local, remote string) (int, error) {
	lo, hi := max(localMin, remoteMin), min(localMax, remoteMax)
	if lo > hi {
		return 0, &VersionError{Local: local, LocalMin: localMin, LocalMax: localMax,
			RemoteMin: remoteMin, RemoteMax: remoteMax, RemoteLabel: remote}
	}
	return hi, nil
}

// AcceptHandshake is the guest side: it reads the next hello from br, picks
// a version and answers with info (Nonce, Protocol, Min/MaxProtocol filled
// in). A refused hello is answered too, so the node reports the reason, and
// returns a *VersionError.
func AcceptHandshake(br *bufio.Reader, w io.Writer, info GuestInfo, minVersion, maxVersion int) (GuestInfo, error) {
	h, _, err := ReadHello(br)
	if err != nil {
		return info, err
	}
	info.Nonce = h.NonceString()
	info.MinProtocol, info.MaxProtocol = minVersion, maxVersion
	v, verr := Negotiate(minVersion, maxVersion, h.Min, h.Max, "guest agent", "node")
	info.Protocol = v
	if verr != nil {
		info.Refused = verr.Error()
		info.Capabilities = nil
	}
	b, err := MarshalInfo(info)
	if err != nil {
		return info, err
	}
	if _, err := w.Write(b); err != nil {
		return info, fmt.Errorf("guestproto: write handshake reply: %w", err)
	}
	return info, verr
}
