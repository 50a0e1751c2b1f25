package e2b

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Signed file URLs (the SDKs' downloadUrl and uploadUrl): GET or POST
// /files without an access token, with a signature of the path, the
// operation, the user and the sandbox's envdAccessToken, and optionally
// an expiry, as envd checks them. The token is that of the key that
// created the sandbox: a URL signed with it reads or writes that one file
// as that key until it expires, or until the key is revoked.

// fileSignature is the SDKs' signature of a file URL: "v1_" and the
// unpadded base64 SHA-256 of path:operation:user:token[:expiration].
func fileSignature(path, operation, user, token, expiration string) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// signedToken is the token a signed file URL of sandbox id acts with, if
// its signature is right and not expired.
func (h *handler) signedToken(r *http.Request, id string) (string, error) {
	q := r.URL.Query()
	operation := "read"
	if r.Method == http.MethodPost {
		operation = "write"
	}
	exp := q.Get("signature_expiration")
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return "", rpcErrorf("invalid_argument", "signature_expiration %.20q is not a Unix time", exp)
		}
		if time.Now().Unix() > n {
			return "", rpcErrorf("unauthenticated", "sandbox %s: the signed URL expired at %s: sign a new one", id, time.Unix(n, 0).UTC().Format(time.RFC3339))
		}
	}
	token, err := h.c.Sandboxes.CreatorToken(id)
	if err != nil {
		return "", rpcError(err)
	}
	want := fileSignature(q.Get("path"), operation, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(want), []byte(q.Get("signature"))) != 1 {
		return "", rpcErrorf("unauthenticated", "sandbox %s: the URL's signature is not one of its creator's for %s of this path: sign it with the sandbox's envdAccessToken", id, operation)
	}
	return token, nil
}
