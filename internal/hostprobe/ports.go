package hostprobe

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// reservedLow is the lowest port ReservePorts hands out: well clear of
// the ports services commonly listen on.
const reservedLow = 10000

// ReservePorts finds n consecutive ports of 127.0.0.1, each free for TCP
// and UDP, and keeps them from every other caller of ReservePorts on this
// host until release is called or the process ends.
//
// A port picked by listening on port 0 and closing again lies in the
// kernel's ephemeral range, which the kernel hands to any other process's
// listener on port 0 or outgoing connection before the caller gets to
// bind it (CI lost runs to exactly that). These ports lie below that
// range, so only another explicit pick could take them, and callers of
// ReservePorts exclude each other by holding an abstract unix socket per
// port, which the kernel frees with the process: nothing is left behind.
// The caller keeps release until the ports are no longer needed: the
// garbage collector would close the locks with it.
func ReservePorts(n int) (first int, release func(), err error) {
	if n < 1 {
		return 0, nil, fmt.Errorf("reserve ports: %d ports asked, want at least 1", n)
	}
	high := ephemeralLow()
	if high-reservedLow < 100*n {
		return 0, nil, fmt.Errorf("reserve ports: the ephemeral range starts at %d, leaving too few ports below it", high)
	}
	for range 200 {
		p := reservedLow + rand.IntN(high-reservedLow-n+1)
		if held, ok := hold(p, n); ok {
			return p, func() { closeAll(held) }, nil
		}
	}
	return 0, nil, fmt.Errorf("reserve ports: no %d consecutive free ports on 127.0.0.1 below %d", n, high)
}

// hold takes the locks of ports p..p+n-1 and checks each is free for TCP
// and UDP now; it gives the locks back when one is taken.
func hold(p, n int) ([]io.Closer, bool) {
	var locks []io.Closer
	for q := p; q < p+n; q++ {
		l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: "@kibotos-port-" + strconv.Itoa(q), Net: "unixgram"})
		if err != nil {
			closeAll(locks)
			return nil, false
		}
		locks = append(locks, l)
		if !free(q) {
			closeAll(locks)
			return nil, false
		}
	}
	return locks, true
}

func free(port int) bool {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		return false
	}
	l.Close()
	u, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return false
	}
	u.Close()
	return true
}

func closeAll(cs []io.Closer) {
	for _, c := range cs {
		c.Close()
	}
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if p, err := strconv.Atoi(f[0]); err == nil {
				return p
			}
		}
	}
	return 32768 // the kernel's default
}
