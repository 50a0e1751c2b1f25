package units

import (
	"context"
	"fmt"
	"os"
	"strconv"
)

// Environment variables that hand a Target to a child process (a node
// process restarted by a test or benchmark reconnects to the same manager).
const (
	envSocket = "KIBOTOS_UNITS_SOCKET"
	envCgroup = "KIBOTOS_UNITS_CGROUP"
	envPID    = "KIBOTOS_UNITS_MANAGER_PID"
	envNetNS  = "KIBOTOS_UNITS_NETNS_DIR"
	envLogDir = "KIBOTOS_UNITS_LOG_DIR"
)

// Env is the target as environment entries for TargetFromEnv.
func (t Target) Env() []string {
	return []string{envSocket + "=" + t.Socket, envCgroup + "=" + t.CgroupRoot, envPID + "=" + strconv.Itoa(t.ManagerPID),
		envNetNS + "=" + t.NetNSDir, envLogDir + "=" + t.LogDir}
}

// TargetFromEnv reads a target handed over with Target.Env.
func TargetFromEnv() (Target, error) {
	t := Target{Socket: os.Getenv(envSocket), CgroupRoot: os.Getenv(envCgroup), NetNSDir: os.Getenv(envNetNS), LogDir: os.Getenv(envLogDir)}
	pid, err := strconv.Atoi(os.Getenv(envPID))
	if err != nil || t.Socket == "" || t.CgroupRoot == "" {
		return Target{}, fmt.Errorf("units: no target in the environment (%s, %s, %s)", envSocket, envCgroup, envPID)
	}
	t.ManagerPID = pid
	return t, nil
}

// ConnectFromEnv connects to the service manager of a target handed over
// with Target.Env (a child node of a test or a benchmark).
func ConnectFromEnv(ctx context.Context) (*Manager, error) {
	t, err := TargetFromEnv()
	if err != nil {
		return nil, err
	}
	return Connect(ctx, t)
}
