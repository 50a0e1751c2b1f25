package api

import "testing"

func TestDomainRules(t *testing.T) {
	for in, want := range map[string]string{
		"example.com": "example.com", "*.Example.COM.": "*.example.com", "a-b.c_d.example.org": "a-b.c_d.example.org",
	} {
		if got, ok := CanonicalDomainRule(in); !ok || got != want {
			t.Errorf("CanonicalDomainRule(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "*", "*.com", "com", "localhost", "10.0.0.0/8", "10.0.0.1", "a.*.example.com", "*example.com",
		"-a.example.com", "a-.example.com", "example.com/x", "http://example.com", "a..example.com", "example.123"} {
		if got, ok := CanonicalDomainRule(bad); ok {
			t.Errorf("CanonicalDomainRule(%q) = %q, ok; want refused", bad, got)
		}
	}
	for _, c := range []struct {
		rule, name string
		want       bool
	}{
		{"example.com", "example.com.", true}, {"example.com", "EXAMPLE.com", true}, {"example.com", "www.example.com", false},
		{"*.example.com", "www.example.com.", true}, {"*.example.com", "a.b.example.com", true}, {"*.example.com", "example.com", false},
		{"*.example.com", "badexample.com", false}, {"*.example.com", ".example.com", false},
	} {
		if got := DomainRuleMatches(c.rule, c.name); got != c.want {
			t.Errorf("DomainRuleMatches(%q, %q) = %v", c.rule, c.name, got)
		}
	}
}
