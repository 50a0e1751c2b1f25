package egress

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// peerCred is who is on the other end of a unix connection, as the kernel
// recorded it at connect time.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("egress: control connection: SO_PEERCRED: %w", cerr)
	}
	return cred, nil
}

// checkPeer admits only the node: a peer of uid want (0 in production).
// The socket directory already keeps others out; this also keeps out
// processes of kibotos-egress itself, which own that directory.
func checkPeer(cred *unix.Ucred, want uint32) error {
	if cred.Uid != want {
		return fmt.Errorf("egress: control connection from uid %d (pid %d) refused: only uid %d (the node) may connect", cred.Uid, cred.Pid, want)
	}
	return nil
}
