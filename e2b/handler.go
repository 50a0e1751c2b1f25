package e2b

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/api"
)

// EnvdVersion is the envd version sandboxes report: the SDKs turn on
// what a version has (2.51 refuses a sandbox below 0.1.0). From 0.4.0
// they send no user unless told one, so commands run as the template's
// user, as envd 0.4 does; 0.5.2 lets them close a command's stdin, 0.5.7
// upload files as octet-stream bodies, gzip-compressed when asked. 0.6
// adds file metadata and entries in watch events, not served yet.
const EnvdVersion = "0.5.7"

// ClientID is the clientID of every sandbox (E2B names the orchestrator
// node there; a sandbox here may move).
const ClientID = "kibotos"

// DefaultTimeout is E2B's: a sandbox created without one ends 300 s after
// its start.
const DefaultTimeout = 300

// maxBody bounds a request body: the largest, a create, is metadata and
// a few lists.
const maxBody = 1 << 20

// Config is what the handler needs of its member.
type Config struct {
	// Client is the Kibotos API as the holder of key sees it, called for
	// a request from remote (the caller's address, for the API's limits
	// per address).
	Client func(key, remote string) *api.Client
	// BaseTemplate is the template E2B's "base" means; other template IDs
	// are template names.
	BaseTemplate string
	// Sandboxes serves the sandbox API (envd); nil: not served.
	Sandboxes Sandboxes
	// Domain is the domain of the sandboxes' hosts the SDKs build
	// (<port>-<sandboxID>.<domain>); "" leaves it to the SDK's
	// E2B_DOMAIN.
	Domain string
	Log    *slog.Logger
}

// handler serves the routes of the control API.
type handler struct {
	c   Config
	mux *http.ServeMux
}

// NewHandler is the control API's handler.
func NewHandler(c Config) http.Handler {
	h := &handler{c: c, mux: http.NewServeMux()}
	for _, r := range []struct {
		pattern string
		fn      func(*call) error
	}{
		{"POST /sandboxes", h.create},
		{"POST /v2/sandboxes", h.create},
		{"GET /sandboxes", h.listRunning},
		{"GET /v2/sandboxes", h.list},
		{"GET /sandboxes/{id}", h.get},
		{"DELETE /sandboxes/{id}", h.kill},
		{"POST /sandboxes/{id}/timeout", h.setTimeout},
		{"GET /sandboxes/{id}/metrics", h.metrics},
		{"POST /sandboxes/{id}/fork", h.fork},
		{"PUT /sandboxes/{id}/network", h.updateNetwork},
		{"POST /sandboxes/{id}/snapshots", h.createSnapshot},
		{"GET /snapshots", h.listSnapshotsPage},
		{"DELETE /templates/{id}", h.deleteSnapshot},
		{"POST /sandboxes/{id}/pause", h.pause},
		{"POST /sandboxes/{id}/resume", h.connect},
		{"POST /sandboxes/{id}/connect", h.connect},
		{"POST /v2/sandboxes/{id}/connect", h.connect},
	} {
		h.mux.Handle(r.pattern, h.serve(r.fn))
	}
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, r.Method+" "+r.URL.Path+" is not part of the E2B API that Kibotos serves (see docs/e2b.md)")
	})
	// One address for both APIs (E2B_SANDBOX_URL): the SDKs name the
	// sandbox of a request to its envd in a header.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, port, ok := hostTarget(r.Host, h.c.Domain); ok {
			if strconv.Itoa(port) == envdPort {
				h.envd(w, r, id) // an SDK without E2B_SANDBOX_URL
			} else {
				h.portTraffic(w, r, id, port)
			}
			return
		}
		if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
			h.sandboxTraffic(w, r, id)
			return
		}
		h.mux.ServeHTTP(w, r)
	})
}

// call is one request of a caller with a key.
type call struct {
	w   http.ResponseWriter
	r   *http.Request
	key string
	cl  *api.Client
}

// serve authenticates the request's key and runs fn; an error it returns
// is answered as E2B's JSON with the status the SDKs expect.
func (h *handler) serve(fn func(*call) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := strings.TrimSpace(r.Header.Get("X-API-Key"))
		if key == "" {
			writeError(w, http.StatusUnauthorized, "no API key: send the header X-API-Key with a Kibotos API key (E2B_API_KEY; kibo api-key create NAME --namespace NS --role sandbox)")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if err := fn(&call{w: w, r: r, key: key, cl: h.c.Client(key, r.RemoteAddr)}); err != nil {
			status, msg := errorStatus(err)
			if status == http.StatusTooManyRequests {
				w.Header().Set("Retry-After", "1")
			}
			writeError(w, status, msg)
		}
	})
}

// keyID is the ID of the caller's key ("" for a malformed one, which
// every call of the Kibotos API refuses).
func (c *call) keyID() string {
	id, _, _ := api.ParseKeySecret(c.key)
	return id
}

// decode reads the request's JSON body into v; an empty body leaves v.
func (c *call) decode(v any) error {
	raw, err := io.ReadAll(c.r.Body)
	if err != nil {
		return api.Errorf(api.CodeInvalidArgument, "request body: %v", err)
	}
	if len(strings.TrimSpace(string(raw))) == 0 {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return api.Errorf(api.CodeInvalidArgument, "request body is not the JSON of %s %s: %v", c.r.Method, c.r.URL.Path, err)
	}
	return nil
}

// reply writes v as JSON with status.
func (c *call) reply(status int, v any) error {
	c.w.Header().Set("Content-Type", "application/json")
	c.w.WriteHeader(status)
	return json.NewEncoder(c.w).Encode(v)
}

// noContent is the empty answer of a kill, a timeout and a pause.
func (c *call) noContent() error {
	c.w.WriteHeader(http.StatusNoContent)
	return nil
}

// errorStatus is the HTTP status and message of err, as E2B answers
// them: the SDKs map 400, 401, 403, 404, 409 and 429 to their errors.
func errorStatus(err error) (int, string) {
	var e *api.Error
	if !errors.As(err, &e) {
		return http.StatusInternalServerError, err.Error()
	}
	switch e.Code {
	case api.CodeInvalidArgument, api.CodeTooLarge:
		return http.StatusBadRequest, e.Message
	case api.CodeUnauthenticated:
		return http.StatusUnauthorized, e.Message
	case api.CodePermissionDenied:
		return http.StatusForbidden, e.Message
	case api.CodeNotFound:
		return http.StatusNotFound, e.Message
	case api.CodeFailedPrecondition, api.CodeAlreadyExists, api.CodeAborted:
		return http.StatusConflict, e.Message
	case api.CodeResourceExhausted:
		return http.StatusTooManyRequests, e.Message
	case api.CodeUnavailable, api.CodeDeadlineExceeded:
		return http.StatusServiceUnavailable, e.Message
	}
	return http.StatusInternalServerError, e.Message
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(apiError{Code: status, Message: msg})
}

// seconds reads a timeout in seconds; nil: none given.
func seconds(what string, v *int64) (string, error) {
	if v == nil {
		return "", nil
	}
	if *v <= 0 {
		return "", api.Errorf(api.CodeInvalidArgument, "%s %d s: give a number of seconds above 0", what, *v)
	}
	return strconv.FormatInt(*v, 10) + "s", nil
}
