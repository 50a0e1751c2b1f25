package guest

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

var machineIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// setIdentity gives a restored fork its own identity. The reseed comes
// first: until it, the fork's kernel hands out the same random bytes as
// every other restore of the same memory.
func setIdentity(r guestproto.IdentityRequest) error {
	switch {
	case len(r.Entropy) < guestproto.MinIdentityEntropy || len(r.Entropy) > guestproto.MaxIdentityEntropy:
		return &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("identity: %d bytes of entropy: give %d to %d", len(r.Entropy), guestproto.MinIdentityEntropy, guestproto.MaxIdentityEntropy)}
	case r.MachineID != "" && !machineIDRE.MatchString(r.MachineID):
		return &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("identity: machine id %.40q is not 32 lowercase hex digits", r.MachineID)}
	}
	if err := reseed(r.Entropy); err != nil {
		return err
	}
	if r.Hostname != "" {
		if err := unix.Sethostname([]byte(r.Hostname)); err != nil {
			return fmt.Errorf("identity: set hostname %q: %w", r.Hostname, err)
		}
	}
	if r.MachineID == "" {
		return nil
	}
	for _, root := range r.Roots {
		if err := writeMachineID(root, r.MachineID); err != nil {
			return err
		}
	}
	return nil
}

// reseed mixes b into the kernel's input pool, credited in full, and has
// the CRNG reseed from it at once (RNDRESEEDCRNG) rather than at its next
// scheduled reseed.
func reseed(b []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(b))
	binary.NativeEndian.PutUint32(info[0:], uint32(len(b)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(b)))
	copy(info[8:], b)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); e != 0 {
		return fmt.Errorf("identity: add entropy (RNDADDENTROPY): %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); e != 0 {
		return fmt.Errorf("identity: reseed the CRNG (RNDRESEEDCRNG): %w", e)
	}
	return nil
}

// writeMachineID writes id to root's etc/machine-id when root has an etc
// directory. Neither etc nor machine-id is followed if a symbolic link:
// a Workspace's root is its user's, and must not redirect the write onto
// the agent's own files.
func writeMachineID(root, id string) error {
	rfd, err := unix.Open(filepath.Clean(root), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("identity: root %s: %w", root, err)
	}
	defer unix.Close(rfd)
	efd, err := unix.Openat(rfd, "etc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil // no etc directory: nothing reads a machine id there
	}
	defer unix.Close(efd)
	fd, err := unix.Openat(efd, "machine-id", unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return fmt.Errorf("identity: open %s: %w", filepath.Join(root, "etc/machine-id"), err)
	}
	f := os.NewFile(uintptr(fd), "machine-id")
	defer f.Close()
	_, err = f.WriteString(id + "\n")
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return fmt.Errorf("identity: write %s: %w", filepath.Join(root, "etc/machine-id"), err)
	}
	return nil
}
