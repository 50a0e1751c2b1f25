package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/egress"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/datadir"
)

// A pool's capacity is ctrl's: a node configuration that still declares
// one (as earlier releases read it) makes start-up fail, naming the pool
// and the command that replaces it, before anything is started.
func TestServeRefusesPoolCapacity(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "kibotos.toml")
	os.WriteFile(config, []byte("[[storage.pools]]\nid = \"nfs-1\"\npath = \"/srv/nfs\"\nshared = true\ncapacity = \"2TiB\"\n"), 0o600)
	var out, errb bytes.Buffer
	code := Main(context.Background(), "kibotos", []string{"serve", "--config", config, "--data-dir", filepath.Join(dir, "data")}, nil, &out, &errb)
	if code != api.ExitInvalidArgument {
		t.Fatalf("exit %d, want %d: %s", code, api.ExitInvalidArgument, errb.String())
	}
	if msg := errb.String(); !strings.Contains(msg, "storage pool nfs-1: capacity is no longer a node setting") || !strings.Contains(msg, "kibo storage-pool set-capacity nfs-1 SIZE") {
		t.Fatalf("message: %s", msg)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Fatalf("the refused start touched the data directory: %v", err)
	}
}

// The test mode in which VMs outlive a killed member is only for a
// private systemd: refused with the host's, before anything is started.
func TestServeRefusesSystemdOutlivesWithHostSystemd(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "kibotos.toml")
	os.WriteFile(config, nil, 0o600)
	var out, errb bytes.Buffer
	code := Main(context.Background(), "kibotos", []string{"serve", "--config", config, "--data-dir", filepath.Join(dir, "data"), "--systemd", "host", "--test-systemd-outlives"}, nil, &out, &errb)
	if code != api.ExitUsage {
		t.Fatalf("exit %d, want %d: %s", code, api.ExitUsage, errb.String())
	}
	if msg := errb.String(); !strings.Contains(msg, "--test-systemd-outlives needs --systemd private, not host") {
		t.Fatalf("message: %s", msg)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Fatalf("the refused start touched the data directory: %v", err)
	}
}

// A key serve does not know stops it before anything is started, in one
// line naming every such key: a misspelt one would otherwise take its
// default without a word.
func TestServeRefusesUnknownConfigKeys(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "kibotos.toml")
	os.WriteFile(config, []byte("log_levle = \"debug\"\n[[storage.pools]]\nid = \"nfs-1\"\npath = \"/srv/nfs\"\nshraed = true\n[netwrok]\nuplink = \"eth0\"\n"), 0o600)
	var out, errb bytes.Buffer
	code := Main(context.Background(), "kibotos", []string{"serve", "--config", config, "--data-dir", filepath.Join(dir, "data")}, nil, &out, &errb)
	if code != api.ExitInvalidArgument {
		t.Fatalf("exit %d, want %d: %s", code, api.ExitInvalidArgument, errb.String())
	}
	if msg := strings.TrimSpace(errb.String()); !strings.Contains(msg, "configuration file "+config+": unknown keys log_levle, storage.pools.shraed, netwrok: correct or delete them") || strings.Contains(msg, "\n") {
		t.Fatalf("message: %q", msg)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Fatalf("the refused start touched the data directory: %v", err)
	}
}

// The product documentation spells a pool [[storage.pool]]: a node
// configured so declares the pool as [[storage.pools]] would; a file with
// both spellings is refused rather than guessed at.
func TestServeStoragePoolSpelling(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "kibotos.toml")
	os.WriteFile(config, []byte("[[storage.pool]]\nid = \"shared\"\npath = \"/srv/kibotos/shared\"\nshared = true\n"), 0o600)
	fc, _, err := loadNodeConfig(&Globals{}, config)
	if err != nil {
		t.Fatal(err)
	}
	pools, err := poolsFrom(config, fc)
	if err != nil || len(pools) != 1 || pools[0] != (agent.PoolConfig{ID: "shared", Path: "/srv/kibotos/shared", Shared: true}) {
		t.Fatalf("[[storage.pool]]: pools %+v, %v", pools, err)
	}

	os.WriteFile(config, []byte("[[storage.pool]]\nid = \"shared\"\npath = \"/srv/kibotos/shared\"\n[[storage.pools]]\nid = \"nfs-1\"\npath = \"/srv/nfs\"\n"), 0o600)
	var out, errb bytes.Buffer
	code := Main(context.Background(), "kibotos", []string{"serve", "--config", config, "--data-dir", filepath.Join(dir, "data")}, nil, &out, &errb)
	if code != api.ExitInvalidArgument || !strings.Contains(errb.String(), "both [[storage.pool]] and [[storage.pools]]") {
		t.Fatalf("both spellings: exit %d: %s", code, errb.String())
	}
}

