package api

import (
	"maps"
	"regexp"
	"slices"
	"strings"
)

// A Workspace's environment: variables every process of it gets (exec,
// terminal, E2B's commands), set at create. They are kept as NAME=value
// sorted by name; the values may be secrets, so only the names are shown
// (Workspace.EnvNames) and errors name a variable, never quote its value.

// Bounds of a Workspace's environment.
const (
	MaxWorkspaceEnvVars  = 128
	MaxWorkspaceEnvValue = 32 << 10
	// MaxWorkspaceEnvBytes bounds NAME=value of all of them together.
	MaxWorkspaceEnvBytes = 64 << 10
)

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckWorkspaceEnv says what is wrong with env, the environment of the
// Workspace named by what ("workspace ws-..."), in the order given, so
// every replica finds the same first fault.
func CheckWorkspaceEnv(what string, env []string) error {
	if len(env) > MaxWorkspaceEnvVars {
		return Errorf(CodeInvalidArgument, "%s: %d environment variables given: at most %d", what, len(env), MaxWorkspaceEnvVars)
	}
	seen := make(map[string]bool, len(env))
	total := 0
	for i, e := range env {
		name, value, ok := strings.Cut(e, "=")
		switch {
		case !ok:
			// Not quoted: it may be a value given without its name.
			return Errorf(CodeInvalidArgument, "%s: environment variable %d of %d has no '=': give NAME=value", what, i+1, len(env))
		case !envNamePattern.MatchString(name):
			return Errorf(CodeInvalidArgument, "%s: environment variable name %.64q is not valid: use letters, digits and '_', not starting with a digit", what, name)
		case seen[name]:
			return Errorf(CodeInvalidArgument, "%s: environment variable %s is given twice: give each name once", what, name)
		case len(value) > MaxWorkspaceEnvValue:
			return Errorf(CodeInvalidArgument, "%s: environment variable %s has a value of %d bytes: at most %d", what, name, len(value), MaxWorkspaceEnvValue)
		case strings.IndexByte(value, 0) >= 0:
			return Errorf(CodeInvalidArgument, "%s: environment variable %s has a NUL byte in its value: a process cannot be given one", what, name)
		}
		seen[name] = true
		if total += len(e); total > MaxWorkspaceEnvBytes {
			return Errorf(CodeInvalidArgument, "%s: environment variables take more than %d bytes together (NAME=value, passed at %s): give fewer or shorter ones", what, MaxWorkspaceEnvBytes, name)
		}
	}
	return nil
}

// SortedEnv is env sorted by name, as a Workspace keeps it (a copy).
func SortedEnv(env []string) []string {
	if len(env) == 0 {
		return nil
	}
	out := slices.Clone(env)
	slices.SortStableFunc(out, func(a, b string) int { return strings.Compare(envName(a), envName(b)) })
	return out
}

// EnvNames are the names of env's variables, in its order.
func EnvNames(env []string) []string {
	var out []string
	for _, e := range env {
		out = append(out, envName(e))
	}
	return out
}

// EnvFromMap is a map of variables (E2B's envVars) as NAME=value sorted
// by name.
func EnvFromMap(m map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return out
}

func envName(e string) string {
	name, _, _ := strings.Cut(e, "=")
	return name
}
