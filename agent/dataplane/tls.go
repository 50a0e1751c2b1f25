package dataplane

import (
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// TLSSettings are how a data-plane process serves TLS, fixed for its life:
// the node passes them on the command line. They are what "the TLS
// settings changed" means in the startup table: a process whose settings
// differ from the node's is replaced by a generation that takes over its
// listening socket.
//
// The certificate and key are not settings. The node renews them and
// pushes them with every state, and a running process serves the new pair
// at once; a node restart always brings a new pair (a new key, so a new
// fingerprint), which must not cost a new generation.
type TLSSettings struct {
	// MinVersion is the lowest TLS version accepted: "1.2" or "1.3".
	MinVersion string `json:"min_version"`
	// CipherSuites are the TLS 1.2 suites offered, by their Go names
	// (tls.CipherSuiteName); empty: Go's secure defaults. TLS 1.3 suites
	// are not configurable.
	CipherSuites []string `json:"cipher_suites,omitempty"`
}

// DefaultTLS is what a data-plane process serves without other settings,
// and what a process of an earlier build (whose hello has no settings)
// served.
func DefaultTLS() TLSSettings { return TLSSettings{MinVersion: "1.3"} }

// orDefault is s, or DefaultTLS when s is the zero value.
func (s TLSSettings) orDefault() TLSSettings {
	if s.MinVersion == "" && len(s.CipherSuites) == 0 {
		return DefaultTLS()
	}
	return s
}

// Equal reports whether s and o configure the same TLS.
func (s TLSSettings) Equal(o TLSSettings) bool {
	s, o = s.orDefault(), o.orDefault()
	return s.MinVersion == o.MinVersion && slices.Equal(s.CipherSuites, o.CipherSuites)
}

func (s TLSSettings) String() string {
	s = s.orDefault()
	out := "min " + s.MinVersion
	if len(s.CipherSuites) > 0 {
		out += ", suites " + strings.Join(s.CipherSuites, ",")
	}
	return out
}

// Validate checks that the settings can be served.
func (s TLSSettings) Validate() error {
	_, _, err := s.parse()
	return err
}

func (s TLSSettings) parse() (minVersion uint16, suites []uint16, err error) {
	s = s.orDefault()
	switch s.MinVersion {
	case "1.2":
		minVersion = tls.VersionTLS12
	case "1.3":
		minVersion = tls.VersionTLS13
	default:
		return 0, nil, fmt.Errorf("dataplane: TLS minimum version %q: want 1.2 or 1.3", s.MinVersion)
	}
	if len(s.CipherSuites) > 0 && minVersion == tls.VersionTLS13 {
		return 0, nil, errors.New("dataplane: TLS cipher suites are set but the minimum version is 1.3, whose suites are fixed: set the minimum to 1.2 or drop the suites")
	}
	byName := map[string]uint16{}
	for _, cs := range tls.CipherSuites() {
		byName[cs.Name] = cs.ID
	}
	for _, name := range s.CipherSuites {
		id, ok := byName[name]
		if !ok {
			return 0, nil, fmt.Errorf("dataplane: TLS cipher suite %q is not one Go offers as secure (e.g. TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)", name)
		}
		suites = append(suites, id)
	}
	return minVersion, suites, nil
}

// Args are the command-line flags that give a process these settings.
func (s TLSSettings) Args() []string {
	s = s.orDefault()
	args := []string{"--tls-min-version", s.MinVersion}
	if len(s.CipherSuites) > 0 {
		args = append(args, "--tls-cipher-suites", strings.Join(s.CipherSuites, ","))
	}
	return args
}
