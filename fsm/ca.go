package fsm

import (
	"crypto/x509"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/trust"
)

// CA rotation (LevelCARotation). One record says which CA the cluster is
// moving to and how far: in phase trusting every member is to trust the
// old and the new CA while certificates are still signed by the old; in
// phase signing ctrl signs with the new; its finish makes the new CA the
// only one. Ctrl members act on the record (files, trusted set, signer);
// every other member learns the trusted set from them.
//
// The record holds the new CA's private key: it is in the Raft log and the
// snapshots, which only ctrl voters keep (0600 files in 0700 directories,
// as the CA key itself); a node-only member never receives it.

// Phases of a rotation. After a finish the record stays with no phase:
// its CA is the cluster CA, which a ctrl member that crashed between its
// file renames repairs from at start.
const (
	CAPhaseTrusting = "trusting"
	CAPhaseSigning  = "signing"
)

// Ops of a rotation.
const (
	OpCARotateBegin  = "ca.rotate_begin"
	OpCARotateSign   = "ca.rotate_sign"
	OpCARotateFinish = "ca.rotate_finish"
)

// LevelCARotation is the level of the CA rotation ops.
const LevelCARotation = 13

// keyCARotation is the meta key of the rotation record.
var keyCARotation = []byte("ca_rotation")

// CARotateBeginArgs starts a rotation to a CA the leader made (trust.NewCA
// for the cluster id): its certificate and key (PEM, the data directory's
// forms) and the CA it replaces.
type CARotateBeginArgs struct {
	OldCert string `json:"old_cert"`
	NewCert string `json:"new_cert"`
	NewKey  string `json:"new_key"`
}

// CARotateSignArgs moves the rotation to the new CA named by its
// fingerprint (a sign meant for another rotation changes nothing).
type CARotateSignArgs struct {
	Fingerprint string `json:"fingerprint"`
}

// CARotateFinishArgs ends the rotation to the CA named by its
// fingerprint; Force records that the operator finished it with members
// still on the old CA.
type CARotateFinishArgs struct {
	Fingerprint string `json:"fingerprint"`
	Force       bool   `json:"force,omitempty"`
}

// checkFingerprint refuses an op naming no CA or not the rotation's.
func checkFingerprint(op, fp string, cur *CARotation) error {
	if fp == "" {
		return api.Errorf(api.CodeInvalidArgument, "%s: fingerprint of the new CA is required", op)
	}
	if cur != nil && fp != fingerprintPEM(cur.NewCert) {
		return api.Errorf(api.CodeFailedPrecondition, "%s: CA %s is not the CA of the rotation under way (%s): read kibo ca status again", op, short(fp), short(fingerprintPEM(cur.NewCert)))
	}
	return nil
}

// short is a fingerprint as messages show it.
func short(fp string) string {
	if len(fp) > 16 {
		return fp[:16]
	}
	return fp
}

