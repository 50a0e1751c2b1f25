package platform

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
)

// Debian's x86 kernels are bzImages whose payload is an LZ4 "legacy" frame
// (lz4 -l) followed by the 4-byte uncompressed size. QEMU microvm boots the
// uncompressed ELF directly through its PVH entry note, which skips the
// in-kernel decompressor, so the Platform ships that ELF.

var lz4LegacyMagic = []byte{0x02, 0x21, 0x4c, 0x18}

// maxVmlinux bounds the decompressed size so a corrupt size field cannot make
// us allocate without limit.
const maxVmlinux = 512 << 20

// extractVmlinux returns the uncompressed vmlinux ELF inside bzImage.
func extractVmlinux(bzImage []byte) ([]byte, error) {
	payload, err := bzImagePayload(bzImage)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(payload, lz4LegacyMagic) {
		return nil, fmt.Errorf("kernel payload is not LZ4 (starts with % x): only LZ4 kernels are supported", payload[:min(4, len(payload))])
	}
	if len(payload) < 8 {
		return nil, errors.New("kernel payload is truncated")
	}
	size := binary.LittleEndian.Uint32(payload[len(payload)-4:])
	if size > maxVmlinux {
		return nil, fmt.Errorf("kernel payload claims %d bytes uncompressed, more than the %d allowed", size, maxVmlinux)
	}
	out, err := lz4LegacyDecode(payload[:len(payload)-4], int(size))
	if err != nil {
		return nil, fmt.Errorf("decompress kernel: %w", err)
	}
	if len(out) != int(size) {
		return nil, fmt.Errorf("decompressed kernel is %d bytes, the bzImage says %d", len(out), size)
	}
	if err := checkPVH(out); err != nil {
		return nil, err
	}
	return out, nil
}

// bzImagePayload locates the compressed kernel with the boot protocol header
// (payload_offset/payload_length, protocol 2.08+); without a header it falls
// back to the first LZ4 magic, as a shell script would with grep.
func bzImagePayload(img []byte) ([]byte, error) {
	if len(img) >= 0x250 && string(img[0x202:0x206]) == "HdrS" && binary.LittleEndian.Uint16(img[0x206:]) >= 0x208 {
		setupSects := int(img[0x1f1])
		if setupSects == 0 {
			setupSects = 4
		}
		off := (setupSects+1)*512 + int(binary.LittleEndian.Uint32(img[0x248:]))
		n := int(binary.LittleEndian.Uint32(img[0x24c:]))
		if off < 0 || n < 0 || off+n > len(img) {
			return nil, fmt.Errorf("bzImage payload %d+%d lies outside the %d-byte image", off, n, len(img))
		}
		return img[off : off+n], nil
	}
	i := bytes.Index(img, lz4LegacyMagic)
	if i < 0 {
		return nil, errors.New("no bzImage header and no LZ4 stream in the kernel image")
	}
	return img[i:], nil
}

// checkPVH verifies the ELF has the Xen PVH entry note QEMU needs to boot it.
func checkPVH(b []byte) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("decompressed kernel is not an ELF: %w", err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("decompressed kernel is for %v, not x86-64", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes := make([]byte, p.Filesz)
		if _, err := p.ReadAt(notes, 0); err != nil {
			continue
		}
		if hasNote(notes, "Xen", 18) { // XEN_ELFNOTE_PHYS32_ENTRY
			return nil
		}
	}
	return errors.New("decompressed kernel has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): QEMU cannot boot it directly")
}

func hasNote(b []byte, name string, typ uint32) bool {
	for len(b) >= 12 {
		nsz := binary.LittleEndian.Uint32(b[0:])
		dsz := binary.LittleEndian.Uint32(b[4:])
		t := binary.LittleEndian.Uint32(b[8:])
		b = b[12:]
		nlen := int(align4(nsz))
		dlen := int(align4(dsz))
		if nlen > len(b) || int(nsz) > len(b) {
			return false
		}
		n := string(bytes.TrimRight(b[:nsz], "\x00"))
		if n == name && t == typ {
			return true
		}
		if nlen+dlen > len(b) {
			return false
		}
		b = b[nlen+dlen:]
	}
	return false
}

func align4(n uint32) uint32 { return (n + 3) &^ 3 }
