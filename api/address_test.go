package api

import (
	"strings"
	"testing"
)

func TestValidAdvertise(t *testing.T) {
	for addr, want := range map[string]string{
		"10.0.0.5:7000":           "",
		"[fd00::5]:7000":          "",
		"node-1.example.com:7000": "",
		"localhost:7000":          "",
		"NODE1.Example.COM.:1":    "",
		"*.example.com:7000":      "neither an IP address nor a DNS name",
		"evil\x1b[2J:7000":        `evil\x1b[2J`,
		"a\r\nb:7000":             "neither an IP address",
		"host_name:7000":          "neither an IP address",
		"-lead.example:7000":      "neither an IP address",
		"10.0.0.256:7000":         "neither an IP address", // not an IP, and all digits
		"0.0.0.0:7000":            "not an address other hosts can reach",
		"[::]:7000":               "not an address other hosts can reach",
		"[fe80::1%eth0]:7000":     "without a zone",
		"224.0.0.1:7000":          "not an address other hosts can reach",
		"10.0.0.5":                "is not HOST:PORT",
		"10.0.0.5:0":              "give a port from 1 to 65535",
		"10.0.0.5:70000":          "give a port from 1 to 65535",
		"10.0.0.5:http":           "give a port from 1 to 65535",
		":7000":                   "neither an IP address",
		strings.Repeat("a", 64) + ".example:7000": "neither an IP address",
	} {
		err := ValidAdvertise(addr)
		switch {
		case want == "" && err != nil:
			t.Errorf("ValidAdvertise(%q) = %v; want accepted", addr, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("ValidAdvertise(%q) = %v; want an error containing %q", addr, err, want)
		case err != nil && CheckText("error", err.Error()) != nil:
			t.Errorf("ValidAdvertise(%q)'s error shows unsafe characters: %q", addr, err.Error())
		}
	}
}