// check-maintenance from the CLI: a node that never ran a VMM may be
// upgraded or removed (exit 0, nothing written); a data directory that is
// not a member's is refused (13); a pool config with a capacity is
// refused (11) like serve refuses it.
func TestCheckMaintenanceCommand(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1})
	for _, op := range []string{"upgrade", "remove"} {
		out, errs, code := e.run("check-maintenance", "--operation", op, "--systemd", "none")
		if code != 0 || !strings.Contains(errs, "check-maintenance --operation "+op+": node node-1 may go ahead") {
			t.Errorf("check-maintenance %s: exit %d: %s%s", op, code, out, errs)
		}
	}
	if _, err := os.Stat(filepath.Join(e.dataDir, "storage", "runtime")); !os.IsNotExist(err) {
		t.Errorf("the check created the runtime directory: %v", err)
	}
	var out, errb bytes.Buffer
	if code := Main(context.Background(), "kibotos", []string{"check-maintenance", "--operation", "upgrade", "--data-dir", t.TempDir()}, nil, &out, &errb); code != api.ExitFailedPrecondition {
		t.Errorf("check-maintenance of an empty directory: exit %d: %s", code, errb.String())
	}
	config := filepath.Join(t.TempDir(), "kibotos.toml")
	os.WriteFile(config, []byte("[[storage.pools]]\nid = \"nfs-1\"\npath = \"/srv/nfs\"\ncapacity = 100\n"), 0o600)
	e.expectExit(api.ExitInvalidArgument, "kibo storage-pool set-capacity nfs-1 SIZE", "check-maintenance", "--operation", "upgrade", "--config", config, "--systemd", "none")
}

// [network] ipv6_pool: a good one reaches the node's configuration, a bad
// one stops serve before anything is started, in one line naming it.
func TestServeNetworkIPv6Pool(t *testing.T) {
	var fc fileConfig
	fc.Network.IPv4Pool, fc.Network.IPv6Pool = "10.213.0.0/16", "fd6b:6b00:1::/64"
	fc.Network.ManagementCIDRs, fc.Network.Resolvers, fc.Network.Uplink = []string{"2001:db8:10::/48"}, []string{"10.0.0.2"}, "eth0"
	n, err := networkFrom("kibotos.toml", fc)
	if err != nil || n.IPv6Pool.String() != "fd6b:6b00:1::/64" {
		t.Fatalf("networkFrom = %+v, %v", n, err)
	}

	dir := t.TempDir()
	config := filepath.Join(dir, "kibotos.toml")
	os.WriteFile(config, []byte("[network]\nipv4_pool = \"10.213.0.0/16\"\nipv6_pool = \"fe80::/64\"\nresolvers = [\"10.0.0.2\"]\nuplink = \"eth0\"\n"), 0o600)
	var out, errb bytes.Buffer
	code := Main(context.Background(), "kibotos", []string{"serve", "--config", config, "--data-dir", filepath.Join(dir, "data")}, nil, &out, &errb)
	if code != api.ExitInvalidArgument {
		t.Fatalf("exit %d, want %d: %s", code, api.ExitInvalidArgument, errb.String())
	}
	if msg := strings.TrimSpace(errb.String()); !strings.Contains(msg, "[network] ipv6_pool fe80::/64 is link-local") || strings.Contains(msg, "\n") {
		t.Fatalf("message: %q", msg)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Fatalf("the refused start touched the data directory: %v", err)
	}
}

