// Package hostprobe holds the small host facts that tests and benchmarks
// driving real kibotos processes need alike: free ports for a member, an
// environment that does not steer the CLI elsewhere, and which processes
// still mention a scratch directory after cleanup.
package hostprobe

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// FreeMemberPorts finds PORT with PORT, PORT+1 (TCP and UDP), PORT+2 and
// PORT+3 free on 127.0.0.1: a member's API, its gossip, its data plane and
// its metrics.
func FreeMemberPorts() (int, error) {
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p+3 <= 65535 && memberPortsFree(p) {
			return p, nil
		}
	}
	return 0, errors.New("no four free consecutive ports on 127.0.0.1")
}

func memberPortsFree(p int) bool {
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for _, q := range []int{p, p + 1, p + 2, p + 3} {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
		if err != nil {
			return false
		}
		held = append(held, l)
	}
	u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(p+1))
	if err != nil {
		return false
	}
	held = append(held, u)
	return true
}

// CleanEnv is this process's environment without KIBOTOS_* variables, so
// the outer environment cannot steer a CLI or member elsewhere.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KIBOTOS_") {
			env = append(env, kv)
		}
	}
	return env
}

// ProcsMentioning lists the processes (other than this one) whose command
// line mentions s or whose executable lies under s, one line each.
func ProcsMentioning(s string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmdline := strings.ReplaceAll(strings.TrimRight(string(raw), "\x00"), "\x00", " ")
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if strings.Contains(cmdline, s) || strings.HasPrefix(exe, s) {
			if len(cmdline) > 200 {
				cmdline = cmdline[:200] + "..."
			}
			out = append(out, fmt.Sprintf("pid %d: %s", pid, cmdline))
		}
	}
	return out
}