// CARotation is the record of the latest rotation.
type CARotation struct {
	// Phase is trusting or signing while the rotation is under way, ""
	// once it finished.
	Phase string `json:"phase"`
	// OldCert is the CA being replaced (PEM). Kept after the finish: a
	// ctrl member acts on the record only while its own CA is this one,
	// so a replay of an earlier rotation never undoes a later one.
	OldCert string `json:"old_cert,omitempty"`
	// NewCert and NewKey are the new CA (PEM); after the finish, the
	// cluster CA.
	NewCert   string    `json:"new_cert"`
	NewKey    string    `json:"new_key"`
	StartedAt time.Time `json:"started_at"`
	StartedBy string    `json:"started_by,omitempty"`
	// CommandID is the begin's: the leader makes a new CA for every
	// request, so a retry of the same command is recognized by it before
	// a second CA is made (BegunBy).
	CommandID  string    `json:"command_id,omitempty"`
	SigningAt  time.Time `json:"signing_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	Forced     bool      `json:"forced,omitempty"`
}

// UnderWay reports whether a rotation is in one of its phases.
func (r *CARotation) UnderWay() bool { return r != nil && r.Phase != "" }

// GetCARotation returns the rotation record, nil when no rotation ever began.
func GetCARotation(tx *bolt.Tx) (*CARotation, error) {
	return getRecord[CARotation](tx, bucketMeta, keyCARotation)
}

func applyCARotateBegin(ac *applyCtx) (any, error) {
	var a CARotateBeginArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	cur, err := GetCARotation(ac.tx)
	if err != nil {
		return nil, err
	}
	if cur.UnderWay() {
		return nil, api.Errorf(api.CodeFailedPrecondition, "a CA rotation is under way (phase %s, begun %s by %s): finish it first (kibo ca finish)", cur.Phase, cur.StartedAt.Format(time.RFC3339), cur.StartedBy)
	}
	old, err := trust.ParseCertPEM([]byte(a.OldCert))
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "CA rotation: old_cert: %v", err)
	}
	if cur != nil && trust.Fingerprint(old) != fingerprintPEM(cur.NewCert) {
		return nil, api.Errorf(api.CodeFailedPrecondition, "CA rotation: old_cert is not the cluster CA the last rotation made: the leader's ca.crt is stale; retry on another ctrl member")
	}
	nc, err := trust.ParseCertPEM([]byte(a.NewCert))
	if err != nil || !nc.IsCA {
		return nil, api.Errorf(api.CodeInvalidArgument, "CA rotation: new_cert is not a PEM CA certificate (%v)", err)
	}
	key, err := trust.ParseKeyPEM([]byte(a.NewKey))
	if err != nil || !key.PublicKey.Equal(nc.PublicKey) {
		return nil, api.Errorf(api.CodeInvalidArgument, "CA rotation: new_key is not the key of new_cert (%v)", err)
	}
	if trust.Fingerprint(nc) == trust.Fingerprint(old) {
		return nil, api.Errorf(api.CodeInvalidArgument, "CA rotation: the new CA is the old one")
	}
	rec := CARotation{Phase: CAPhaseTrusting, OldCert: a.OldCert, NewCert: a.NewCert, NewKey: a.NewKey, StartedAt: *at(ac.e), StartedBy: ac.e.Actor, CommandID: ac.e.CommandID}
	return rec.view(), putJSON(ac.tx, bucketMeta, keyCARotation, rec)
}

func applyCARotateSign(ac *applyCtx) (any, error) {
	var a CARotateSignArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	cur, err := rotationNamed(ac, a.Fingerprint)
	if err != nil {
		return nil, err
	}
	if cur == nil || cur.Phase != CAPhaseTrusting {
		return nil, api.Errorf(api.CodeFailedPrecondition, "no CA rotation waits to sign with its new CA (phase %q): begin one with kibo ca rotate", phaseOf(cur))
	}
	cur.Phase, cur.SigningAt = CAPhaseSigning, *at(ac.e)
	return cur.view(), putJSON(ac.tx, bucketMeta, keyCARotation, cur)
}

func applyCARotateFinish(ac *applyCtx) (any, error) {
	var a CARotateFinishArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	cur, err := rotationNamed(ac, a.Fingerprint)
	if err != nil {
		return nil, err
	}
	if cur == nil || cur.Phase != CAPhaseSigning {
		// From trusting, a finish would drop the CA every certificate
		// is still signed by.
		return nil, api.Errorf(api.CodeFailedPrecondition, "the CA rotation cannot finish in phase %q: it finishes once ctrl signs with the new CA (phase signing; kibo ca status)", phaseOf(cur))
	}
	cur.Phase, cur.FinishedAt, cur.Forced = "", *at(ac.e), a.Force
	return cur.view(), putJSON(ac.tx, bucketMeta, keyCARotation, cur)
}

// rotationNamed is the rotation record that a sign or finish entry acts
// on, checked against the new CA's fingerprint the entry names (nil when
// no rotation ever began).
func rotationNamed(ac *applyCtx, fingerprint string) (*CARotation, error) {
	cur, err := GetCARotation(ac.tx)
	if err != nil {
		return nil, err
	}
	if err := checkFingerprint(ac.e.Op, fingerprint, cur); err != nil {
		return nil, err
	}
	return cur, nil
}

// BegunBy reports whether the rotation under way was begun by command id.
func (r *CARotation) BegunBy(id string) bool { return r.UnderWay() && id != "" && r.CommandID == id }

// View is the record without its key, as answers show it.
func (r *CARotation) View() CARotation { return r.view() }

// view is the record without its key, the result of the ops (results go
// to command records and answers).
func (r CARotation) view() CARotation {
	r.NewKey = ""
	return r
}

func phaseOf(r *CARotation) string {
	if r == nil {
		return ""
	}
	return r.Phase
}

func fingerprintPEM(p string) string {
	c, err := trust.ParseCertPEM([]byte(p))
	if err != nil {
		return ""
	}
	return trust.Fingerprint(c)
}

// CACerts are the rotation's certificates parsed, old and new.
func (r *CARotation) CACerts() (old, next *x509.Certificate, err error) {
	if r.OldCert != "" {
		if old, err = trust.ParseCertPEM([]byte(r.OldCert)); err != nil {
			return nil, nil, err
		}
	}
	next, err = trust.ParseCertPEM([]byte(r.NewCert))
	return old, next, err
}
