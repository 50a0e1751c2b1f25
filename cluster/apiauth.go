package cluster

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
)

// apiRoutes is the member's route table as the API listener a serves
// it: the same routes and rules, for callers with an API key, each key
// held to its rate.
func (s *Server) apiRoutes(a *apiListener) http.Handler {
	return s.authenticateBearer(a, s.routeMux())
}

// authenticateBearer admits a request to the API listener only with an
// API key the key store accepts, within the key's rate. What members
// tell each other (who a forwarded request speaks for, how often it was
// forwarded) means nothing from an application and is dropped, and no
// client certificate is asked for: the key is the only credential here.
// An address past its budget of refusals gets 429 for a request without
// a valid key, unaudited; its valid keys still pass.
func (s *Server) authenticateBearer(a *apiListener, next http.Handler) http.Handler {
	limit := a.limit
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		for _, h := range actorHeaders {
			r.Header.Del(h)
		}
		r.Header.Del(hdrForwarded)
		if r.URL.Path == joinPath {
			// Hosts join at a member's own port; an application has no
			// business with grants.
			fail(api.Errorf(api.CodeNotFound, "the API listener of member %s does not serve %s: a host joins at a member's address (kibotos join)", s.id.NodeID, joinPath)).render(w)
			return
		}
		c, err := s.bearerRequest(r)
		if err != nil {
			host := remoteHost(r)
			if !a.refusals.allow(host) {
				w.Header().Set("Retry-After", "1")
				fail(api.Errorf(api.CodeResourceExhausted, "member %s refused too many requests without a valid API key from %s (at most %d a second after %d): check the key (kibo api-key list) and retry later",
					s.id.NodeID, host, refusedRate, refusedBurst)).render(w)
				return
			}
			a.refusals.refused(host)
			s.auditRefused(r, "", err)
			if api.CodeOf(err) == api.CodeUnauthenticated {
				w.Header().Set("WWW-Authenticate", `Bearer realm="kibotos"`)
			}
			fail(err).render(w)
			return
		}
		s.serveKeyCaller(limit, c, next, w, r)
	})
}

// serveKeyCaller serves r for the key caller c, within the key's rate.
func (s *Server) serveKeyCaller(limit *buckets, c caller, next http.Handler, w http.ResponseWriter, r *http.Request) {
	if ok, wait := limit.take(c.name, time.Now()); !ok {
		secs := retryAfter(wait)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		fail(api.Errorf(api.CodeResourceExhausted, "%s is over its rate limit on member %s (%g requests a second, bursts of %d): retry in %d s, or spread its calls",
			c.name, s.id.NodeID, limit.rate, int(limit.burst), secs)).render(w)
		return
	}
	next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, c)))
}

// bearerRequest is the caller of r's API key.
func (s *Server) bearerRequest(r *http.Request) (caller, error) {
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		return caller{}, api.Errorf(api.CodeUnauthenticated, "request to the API of member %s carries no API key: send the header Authorization: Bearer KEY (kibo --token or KIBOTOS_TOKEN)", s.id.NodeID)
	}
	// The key store of this member's replica (tenants.go): the listener
	// runs on ctrl members only, which hold one.
	c, err := s.apiKeyCaller(token)
	if err != nil {
		return caller{}, err
	}
	if c.kind != kindAPIKey || c.key == nil {
		// The listener speaks for keys only, whatever the store says.
		return caller{}, api.Errorf(api.CodeInternal, "member %s: the key store named a %q caller for an API key; report this", s.id.NodeID, c.kind)
	}
	return c, nil
}

// bearerToken is the credential of an Authorization: Bearer header
// (RFC 6750; the scheme's case does not matter).
func bearerToken(h string) (string, bool) {
	scheme, token, _ := strings.Cut(strings.TrimSpace(h), " ")
	token = strings.TrimSpace(token)
	return token, strings.EqualFold(scheme, "Bearer") && token != ""
}
