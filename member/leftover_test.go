package member

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
)

// A member upgraded from a build that gave every member an operator
// certificate deletes it at start unless it is ctrl or operator, once.
func TestLeftoverOperatorCertificateRemoved(t *testing.T) {
	for _, tt := range []struct {
		roles []string
		keep  bool
	}{
		{[]string{api.RoleNode}, false},
		{[]string{api.RoleNode, api.RoleOperator}, true},
		{[]string{api.RoleCtrl, api.RoleNode}, true},
	} {
		d := datadir.Dir(t.TempDir())
		if err := os.MkdirAll(filepath.Dir(d.AdminCert()), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := d.SaveIdentity(&datadir.Identity{ClusterID: "c1", NodeID: "n1", Roles: tt.roles}); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(d.AdminCert(), []byte("cert"), 0o600)
		os.WriteFile(d.AdminKey(), []byte("key"), 0o600)
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		for range 2 {
			if err := removeLeftoverAdmin(d, log); err != nil {
				t.Fatalf("roles %v: %v", tt.roles, err)
			}
		}
		if d.HasAdminCertificate() != tt.keep {
			t.Errorf("roles %v: operator certificate kept = %v, want %v", tt.roles, d.HasAdminCertificate(), tt.keep)
		}
		if _, err := os.Stat(d.AdminKey()); (err == nil) != tt.keep {
			t.Errorf("roles %v: operator key kept = %v, want %v", tt.roles, err == nil, tt.keep)
		}
		if n := strings.Count(logs.String(), "leftover operator certificate removed"); n != map[bool]int{true: 0, false: 1}[tt.keep] {
			t.Errorf("roles %v: %d log lines about the removal:\n%s", tt.roles, n, logs.String())
		}
	}
}
