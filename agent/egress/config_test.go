package egress

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func peer(uid uint32) *unix.Ucred { return &unix.Ucred{Pid: 42, Uid: uid, Gid: uid} }

func TestCompileRefusesBadConfigs(t *testing.T) {
	g := netip.MustParseAddr("10.0.0.2")
	proxy := func(addr string) *Proxy { return &Proxy{Name: "e1", Address: addr} }
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"ipv6 guest", Config{Routes: []Route{{Guest: netip.MustParseAddr("fd00::2"), Egress: proxy("192.0.2.1:1080")}}}, "want a guest IPv4 address"},
		{"duplicate", Config{Routes: []Route{{Guest: g, Egress: proxy("192.0.2.1:1080")}, {Guest: g, Egress: proxy("192.0.2.1:1080")}}}, "has two routes"},
		{"empty route", Config{Routes: []Route{{Guest: g}}}, "neither egress nor resolver"},
		{"no port", Config{Routes: []Route{{Guest: g, Egress: proxy("192.0.2.1")}}}, "want HOST:PORT"},
		{"port 0", Config{Routes: []Route{{Guest: g, Egress: proxy("192.0.2.1:0")}}}, "port 0"},
		{"bad host", Config{Routes: []Route{{Guest: g, Egress: proxy("a b:1080")}}}, "neither an IP address nor a hostname"},
		{"unnamed", Config{Routes: []Route{{Guest: g, Egress: &Proxy{Address: "192.0.2.1:1080"}}}}, "egress without a name"},
		{"long user", Config{Routes: []Route{{Guest: g, Egress: &Proxy{Name: "e1", Address: "192.0.2.1:1080", Username: strings.Repeat("u", 256)}}}}, "at most 255 bytes"},
		{"password alone", Config{Routes: []Route{{Guest: g, Egress: &Proxy{Name: "e1", Address: "192.0.2.1:1080", Password: "p"}}}}, "a password without a username"},
		{"no upstreams", Config{Routes: []Route{{Guest: g, Resolver: &Resolver{Name: "r1"}}}}, "0 upstreams"},
		{"hostname resolver", Config{Resolvers: []string{"dns.example"}}, "want IP or IP:PORT"},
		{"hostname without resolvers", Config{Routes: []Route{{Guest: g, Egress: proxy("socks.example:1080")}}}, "no deployment resolvers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := compile(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("compile: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.1":          "192.0.2.1:53",
		"192.0.2.1:5353":     "192.0.2.1:5353",
		"[2001:db8::1]:5353": "[2001:db8::1]:5353",
		"2001:db8::1":        "[2001:db8::1]:53",
		"dns.example":        "dns.example:53",
		"dns.example.:99":    "dns.example:99",
	} {
		ep, err := parseEndpoint(in, 53)
		if err != nil || ep.String() != want {
			t.Errorf("parseEndpoint(%q) = %v, %v; want %s", in, ep, err, want)
		}
	}
}

func TestCheckCaps(t *testing.T) {
	if err := checkCaps(strings.NewReader("Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapAmb:\t0000000000000000\n")); err != nil {
		t.Fatal(err)
	}
	if err := checkCaps(strings.NewReader("CapPrm:\t0000000000001000\nCapEff:\t0000000000001000\n")); err == nil || !strings.Contains(err.Error(), "holds capabilities") {
		t.Fatalf("with CAP_NET_ADMIN: %v", err)
	}
}

func TestLineLimiter(t *testing.T) {
	l := lineLimiter{perSecond: 1, burst: 2}
	now := time.Unix(1e9, 0)
	if ok, _ := l.allow(now); !ok {
		t.Fatal("first line held back")
	}
	l.allow(now)
	if ok, _ := l.allow(now); ok {
		t.Fatal("third line in the same instant passed a burst of 2")
	}
	ok, suppressed := l.allow(now.Add(1500 * time.Millisecond))
	if !ok || suppressed != 1 {
		t.Fatalf("after a second and a half: %v, %d suppressed; want true, 1", ok, suppressed)
	}
}
