// Package hostprobe holds the small host facts that tests and benchmarks
// driving real kibotos processes need alike: ports reserved for a member, an
// environment that does not steer the CLI elsewhere, and which processes
// still mention a scratch directory after cleanup.
package hostprobe

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

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