// The Debian package's /etc/kibotos/kibotos.toml is what serve reads: as
// shipped it loads with data_dir /var/lib/kibotos and no [network]; with
// every commented setting switched on, every key is one serve knows and
// the values pass its checks.
func TestPackagedConfig(t *testing.T) {
	raw, err := os.ReadFile("../packaging/kibotos.toml")
	if err != nil {
		t.Fatal(err)
	}
	var fc fileConfig
	md, err := toml.Decode(string(raw), &fc)
	if err != nil || fc.DataDir != SystemDataDir || len(md.Undecoded()) > 0 {
		t.Fatalf("as shipped: data_dir %q, unknown keys %v, %v", fc.DataDir, md.Undecoded(), err)
	}
	var on []string
	for _, line := range strings.Split(string(raw), "\n") {
		if s, ok := strings.CutPrefix(line, "# "); ok && (strings.HasPrefix(s, "[") || strings.Contains(s, " = ")) {
			line = s
		}
		on = append(on, line)
	}
	fc = fileConfig{}
	md, err = toml.Decode(strings.Join(on, "\n"), &fc)
	if err != nil || len(md.Undecoded()) > 0 {
		t.Fatalf("with every setting on: unknown keys %v, %v", md.Undecoded(), err)
	}
	if _, err := networkFrom("kibotos.toml", fc); err != nil {
		t.Errorf("[network] of the example: %v", err)
	}
	if _, err := resourcesFrom(fc); err != nil {
		t.Errorf("[resources] of the example: %v", err)
	}
	if pools, err := poolsFrom("kibotos.toml", fc); err != nil || len(pools) != 1 {
		t.Errorf("[[storage.pools]] of the example: %v, %v", pools, err)
	}
	if w, err := warmFrom("kibotos.toml", fc); err != nil || len(w) != 1 || w[0] != (agent.WarmConfig{Template: "kibotos-coding", Count: 2, VCPUs: 1, MemoryMiB: 512}) {
		t.Errorf("[templates.kibotos-coding] of the example: %+v, %v", w, err)
	}
	if c, err := apiFrom("kibotos.toml", fc); err != nil || c.Listen == "" || c.Rate != cluster.DefaultAPIRate || c.Burst != cluster.DefaultAPIBurst {
		t.Errorf("[api] of the example: %+v, %v", c, err)
	}
	if c, err := e2bFrom("kibotos.toml", fc); err != nil || c.Listen == "" || c.BaseTemplate != "kibotos-base" || c.Domain == "" {
		t.Errorf("[e2b] of the example: %+v, %v", c, err)
	}
	// The example's credentials file is the operator's to write.
	if fc.Artifacts.CredentialsFile != "/etc/kibotos/s3-credentials.toml" {
		t.Errorf("[artifacts] credentials_file of the example: %q", fc.Artifacts.CredentialsFile)
	}
	fc.Artifacts.CredentialsFile = credentialsFile(t, 0o600)
	// So is its CA file (package artifacts reads real ones).
	if fc.Artifacts.CAFile != "/etc/kibotos/s3-ca.pem" {
		t.Errorf("[artifacts] ca_file of the example: %q", fc.Artifacts.CAFile)
	}
	fc.Artifacts.CAFile = ""
	if c, err := artifactsFrom("kibotos.toml", fc); err != nil || c.URL == "" {
		t.Errorf("[artifacts] of the example: %+v, %v", c, err)
	}
}

