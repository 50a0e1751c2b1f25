package dataplane

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/credential"
)

// verificationKeys are the keys a pushed state lets credentials be
// signed with: PublicKeys, or PublicKey alone from a node of a build
// before the list. Every key is checked here, before any is used.
func (st State) verificationKeys() ([]ed25519.PublicKey, error) {
	keys := st.PublicKeys
	if len(keys) == 0 {
		keys = []ed25519.PublicKey{st.PublicKey}
	}
	if len(keys) > api.MaxCredentialKeys {
		return nil, fmt.Errorf("dataplane: state: %d verification keys, at most %d (the cluster CA's and, during a rotation, the next CA's): push the keys of the node's welcome", len(keys), api.MaxCredentialKeys)
	}
	for _, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("dataplane: state: verification key is %d bytes, want %d (an ed25519 public key)", len(k), ed25519.PublicKeySize)
		}
	}
	// A process of an earlier build verifies with PublicKey only: it must
	// be the key the list puts first, the one ctrl signs with.
	if len(st.PublicKeys) > 0 && !bytes.Equal(st.PublicKey, keys[0]) {
		return nil, errors.New("dataplane: state: public_key is not the first of public_keys: push the signing key in both")
	}
	return keys, nil
}

// verifyAny verifies token with each key in turn. The signature is the
// only thing that depends on the key (Verify checks it before anything it
// read from the payload), so the first key that is not refused as forged
// decides: accepted, expired or malformed.
func verifyAny(keys []ed25519.PublicKey, token string, now time.Time) (credential.Claims, error) {
	err := errors.New("dataplane: no verification key: the node has not delivered its state")
	for _, k := range keys {
		var c credential.Claims
		if c, err = credential.Verify(k, token, now); !errors.Is(err, credential.ErrForged) {
			return c, err
		}
	}
	return credential.Claims{}, err
}
