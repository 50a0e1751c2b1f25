package api

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// ValidAdvertise checks a member's advertise address, which goes into its
// certificate and which every other member and client dials: HOST:PORT
// with a port from 1 to 65535 and a host that is an IP address (not
// unspecified or multicast) or a DNS name of letters, digits and hyphens
// (no wildcard, no other character), at most 253 bytes.
func ValidAdvertise(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return Errorf(CodeInvalidArgument, "advertise address %s is not HOST:PORT: give the address other members reach this host at, e.g. 10.0.0.5:7000", EscapeText(addr))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return Errorf(CodeInvalidArgument, "advertise address %s has port %s: give a port from 1 to 65535", EscapeText(addr), EscapeText(port))
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" || ip.IsUnspecified() || ip.IsMulticast() {
			return Errorf(CodeInvalidArgument, "advertise address %s: %s is not an address other hosts can reach this one at: give a unicast address without a zone", EscapeText(addr), host)
		}
		return nil
	}
	if !validDNSName(host) {
		return Errorf(CodeInvalidArgument, "advertise address %s: host %s is neither an IP address nor a DNS name (letters, digits and hyphens in dot-separated labels; no wildcard): give the address other members reach this host at", EscapeText(addr), EscapeText(host))
	}
	return nil
}

// validDNSName: RFC 1123 host names, the last label not all digits (that
// would be a mistyped IPv4 address).
func validDNSName(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	return strings.Trim(last, "0123456789") != ""
}
