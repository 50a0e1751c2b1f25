package api

import "time"

// CA rotation (kibo ca rotate, status, finish).

// States of a CA in a rotation's status.
const (
	CAActive = "active" // signs, and is the cluster CA
	CANext   = "next"   // trusted, the CA the rotation moves to
	CAOld    = "old"    // trusted until the finish; signs no more
)

// TrustSet is what ctrl tells every member to trust: the CA certificates
// (PEM; the cluster CA first) and the fingerprint of the one that signs.
type TrustSet struct {
	CAs     []string `json:"cas"`
	Signing string   `json:"signing"`
	Phase   string   `json:"phase,omitempty"`
}

// MemberTrust is one member's side of a rotation: the fingerprints of the
// CAs it trusts and of the CAs that issued its certificates (DataPlane is
// empty on a member without a data plane, or before its first one).
type MemberTrust struct {
	NodeID    string   `json:"node_id"`
	Trusts    []string `json:"trusts"`
	Member    string   `json:"member_issuer"`
	Admin     string   `json:"admin_issuer"` // empty: the member holds no admin certificate
	DataPlane string   `json:"dataplane_issuer,omitempty"`
}

// CAInfo is one CA of the cluster as status shows it.
type CAInfo struct {
	Fingerprint string    `json:"fingerprint"`
	State       string    `json:"state"`
	NotAfter    time.Time `json:"not_after"`
}

// Answers of a member in a rotation's status.
const (
	TrustYes         = "yes"
	TrustNo          = "no"
	TrustUnreachable = "unreachable"
	CertNew          = "new"
	CertOld          = "old"
)

// CAMemberStatus is one admitted member's row of kibo ca status.
type CAMemberStatus struct {
	NodeID     string `json:"node_id"`
	TrustsNew  string `json:"trusts_new"`
	MemberCert string `json:"member_cert"`
	DataPlane  string `json:"data_plane"`
	Error      string `json:"error,omitempty"`
}

// CAStatus is kibo ca status: the CAs, the rotation's phase ("" when
// none is under way) and every admitted member's progress.
type CAStatus struct {
	Phase     string           `json:"phase"`
	StartedAt *time.Time       `json:"started_at,omitempty"`
	StartedBy string           `json:"started_by,omitempty"`
	CAs       []CAInfo         `json:"cas"`
	Members   []CAMemberStatus `json:"members"`
	// Personal lists operator credentials issued to persons, which no
	// member renews: they must be issued again under the new CA.
	Personal []string `json:"personal,omitempty"`
}

// CAFinishRequest ends a rotation; Force finishes with members still on
// the old CA (they must join again).
type CAFinishRequest struct {
	WriteMeta
	Force bool `json:"force,omitempty"`
}
