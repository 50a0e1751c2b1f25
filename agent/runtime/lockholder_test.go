package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The lock's record is only the node's, but check-maintenance reads the
// processes of the cgroup it names: a record that is not JSON of this
// format, or names a cgroup that is not a clean path, blocks the check
// as corrupt; an empty one (a build before the record) is said apart.
func TestLockHolderRecordRefused(t *testing.T) {
	root := t.TempDir()
	path := lockFile(root)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(t.TempDir(), "k.service")
	if err := os.Mkdir(cg, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, content, state string }{
		{"a node in a service, nothing left", `{"format_version":1,"pid":1,"cgroup":"/k.service","cgroup_dir":"` + cg + `"}`, "no helper processes"},
		{"a node in the root cgroup", `{"format_version":1,"pid":1,"cgroup":"/","cgroup_dir":"/sys/fs/cgroup/unified"}`, "helper processes not checked"},
		{"empty", "", "helper processes not checked"},
		{"not JSON", "{pid", "corrupt record"},
		{"a newer format", `{"format_version":99,"pid":1}`, "record format"},
		{"no pid", `{"format_version":1}`, "corrupt record"},
		{"a relative cgroup", `{"format_version":1,"pid":1,"cgroup":"x.service","cgroup_dir":"/sys/fs/cgroup/x.service"}`, "corrupt record"},
		{"a directory outside its cgroup", `{"format_version":1,"pid":1,"cgroup":"/k.service","cgroup_dir":"/sys/fs/cgroup/../../etc/k.service"}`, "corrupt record"},
		{"another cgroup's directory", `{"format_version":1,"pid":1,"cgroup":"/k.service","cgroup_dir":"/sys/fs/cgroup/other"}`, "corrupt record"},
	} {
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		items := helperItems(Config{StorageRoot: root})
		if len(items) != 1 || items[0].State != tc.state || items[0].Blocking != (tc.state == "corrupt record" || tc.state == "record format") || strings.Count(items[0].Detail, "\n") > 0 {
			t.Errorf("%s: %+v; want one item %q", tc.name, items, tc.state)
		}
	}
}
