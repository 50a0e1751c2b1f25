package clusterlab

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
)

// Addresses of the lab's switch namespace, beside the hosts on its bridge:
// a SOCKS5 server of the "caller" and a server it reaches.
const (
	ProxyAddr  = SubnetPrefix + "200"
	ServerAddr = SubnetPrefix + "201"
)

// Proxy is what an Egress of the lab goes through: a SOCKS5 server that
// wants a user name and password, and a web server only it reaches well.
type Proxy struct {
	SOCKS        string // host:port
	Username     string
	PasswordFile string // what kibo egress create --password-file reads
	URL          string // the web server's page
	Page         string // its body
	ServerLog    string // the web server's log: its clients' addresses
	SOCKSLog     string
}

// StartProxy starts the lab's SOCKS5 server (microsocks) and web server
// (busybox httpd) in its switch namespace, once per lab.
func (l *Lab) StartProxy(t *testing.T) Proxy {
	t.Helper()
	microsocks := testenv.LookPath(t, "microsocks", "microsocks")
	busybox := testenv.LookPath(t, "busybox", "busybox-static")
	sw := l.Prefix + "-sw"
	// The proxy reaches the server in its own namespace: over loopback.
	l.IP("-n", sw, "link", "set", "lo", "up")
	l.IP("-n", sw, "addr", "add", ProxyAddr+"/24", "dev", "br0")
	l.IP("-n", sw, "addr", "add", ServerAddr+"/24", "dev", "br0")
	www := t.TempDir()
	const page = "through the proxy\n"
	if err := os.WriteFile(filepath.Join(www, "index.html"), []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	p := Proxy{SOCKS: ProxyAddr + ":1080", Username: "kibo", URL: "http://" + ServerAddr + ":8080/", Page: page}
	p.ServerLog = l.StartIn(t, sw, "httpd", busybox, "httpd", "-f", "-v", "-p", ServerAddr+":8080", "-h", www)
	p.SOCKSLog = l.StartIn(t, sw, "microsocks", microsocks, "-i", ProxyAddr, "-p", "1080", "-u", p.Username, "-P", "s3cret-pass")
	p.PasswordFile = filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(p.PasswordFile, []byte("s3cret-pass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
