package platform

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// lz4LegacyDecode decodes an LZ4 legacy frame (magic 0x184C2102, then blocks
// of at most 8 MiB each prefixed by their compressed size), the format of
// `lz4 -l` that the kernel build uses. sizeHint preallocates the output.
func lz4LegacyDecode(src []byte, sizeHint int) ([]byte, error) {
	const blockMax = 8 << 20
	if len(src) < 4 || binary.LittleEndian.Uint32(src) != 0x184C2102 {
		return nil, errors.New("not an LZ4 legacy frame")
	}
	src = src[4:]
	dst := make([]byte, 0, sizeHint)
	for len(src) > 0 {
		if len(src) < 4 {
			return nil, fmt.Errorf("%d stray bytes after the last block", len(src))
		}
		n := binary.LittleEndian.Uint32(src)
		src = src[4:]
		if n == 0x184C2102 { // concatenated frame
			continue
		}
		if int64(n) > int64(len(src)) || n > blockMax+blockMax/255+16 {
			return nil, fmt.Errorf("block of %d bytes exceeds the %d bytes left", n, len(src))
		}
		var err error
		start := len(dst)
		dst, err = lz4DecodeBlock(dst, src[:n])
		if err != nil {
			return nil, err
		}
		if len(dst)-start > blockMax {
			return nil, fmt.Errorf("block decoded to %d bytes, more than %d", len(dst)-start, blockMax)
		}
		src = src[n:]
	}
	return dst, nil
}

// lz4DecodeBlock appends the decoding of one LZ4 block to dst. Matches may
// reach back into earlier output (the legacy frame does not forbid it).
func lz4DecodeBlock(dst, src []byte) ([]byte, error) {
	i := 0
	for i < len(src) {
		token := src[i]
		i++
		lit := int(token >> 4)
		if lit == 15 {
			for {
				if i >= len(src) {
					return nil, errors.New("truncated literal length")
				}
				b := src[i]
				i++
				lit += int(b)
				if b != 255 {
					break
				}
			}
		}
		if lit > len(src)-i {
			return nil, errors.New("literals run past the block")
		}
		dst = append(dst, src[i:i+lit]...)
		i += lit
		if i == len(src) { // the last sequence has literals only
			break
		}
		if i+2 > len(src) {
			return nil, errors.New("truncated match offset")
		}
		off := int(src[i]) | int(src[i+1])<<8
		i += 2
		if off == 0 || off > len(dst) {
			return nil, fmt.Errorf("match offset %d outside the %d bytes decoded", off, len(dst))
		}
		ml := int(token&15) + 4
		if token&15 == 15 {
			for {
				if i >= len(src) {
					return nil, errors.New("truncated match length")
				}
				b := src[i]
				i++
				ml += int(b)
				if b != 255 {
					break
				}
			}
		}
		pos := len(dst) - off
		if off >= ml {
			dst = append(dst, dst[pos:pos+ml]...)
		} else {
			for k := 0; k < ml; k++ { // overlapping copy repeats the pattern
				dst = append(dst, dst[pos+k])
			}
		}
	}
	return dst, nil
}
