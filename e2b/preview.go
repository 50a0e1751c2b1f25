package e2b

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/api"
)

// Traffic to a sandbox's own ports (E2B's getHost): a request for
// <port>-<sandboxID>.<domain>, or one to E2B_SANDBOX_URL naming another
// port than envd's in E2b-Sandbox-Port, is proxied to that port of the
// guest through its node's data plane, WebSocket upgrades included. As
// on E2B, a sandbox takes such traffic from anyone who knows its address
// unless it was created with network.allowPublicTraffic false; then a
// request needs its trafficAccessToken.

// Labels of a sandbox created through the E2B API, which E2B's metadata
// neither shows nor sets: CreatorLabel is the ID of the key that created
// it (its public traffic and its signed file URLs act as that key, and
// end with it), TrafficLabel how its ports are reached: TrafficPublic, or
// TrafficToken with its trafficAccessToken.
const (
	CreatorLabel  = "e2b/creator"
	TrafficLabel  = "e2b/traffic"
	TrafficPublic = "public"
	TrafficToken  = "token"
)

// reservedLabel says whether a label is Kibotos's own, not metadata.
func reservedLabel(k string) bool { return strings.HasPrefix(k, "e2b/") }

// trafficHeader carries a sandbox's trafficAccessToken.
const trafficHeader = "E2b-Traffic-Access-Token"

// hostTarget is the sandbox and port of a request's host under domain,
// <port>-<sandboxID>.<domain>; ok is false for any other host.
func hostTarget(host, domain string) (id string, port int, ok bool) {
	if domain == "" {
		return "", 0, false
	}
	// The domain may name the listener's port (dev's e2b.localhost:7444),
	// which a browser and the SDK send in Host as well.
	label, found := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(domain))
	if !found {
		if h, _, err := net.SplitHostPort(host); err == nil {
			d := domain
			if dh, _, err := net.SplitHostPort(domain); err == nil {
				d = dh
			}
			label, found = strings.CutSuffix(strings.ToLower(h), "."+strings.ToLower(d))
		}
	}
	if !found {
		return "", 0, false
	}
	p, id, found := strings.Cut(label, "-")
	port, err := strconv.Atoi(p)
	if !found || err != nil || port < 1 || port > 65535 || id == "" || strings.Contains(id, ".") {
		return "", 0, false
	}
	return id, port, true
}

// portTraffic proxies r to port of sandbox id.
func (h *handler) portTraffic(w http.ResponseWriter, r *http.Request, id string, port int) {
	if h.c.Sandboxes == nil {
		writeError(w, http.StatusNotFound, "this member does not serve traffic to sandboxes")
		return
	}
	token := r.Header.Get(trafficHeader)
	gc, err := h.c.Sandboxes.OpenPort(r.Context(), token, id, r.RemoteAddr)
	if err != nil {
		status, msg := errorStatus(err)
		switch status {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
		default:
			// E2B's proxy answers 502 for a sandbox it cannot reach:
			// killed, paused without auto-resume, or not found.
			status = http.StatusBadGateway
			msg = fmt.Sprintf("sandbox %s is not reachable: %s", api.EscapeText(id), msg)
		}
		writeError(w, status, msg)
		return
	}
	defer gc.Close()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", pr.In.Host
			pr.Out.Host = pr.In.Host
			// What opened the sandbox stays here: its ports see the
			// request, not the caller's tokens to it.
			for k := range maps.Keys(pr.Out.Header) {
				if strings.HasPrefix(k, "E2b-") || k == "X-Access-Token" {
					pr.Out.Header.Del(k)
				}
			}
			pr.SetXForwarded()
		},
		// One guest connection per request: each is a stream of the
		// guest session this request opened, closed with it.
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return gc.PortForward(ctx, "127.0.0.1", port)
			},
			DisableKeepAlives: true,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return // the caller went away
			}
			writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: nothing answers on port %d: %v", api.EscapeText(id), port, err))
		},
	}
	proxy.ServeHTTP(w, r)
}
