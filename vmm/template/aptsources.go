package template

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Where apt's sources live, in the order apt reads them.
var (
	aptSourcesList = "/etc/apt/sources.list"
	aptSourcesDir  = "/etc/apt/sources.list.d"
)

// HostMirror returns the Debian archive apt uses on this host for suite:
// the URI of the first enabled "deb" source listing that suite, else of the
// first one that is not a security archive. It reads
// /etc/apt/sources.list and /etc/apt/sources.list.d/*.list (one-line
// format) and /etc/apt/sources.list.d/*.sources (deb822 format).
func HostMirror(suite string) (string, error) {
	files := []string{aptSourcesList}
	for _, pattern := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(aptSourcesDir, pattern))
		files = append(files, m...)
	}
	sort.Strings(files[1:])
	return MirrorFromFiles(files, suite)
}

// MirrorFromFiles is HostMirror over the given apt source files; a name
// ending in .sources is deb822, any other the one-line format.
func MirrorFromFiles(files []string, suite string) (string, error) {
	var all []aptSource
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if strings.HasSuffix(f, ".sources") {
			all = append(all, parseDeb822(b)...)
		} else {
			all = append(all, parseOneLine(b)...)
		}
	}
	if m := pickMirror(all, suite); m != "" {
		return m, nil
	}
	return "", fmt.Errorf("no Debian mirror found in %s: pass --mirror URL (e.g. --mirror http://deb.debian.org/debian)", strings.Join(files, ", "))
}

type aptSource struct {
	uri    string
	suites []string
}

func pickMirror(all []aptSource, suite string) string {
	for _, s := range all {
		for _, x := range s.suites {
			if x == suite {
				return s.uri
			}
		}
	}
	for _, s := range all {
		security := false
		for _, x := range s.suites {
			security = security || strings.Contains(x, "security") || strings.HasSuffix(x, "/updates")
		}
		if !security && !strings.Contains(s.uri, "security") {
			return s.uri
		}
	}
	return ""
}

func usableURI(u string) bool {
	return checkMirror(u) == nil
}

// parseOneLine reads `deb [options] URI suite component...` lines.
func parseOneLine(b []byte) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) < 2 || !usableURI(f[0]) {
			continue
		}
		out = append(out, aptSource{uri: strings.TrimRight(f[0], "/"), suites: []string{f[1]}})
	}
	return out
}

// parseDeb822 reads the stanzas of a .sources file: Types, URIs, Suites,
// Enabled; continuation lines start with a space, stanzas end at a blank
// line.
func parseDeb822(b []byte) []aptSource {
	var out []aptSource
	fields := map[string]string{}
	last := ""
	flush := func() {
		defer func() { fields, last = map[string]string{}, "" }()
		if strings.EqualFold(strings.TrimSpace(fields["enabled"]), "no") {
			return
		}
		deb := false
		for _, t := range strings.Fields(fields["types"]) {
			deb = deb || t == "deb"
		}
		if !deb {
			return
		}
		suites := strings.Fields(fields["suites"])
		for _, u := range strings.Fields(fields["uris"]) {
			if usableURI(u) {
				out = append(out, aptSource{uri: strings.TrimRight(u, "/"), suites: suites})
			}
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				fields[last] += " " + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}
