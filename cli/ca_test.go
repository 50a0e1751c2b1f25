package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
)

func TestCAStatusRendering(t *testing.T) {
	st := api.CAStatus{Phase: "signing",
		CAs: []api.CAInfo{
			{Fingerprint: "aaaa", State: api.CAOld, NotAfter: time.Date(2036, 1, 2, 3, 4, 5, 0, time.UTC)},
			{Fingerprint: "bbbb", State: api.CAActive, NotAfter: time.Date(2036, 12, 1, 0, 0, 0, 0, time.UTC)},
		},
		Members: []api.CAMemberStatus{
			{NodeID: "ctrl-1", TrustsNew: api.TrustYes, MemberCert: api.CertNew, DataPlane: api.CertNew},
			{NodeID: "ctrl-2", TrustsNew: api.TrustYes, MemberCert: api.CertNew},
			{NodeID: "node-3", TrustsNew: api.TrustUnreachable, MemberCert: "-", DataPlane: "-"},
		},
		Personal: []string{"admin@alice"},
	}
	var b bytes.Buffer
	renderCAStatus(&b, st)
	want := `FINGERPRINT  STATE   NOT AFTER
aaaa         old     2036-01-02T03:04:05Z
bbbb         active  2036-12-01T00:00:00Z

PHASE: signing

NODE    TRUSTS NEW   MEMBER CERT  DATA PLANE
ctrl-1  yes          new          new
ctrl-2  yes          new          -
node-3  unreachable  -            -

Operator credentials issued to persons, to issue again under the new CA:
  admin@alice
`
	if got := b.String(); got != want {
		t.Fatalf("kibo ca status:\n%s\nwant:\n%s", got, want)
	}
	b.Reset()
	renderCAStatus(&b, api.CAStatus{CAs: st.CAs[1:]})
	if !strings.Contains(b.String(), "PHASE: none (no rotation under way)") {
		t.Fatalf("status without a rotation:\n%s", b.String())
	}
}
