package runtime

import (
	"bytes"
	"errors"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// An Instance whose VMM the kernel's OOM killer ended is told apart from
// any other unexpected exit: ctrl stops its Workspace instead of failing
// it. Two witnesses, either enough: the result systemd gave the unit
// (oom-kill, which the unit's ExecStopPost appends to the VMM log; systemd
// sees OOM kills only where it owns the memory controller), and the
// kernel's own line in its log ("Killed process PID (...)"), which every
// OOM kill writes whatever the cgroup version.

// kmsgPath is the kernel log device.
const kmsgPath = "/dev/kmsg"

// kmsgMaxBytes bounds one scan of the kernel log (its ring is a few MiB
// at most on hosts with many CPUs).
const kmsgMaxBytes = 16 << 20

// oomKilled reports whether the recorded VMM process was ended by the OOM
// killer.
func oomKilled(p *ProcessRecord, vmmLog string) bool {
	if p == nil {
		return false
	}
	if vmmExitResult(vmmLog) == unitResultOOM {
		return true
	}
	return kernelLogsOOMKill(kmsgPath, p.HostPID, p.StartTime)
}

// vmmExitResult is the result= of the last "kibotos: vmm exited" line of
// the VMM log ("" if none).
func vmmExitResult(path string) string {
	b, err := readTail(path, 4096)
	if err != nil {
		return ""
	}
	i := bytes.LastIndex(b, []byte(VMMExitedLine+" result="))
	if i < 0 {
		return ""
	}
	rest := string(b[i+len(VMMExitedLine+" result="):])
	if j := strings.IndexAny(rest, " \n"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

var oomKillLine = regexp.MustCompile(`Killed process (\d+) \(`)

// kernelLogsOOMKill scans the kernel log for an OOM kill of pid logged
// after the process started (startTicks: clock ticks since boot, as in
// /proc/PID/stat; a record's time is microseconds since boot), so that a
// reused PID's older kill does not count.
func kernelLogsOOMKill(path string, pid int, startTicks uint64) bool {
	// The raw descriptor, not an *os.File: the runtime poller would wait
	// for more records where a read at the end must return EAGAIN.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	startUsec := startTicks * 1_000_000 / clockTicks
	want := strconv.Itoa(pid)
	// /dev/kmsg returns one record per read; a record is at most 8 KiB
	// (and longer ones are truncated by the kernel).
	buf := make([]byte, 8192)
	var total int
	for total < kmsgMaxBytes {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EPIPE) {
			continue // records overwritten while reading: go on with the next
		}
		if err != nil || n <= 0 {
			return false // EAGAIN: the end of the log
		}
		total += n
		if matchOOMRecord(buf[:n], want, startUsec) {
			return true
		}
	}
	return false
}

// matchOOMRecord reads one kmsg record "PRI,SEQ,USEC,FLAGS;MESSAGE\n".
func matchOOMRecord(rec []byte, pid string, startUsec uint64) bool {
	semi := bytes.IndexByte(rec, ';')
	if semi < 0 {
		return false
	}
	fields := strings.Split(string(rec[:semi]), ",")
	if len(fields) < 3 {
		return false
	}
	usec, err := strconv.ParseUint(fields[2], 10, 64)
	if err != nil || usec < startUsec {
		return false
	}
	msg, _, _ := bytes.Cut(rec[semi+1:], []byte("\n"))
	m := oomKillLine.FindSubmatch(msg)
	return m != nil && string(m[1]) == pid
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's start time; 100 on
// every Linux architecture this runs on.
const clockTicks = 100
