package api

import (
	"slices"
	"strings"
	"testing"
)

// Every fault of an environment is invalid_argument, names the Workspace
// and the variable, and never quotes a value.
func TestCheckWorkspaceEnv(t *testing.T) {
	long := strings.Repeat("v", MaxWorkspaceEnvValue+1)
	many := make([]string, MaxWorkspaceEnvVars+1)
	for i := range many {
		many[i] = "V" + strings.Repeat("X", i) + "=1"
	}
	big := []string{"A=" + strings.Repeat("a", MaxWorkspaceEnvValue), "B=" + strings.Repeat("b", MaxWorkspaceEnvValue)}
	for _, c := range []struct {
		name string
		env  []string
		want string // "" for none
	}{
		{name: "valid", env: []string{"PATH=/x", "_under=1", "A1=", "EQ=a=b"}},
		{name: "no equals", env: []string{"A=1", "s3cret"}, want: "environment variable 2 of 2 has no '='"},
		{name: "leading digit", env: []string{"1A=s3cret"}, want: `environment variable name "1A" is not valid`},
		{name: "empty name", env: []string{"=s3cret"}, want: `environment variable name "" is not valid`},
		{name: "dash", env: []string{"A-B=s3cret"}, want: `name "A-B" is not valid`},
		{name: "duplicate", env: []string{"A=s3cret", "A=s3cret"}, want: "environment variable A is given twice"},
		{name: "long value", env: []string{"LONG=" + long}, want: "environment variable LONG has a value of 32769 bytes: at most 32768"},
		{name: "NUL", env: []string{"N=s3\x00cret"}, want: "environment variable N has a NUL byte"},
		{name: "too many", env: many, want: "129 environment variables given: at most 128"},
		{name: "too big together", env: big, want: "more than 65536 bytes together (NAME=value, passed at B)"},
	} {
		err := CheckWorkspaceEnv("workspace ws-x", c.env)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want == "":
		case err == nil || CodeOf(err) != CodeInvalidArgument || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "workspace ws-x: "):
			t.Errorf("%s: %v, want invalid_argument naming the Workspace with %q", c.name, err, c.want)
		case strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "vvvv") || strings.Contains(err.Error(), "\n"):
			t.Errorf("%s: %q quotes a value or is not one line", c.name, err)
		}
	}
}

func TestSortedEnvAndNames(t *testing.T) {
	in := []string{"B=2", "A_B=x", "A=1=1"}
	got := SortedEnv(in)
	if want := []string{"A=1=1", "A_B=x", "B=2"}; !slices.Equal(got, want) {
		t.Errorf("sorted %q, want %q", got, want)
	}
	if in[0] != "B=2" {
		t.Errorf("SortedEnv changed its input: %q", in)
	}
	if got, want := EnvNames(got), []string{"A", "A_B", "B"}; !slices.Equal(got, want) {
		t.Errorf("names %q, want %q", got, want)
	}
	if got, want := EnvFromMap(map[string]string{"Z": "1", "A": "x=y"}), []string{"A=x=y", "Z=1"}; !slices.Equal(got, want) {
		t.Errorf("from a map %q, want %q", got, want)
	}
	if SortedEnv(nil) != nil || EnvFromMap(nil) != nil {
		t.Error("an empty environment is not nil")
	}
}