// credentialsFile writes an [artifacts] credentials_file with mode.
func credentialsFile(t *testing.T, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s3-credentials.toml")
	if err := os.WriteFile(p, []byte("access_key_id = \"AKIDEXAMPLE\"\nsecret_access_key = \"kibotos-test-secret\"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// [artifacts]: a directory URL or a bucket reaches the member; a bad
// url, endpoint or credentials file stops serve before anything is
// started, in one line naming the setting and what to give instead, and
// never showing the secret key.
func TestServeArtifactsURL(t *testing.T) {
	var fc fileConfig
	fc.Artifacts.URL = "file:///srv/kibotos/artifacts"
	if c, err := artifactsFrom("kibotos.toml", fc); err != nil || c != (artifacts.Config{URL: fc.Artifacts.URL}) {
		t.Fatalf("artifactsFrom = %+v, %v", c, err)
	}
	good, loose := credentialsFile(t, 0o600), credentialsFile(t, 0o644)
	s3 := artifacts.Config{URL: "s3://kibotos-artifacts/cluster-a", Endpoint: "http://127.0.0.1:9000", Region: "eu-west-1", CredentialsFile: good}
	fc.Artifacts.URL, fc.Artifacts.Endpoint, fc.Artifacts.Region, fc.Artifacts.CredentialsFile = s3.URL, s3.Endpoint, s3.Region, s3.CredentialsFile
	if c, err := artifactsFrom("kibotos.toml", fc); err != nil || c != s3 {
		t.Fatalf("artifactsFrom = %+v, %v", c, err)
	}
	for section, says := range map[string]string{
		`url = "s3://Bucket/kibotos"`:                                         "[artifacts] url \"s3://Bucket/kibotos\": bucket \"Bucket\" is not an S3 bucket name",
		`url = "s3://bucket/a/../b"`:                                          "none of them . or ..",
		`url = "s3://bucket/a?x=1"`:                                           "query",
		`url = "s3://bucket/kibotos"`:                                         "[artifacts] url \"s3://bucket/kibotos\" is an s3:// store: give credentials_file",
		`url = "file://srv/artifacts"`:                                        "[artifacts] url \"file://srv/artifacts\" names host",
		`url = "/srv/kibotos/artifacts"`:                                      "[artifacts] url \"/srv/kibotos/artifacts\": scheme \"\" is not supported; give file:///absolute/directory or s3://bucket/prefix",
		"url = \"s3://bucket/kibotos\"\ncredentials_file = \"" + loose + "\"": "[artifacts] credentials_file " + loose + " is open to group or others (mode 0644): chmod 600 " + loose,
		"url = \"s3://bucket/kibotos\"\nendpoint = \"http://10.0.0.5:9000\"\ncredentials_file = \"" + good + "\"": "[artifacts] endpoint \"http://10.0.0.5:9000\" is plain http to a host other than this one",
		"url = \"file:///srv/a\"\nregion = \"eu-west-1\"":                                                         "[artifacts] endpoint, region, credentials_file and ca_file are an s3:// store's",
		`endpoint = "https://s3.example.net"`:                                                                     "[artifacts] has no url",
	} {
		dir := t.TempDir()
		config := filepath.Join(dir, "kibotos.toml")
		os.WriteFile(config, []byte("[artifacts]\n"+section+"\n"), 0o600)
		var out, errb bytes.Buffer
		code := Main(context.Background(), "kibotos", []string{"serve", "--config", config, "--data-dir", filepath.Join(dir, "data")}, nil, &out, &errb)
		msg := strings.TrimSpace(errb.String())
		if code != api.ExitInvalidArgument || !strings.Contains(msg, says) || strings.Contains(msg, "\n") || strings.Contains(msg, "kibotos-test-secret") {
			t.Errorf("%s: exit %d, message %q; want %d saying %q", section, code, msg, api.ExitInvalidArgument, says)
		}
		if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
			t.Errorf("%s: the refused start touched the data directory: %v", section, err)
		}
	}
}

// kibotos dev keeps its artifact store in its data directory, also when
// --data-dir is relative.
func TestDevArtifactsURL(t *testing.T) {
	t.Chdir(t.TempDir())
	u, err := devArtifactsURL(datadir.Dir("dev-data"))
	if err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(filepath.Join("dev-data", "artifacts"))
	if u != "file://"+abs {
		t.Fatalf("dev artifact store %q, want file://%s", u, abs)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		t.Fatalf("dev artifact store directory: %v", err)
	}
}

// [templates.NAME] warm = N: the sizes default to a create's; a count,
// size or name out of bounds stops serve in one line naming the section
// and the setting.
func TestServeWarmConfig(t *testing.T) {
	var fc fileConfig
	if _, err := toml.Decode("[templates.a]\nwarm = 1\n[templates.b]\nwarm = 3\ncpu = 2\nmemory = \"1GiB\"\n", &fc); err != nil {
		t.Fatal(err)
	}
	w, err := warmFrom("kibotos.toml", fc)
	want := []agent.WarmConfig{{Template: "a", Count: 1, VCPUs: 1, MemoryMiB: 512}, {Template: "b", Count: 3, VCPUs: 2, MemoryMiB: 1024}}
	if err != nil || len(w) != 2 || w[0] != want[0] || w[1] != want[1] {
		t.Errorf("warmFrom = %+v, %v; want %+v", w, err, want)
	}
	for _, c := range []struct{ toml, msg string }{
		{"[templates.a]\nwarm = -1\n", "[templates.a] warm = -1: want 0 to 64"},
		{"[templates.a]\nwarm = 65\n", "[templates.a] warm = 65: want 0 to 64"},
		{"[templates.a]\nwarm = 1\ncpu = -2\n", "[templates.a] cpu = -2: want whole cores"},
		{"[templates.a]\nwarm = 1\nmemory = \"1.5MiB\"\n", "[templates.a] memory \"1.5MiB\": want whole MiB"},
		{"[templates.a]\nwarm = 1\nmemory = \"lots\"\n", "[templates.a] memory \"lots\""},
		{"[templates.\"Bad Name\"]\nwarm = 1\n", "[templates.Bad Name]"},
	} {
		expectConfigRefused(t, c.toml, c.msg)
	}
}

// expectConfigRefused runs serve with the configuration file config and
// expects exit 11 with one line holding msg, before the data directory
// is touched.
func expectConfigRefused(t *testing.T, config, msg string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "kibotos.toml")
	os.WriteFile(path, []byte(config), 0o600)
	var out, errb bytes.Buffer
	code := Main(context.Background(), "kibotos", []string{"serve", "--config", path, "--data-dir", filepath.Join(dir, "data")}, nil, &out, &errb)
	if code != api.ExitInvalidArgument || !strings.Contains(errb.String(), msg) || strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 {
		t.Errorf("%q: exit %d, %q; want %d and %q in one line", config, code, errb.String(), api.ExitInvalidArgument, msg)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("%q: the refused start touched the data directory: %v", config, err)
	}
}

// [network] egress_warm_connections: unset is the egress process's
// default, 0 to 16 are taken, anything else stops serve in one line.
func TestEgressWarmConnectionsConfig(t *testing.T) {
	var fc fileConfig
	if n, err := egressWarmFrom("kibotos.toml", fc); n != egress.DefaultWarmConnections || err != nil {
		t.Errorf("unset: %d, %v; want %d", n, err, egress.DefaultWarmConnections)
	}
	for _, v := range []int{0, 5, egress.MaxWarmConnections} {
		fc.Network.EgressWarmConnections = &v
		if n, err := egressWarmFrom("kibotos.toml", fc); n != v || err != nil {
			t.Errorf("%d: %d, %v", v, n, err)
		}
	}
	for _, v := range []int{-1, egress.MaxWarmConnections + 1} {
		fc.Network.EgressWarmConnections = &v
		_, err := egressWarmFrom("kibotos.toml", fc)
		if want := fmt.Sprintf("configuration file kibotos.toml: [network] egress_warm_connections = %d: want 0 (none) to 16", v); err == nil || err.Error() != want || api.CodeOf(err) != api.CodeInvalidArgument {
			t.Errorf("%d: %v; want %q", v, err, want)
		}
	}
}

// [api]: a certificate without its key, or settings without a listen
// address, stop serve before anything is started, in one line saying
// what to give.
func TestServeAPIConfig(t *testing.T) {
	for _, tc := range []struct{ config, want string }{
		{"[api]\nlisten = \"127.0.0.1:7443\"\ncert_file = \"/etc/kibotos/api.crt\"\n", "[api] cert_file and key_file go together: give both"},
		{"[api]\nrate = 10.0\n", "[api] has no listen address: give listen, or delete the section"},
		{"[api]\nlisten = \"127.0.0.1:7443\"\nburst = -1\n", "[api] rate 0 and burst -1: want positive numbers"},
		{"[api]\nlisten = \"7443\"\n", "[api] listen \"7443\": want HOST:PORT"},
	} {
		expectConfigRefused(t, tc.config, "kibotos.toml: "+tc.want)
	}
}

// [e2b] as serve reads it: base_template defaults to kibotos-base; a
// section without listen, or half a certificate, is refused saying what
// to fix.
func TestE2BConfig(t *testing.T) {
	var fc fileConfig
	fc.E2B.Listen = "127.0.0.1:7444"
	if c, err := e2bFrom("kibotos.toml", fc); err != nil || c.BaseTemplate != "kibotos-base" {
		t.Fatalf("listen alone: %+v, %v", c, err)
	}
	fc.E2B.CertFile = "/etc/kibotos/e2b.crt"
	if _, err := e2bFrom("kibotos.toml", fc); err == nil || !strings.Contains(err.Error(), "[e2b] cert_file and key_file go together") {
		t.Errorf("cert_file without key_file: %v", err)
	}
	fc.E2B = struct {
		Listen       string `toml:"listen"`
		CertFile     string `toml:"cert_file"`
		KeyFile      string `toml:"key_file"`
		Domain       string `toml:"domain"`
		BaseTemplate string `toml:"base_template"`
	}{Domain: "sandboxes.example.com"}
	if _, err := e2bFrom("kibotos.toml", fc); err == nil || !strings.Contains(err.Error(), "[e2b] has no listen address") {
		t.Errorf("domain without listen: %v", err)
	}
}
