package api

import "time"

// Personal operator credentials: a certificate of kind operator issued on
// purpose to a person (kibo operator issue), listed and revocable, as
// opposed to the operator certificate a ctrl or operator member's host
// holds in its data directory.

// OperatorIssueRequest asks ctrl to sign an operator certificate for
// PublicKey (the private key stays where it was made). TTL is a duration
// such as 720h; empty is the maximum.
type OperatorIssueRequest struct {
	WriteMeta
	Name      string `json:"name"`
	PublicKey string `json:"public_key"` // PEM
	TTL       string `json:"ttl,omitempty"`
}

// Operator is the record of a personal operator credential.
type Operator struct {
	Name      string    `json:"name"`
	IssuedAt  time.Time `json:"issued_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// IssuedBy is the actor that issued it (admin@NODE or operator:NAME).
	IssuedBy string `json:"issued_by"`
	// KeyFingerprint is the SHA-256 of the public key's DER, hex.
	KeyFingerprint string     `json:"key_fingerprint"`
	RevokedAt      *time.Time `json:"revoked_at,omitempty"`
	// State is derived when read: active, revoked or expired.
	State string `json:"state"`
}

// Operator states.
const (
	OperatorActive  = "active"
	OperatorRevoked = "revoked"
	OperatorExpired = "expired"
)

// OperatorIssueResponse is the signed certificate and the cluster CA, PEM.
type OperatorIssueResponse struct {
	Operator Operator `json:"operator"`
	Cert     string   `json:"cert"`
	CACert   string   `json:"ca_cert"`
}
