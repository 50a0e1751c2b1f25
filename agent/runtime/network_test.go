package runtime_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// TestGuestNetwork checks from inside real guests what the node's rule
// tables promise, over IPv4 and IPv6 (the node has an ipv6_pool): DNS from
// the deployment resolver, public egress only when the policy says so,
// and never the node, the management network or another guest; a policy
// change without restart; domain rules learning A and AAAA answers;
// takeover rewriting a table a regeneration fixes (an open connection
// survives) and isolating one it cannot vouch for, or whose ipv6_pool or
// IPv6 management range changed.
func TestGuestNetwork(t *testing.T) {
	h := newHarness(t)
	h.withIPv6(t)
	inst := platformFixture(t)
	lab := h.lab
	h.wireInternet()
	lab.Namespace("mgmt")
	lab.Wire("node", "mg0", labMgmtNode+"/24", "mgmt", "eth0", labMgmtHost+"/24")
	lab.Addr("node", "mg0", labMgmtNode6+"/64")
	lab.Addr("mgmt", "eth0", labMgmtHost6+"/64")
	// Each server answers on both families with the same body, so a name
	// may resolve to either; the hits tell the families apart.
	internet := lab.HTTP("inet", labInternet+":8080", "from the internet")
	internet6 := lab.HTTP("inet", hostPort(labInternet6, 8080), "from the internet")
	lab.HTTP("mgmt", labMgmtHost+":8080", "from management")
	lab.HTTP("mgmt", hostPort(labMgmtHost6, 8080), "from management")
	lab.HTTP("node", labUplinkNode+":8081", "from the node")
	lab.HTTP("node", hostPort(labUplinkNode6, 8081), "from the node")
	lab.HTTP("node", hostPort(labMgmtNode6, 8081), "from the node")
	// Two more internet addresses for domain rules: one no allowed name
	// resolves to, one a deny rule names.
	const labElsewhere, labDenied = "198.51.100.3", "198.51.100.4"
	const labElsewhere6, labDenied6 = "2001:db8:100::3", "2001:db8:100::4"
	lab.Addr("inet", "eth0", labElsewhere+"/24")
	lab.Addr("inet", "eth0", labDenied+"/24")
	lab.Addr("inet", "eth0", labElsewhere6+"/64")
	lab.Addr("inet", "eth0", labDenied6+"/64")
	for _, a := range []string{labElsewhere, labElsewhere6} {
		lab.HTTP("inet", hostPort(a, 8080), "from elsewhere")
	}
	for _, a := range []string{labDenied, labDenied6} {
		lab.HTTP("inet", hostPort(a, 8080), "from a denied address")
	}
	addrs := func(as ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range as {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	lab.DNSRecords("inet", netip.MustParseAddr(labInternet), map[string][]netip.Addr{
		"web.test": addrs(labInternet), "mgmt.test": addrs(labMgmtHost),
		"allowed.test": addrs(labInternet, labInternet6), "other.test": addrs(labElsewhere, labElsewhere6),
		"denied.test": addrs(labDenied, labDenied6)})

	rt := h.mustOpen(t)
	ctx := testCtx(t, 5*time.Minute)
	start := func(id string, p runtime.NetworkPolicy) {
		t.Helper()
		if _, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true, Policy: p}); err != nil {
			t.Fatal(err)
		}
	}
	start("pub", runtime.NetworkPolicy{Egress: "public"})
	start("none", runtime.NetworkPolicy{Egress: "none"})
	recOf := func(id string) *runtime.LaunchRecord {
		rec, err := runtime.ReadLaunchRecord(filepath.Join(h.root, "runtime", "instances", id, runtime.LaunchRecordFile))
		if err != nil || rec.Network == nil {
			t.Fatalf("launch record of %s: %+v, %v", id, rec, err)
		}
		return rec
	}
	pubAddr, noneAddr := recOf("pub").Network.Guest, recOf("none").Network.Guest
	if pubAddr == noneAddr || !netip.MustParsePrefix(labPool).Contains(pubAddr) || !netip.MustParsePrefix(labPool).Contains(noneAddr) {
		t.Fatalf("guest addresses %s and %s: want two distinct addresses of %s", pubAddr, noneAddr, labPool)
	}
	pub6, none6 := recOf("pub").Network.Guest6, recOf("none").Network.Guest6
	if pub6 == none6 || !netip.MustParsePrefix(labPool6).Contains(pub6) || !netip.MustParsePrefix(labPool6).Contains(none6) {
		t.Fatalf("guest IPv6 addresses %s and %s: want two distinct addresses of %s", pub6, none6, labPool6)
	}

	// fetch makes an HTTP request from a guest with busybox nc and returns
	// the body it got ("" when the connection failed) and what nc said.
	fetchSays := func(id, addr string) (body, stderr string) {
		t.Helper()
		host, port, _ := net.SplitHostPort(addr)
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c",
			`printf 'GET / HTTP/1.0\r\nHost: x\r\n\r\n' | nc -w 3 "$0" "$1"`, host, port}}, nil)
		if err != nil {
			t.Fatalf("%s: fetch %s: %v", id, addr, err)
		}
		if _, body, ok := strings.Cut(r.stdout, "\r\n\r\n"); ok {
			return body, r.stderr
		}
		return "", r.stderr
	}
	fetch := func(id, addr string) string {
		t.Helper()
		body, _ := fetchSays(id, addr)
		return body
	}
	reaches := func(id, addr, want string) {
		t.Helper()
		if got := fetch(id, addr); got != want {
			t.Errorf("guest %s fetching %s got %q, want %q", id, addr, got, want)
		}
	}
	// blocked: the node refuses the connect at once, as the guest's nc
	// says (IPv4: administratively prohibited, "No route to host"; IPv6:
	// a reset), rather than letting it time out.
	blocked := func(id, addr string) {
		t.Helper()
		got, said := fetchSays(id, addr)
		if got != "" {
			t.Errorf("guest %s reached %s (%q): it must be blocked", id, addr, got)
		} else if !strings.Contains(said, "No route to host") && !strings.Contains(said, "Connection refused") {
			t.Errorf("guest %s connecting to %s: nc said %q; want it refused at once (No route to host, or Connection refused over IPv6)", id, addr, said)
		}
	}
	resolves := func(id, name, want string) {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/nslookup", name}}, nil)
		if err != nil || !strings.Contains(r.stdout, want) {
			t.Errorf("guest %s: nslookup %s: %+v, %v; want %s from the deployment resolver", id, name, r, err, want)
		}
	}

	// The guest's own view (busybox ip): its IPv6 address and the
	// namespace's link-local address as its IPv6 default route.
	if r, err := run(ctx, rt, "pub", guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "ip -6 addr show dev eth0; ip -6 route"}}, nil); err != nil ||
		!strings.Contains(r.stdout, pub6.String()+"/128") || !strings.Contains(r.stdout, "default via "+netpol.TapAddr6+" dev eth0") {
		t.Errorf("guest pub's IPv6 configuration: %+v, %v; want %s/128 and a default route via %s", r, err, pub6, netpol.TapAddr6)
	} else {
		t.Logf("guest pub: ip -6 addr show dev eth0; ip -6 route:\n%s", r.stdout)
	}

	reaches("pub", labInternet+":8080", "from the internet")
	if hits := internet.Hits(); len(hits) == 0 || !strings.HasPrefix(hits[len(hits)-1], labUplinkNode+":") {
		t.Errorf("internet server saw %v; want the node's uplink address (masquerade)", hits)
	}
	reaches("pub", hostPort(labInternet6, 8080), "from the internet")
	if hits := internet6.Hits(); len(hits) == 0 || !strings.HasPrefix(hits[len(hits)-1], "["+labUplinkNode6+"]:") {
		t.Errorf("internet server saw %v over IPv6; want the node's uplink address (masquerade)", hits)
	}
	resolves("pub", "web.test", labInternet)
	resolves("none", "web.test", labInternet) // DNS works without egress
	blocked("none", labInternet+":8080")
	blocked("none", hostPort(labInternet6, 8080))
	for _, id := range []string{"pub", "none"} {
		for _, a := range []string{
			labMgmtHost + ":8080", hostPort(labMgmtHost6, 8080), // management_cidrs
			labUplinkNode + ":8081", hostPort(labUplinkNode6, 8081), // the node's own addresses
			labMgmtNode + ":8081", hostPort(labMgmtNode6, 8081),
		} {
			blocked(id, a)
		}
	}
	// Guest to guest: "none" listens, "pub" (which may reach the internet)
	// must not reach it, by either address.
	listener, err := rt.Exec(ctx, "none", guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo guest | nc -l -p 9000"}})
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	blocked("pub", noneAddr.String()+":9000")
	blocked("pub", hostPort(none6.String(), 9000))
	// Every drop above was counted and logged, per Instance.
	for _, id := range []string{"pub", "none"} {
		testenv.WaitFor(t, 30*time.Second, id+"'s denied packets", func() (bool, string) {
			st, err := rt.Status(id)
			return err == nil && st.DeniedPackets > 0, fmt.Sprintf("%d denied packets, %v", st.DeniedPackets, err)
		})
	}
	if len(h.logs.entries("guest connections denied")) == 0 {
		t.Error("no log line for denied connections")
	}

	// A policy change applies without a restart; an IPv6 deny CIDR blocks
	// IPv6 like an IPv4 one IPv4.
	deny := []netip.Prefix{netip.MustParsePrefix(labInternet + "/32"), netip.MustParsePrefix(labInternet6 + "/128")}
	if err := rt.UpdateNetwork(ctx, "none", runtime.NetworkPolicy{Egress: "public", Deny: deny}); err != nil {
		t.Fatal(err)
	}
	blocked("none", labInternet+":8080")
	blocked("none", hostPort(labInternet6, 8080))
	reaches("none", hostPort(labElsewhere6, 8080), "from elsewhere")
	if err := rt.UpdateNetwork(ctx, "none", runtime.NetworkPolicy{Egress: "public"}); err != nil {
		t.Fatal(err)
	}
	reaches("none", labInternet+":8080", "from the internet")
	reaches("none", hostPort(labInternet6, 8080), "from the internet")
	if got := recOf("none").Network.Policy.Egress; got != "public" {
		t.Errorf("recorded policy after the change: egress %q", got)
	}

	// Domain rules: only what the node's resolver answered for an allowed
	// name is reachable; a denied name does not resolve, and its address
	// (and a denied CIDR) stays out.
	names := runtime.NetworkPolicy{Egress: "public", AllowNames: []string{"allowed.test"}, DenyNames: []string{"denied.test"},
		Deny: []netip.Prefix{netip.MustParsePrefix(labDenied + "/32")}}
	if err := rt.UpdateNetwork(ctx, "none", names); err != nil {
		t.Fatal(err)
	}
	blocked("none", labInternet+":8080") // not answered for an allowed name yet
	blocked("none", hostPort(labInternet6, 8080))
	reaches("none", "allowed.test:8080", "from the internet")
	reaches("none", labInternet+":8080", "from the internet") // learned now
	// The AAAA answer is learned as the A answer is.
	if r, err := run(ctx, rt, "none", guestproto.ExecRequest{Argv: []string{"/bin/nslookup", "-type=AAAA", "allowed.test"}}, nil); err != nil || !strings.Contains(r.stdout, labInternet6) {
		t.Errorf("guest none: nslookup -type=AAAA allowed.test: %+v, %v; want %s", r, err, labInternet6)
	}
	reaches("none", hostPort(labInternet6, 8080), "from the internet")
	blocked("none", labElsewhere+":8080") // no allowed name resolves to it
	blocked("none", hostPort(labElsewhere6, 8080))
	blocked("none", labDenied+":8080")
	blocked("none", hostPort(labDenied6, 8080))
	notResolved := func(id, name string) {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/nslookup", name}}, nil)
		if err != nil || r.exit.ExitCode == 0 || strings.Contains(r.stdout, "198.51.100.") || strings.Contains(r.stdout, "2001:db8:100:") {
			t.Errorf("guest %s: nslookup %s: %+v, %v; want it refused", id, name, r, err)
		}
	}
	notResolved("none", "denied.test")
	notResolved("none", "other.test")
	if len(h.logs.entries("guest name refused")) == 0 {
		t.Error("no log line for a refused name")
	}
	// A policy change replaces the table; what is still allowed is
	// learned again, so the guest need not resolve it again.
	names.DenyNames = nil
	if err := rt.UpdateNetwork(ctx, "none", names); err != nil {
		t.Fatal(err)
	}
	reaches("none", labInternet+":8080", "from the internet")
	reaches("none", hostPort(labInternet6, 8080), "from the internet")
	if got := recOf("none").Network.Policy.AllowNames; len(got) != 1 || got[0] != "allowed.test" {
		t.Errorf("recorded allow names %v", got)
	}
	if err := rt.UpdateNetwork(ctx, "none", runtime.NetworkPolicy{Egress: "public"}); err != nil {
		t.Fatal(err)
	}
	reaches("none", labElsewhere+":8080", "from elsewhere")
	reaches("none", hostPort(labElsewhere6, 8080), "from elsewhere")

	// An open connection from the guest: an echo the guest runs over a
	// connection it made to the internet.
	echoLn := lab.Listen("inet", labInternet+":9100")
	echo, err := rt.Exec(ctx, "none", guestproto.ExecRequest{Argv: []string{"/bin/nc", labInternet, "9100", "-e", "/bin/cat"}})
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	conn, err := echoLn.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	roundTrip := func(msg string) {
		t.Helper()
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := conn.Write([]byte(msg + "\n")); err != nil {
			t.Fatalf("echo through the guest: write: %v", err)
		}
		line, err := br.ReadString('\n')
		if err != nil || line != msg+"\n" {
			t.Fatalf("echo through the guest: %q, %v", line, err)
		}
	}
	roundTrip("before the takeover")

	// Node down: one of "none"'s rules is removed by hand (a regeneration
	// fixes that), and "pub"'s namespace gets a table that is not ours.
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	nft := func(id string, args ...string) {
		t.Helper()
		path := filepath.Join(h.sd.NetNSDir, runtime.NetNSName(id))
		out, err := exec.Command("nsenter", append([]string{"--net=" + path, "nft"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("nft %v in %s: %v: %s", args, id, err, out)
		}
	}
	nft("pub", "add", "table", "ip", "foreign")
	nft("none", "flush", "chain", "inet", "kibotos", "input")
	rt2, err := h.open(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt2.Close() })
	rt = rt2
	st, err := rt.Status("pub")
	if err != nil || st.State != runtime.StateFailed || !strings.Contains(st.Error, "network isolated") {
		t.Errorf("pub after takeover with a foreign table: %+v, %v; want FAILED, network isolated", st, err)
	}
	if u, err := h.m.Get(ctx, runtime.UnitName("pub")); err != nil || !u.Active() {
		t.Errorf("pub's VMM after isolation: %+v, %v; want it still running", u, err)
	}
	if len(h.logs.entries("instance network isolated")) == 0 {
		t.Error("no log line for the isolated Instance")
	}
	testenv.WaitFor(t, time.Minute, "none to be taken over", func() (bool, string) {
		st, err := rt.Status("none")
		return err == nil && st.State == runtime.StateRunning && st.GuestResponding,
			fmt.Sprintf("state %s, guest responding %v, %v", st.State, st.GuestResponding, err)
	})
	if e := h.logs.entries("slot table rewritten from the recorded network policy"); len(e) != 1 || e[0]["instance_id"] != "none" {
		t.Errorf("rewrite log lines %v; want one for none", e)
	}
	roundTrip("after the takeover") // the connection survived the rewrite
	reaches("none", labInternet+":8080", "from the internet")

	// stop --force recovers the isolated one.
	if err := rt.Stop(context.Background(), "pub", 0); err != nil {
		t.Fatal(err)
	}
	if u, err := h.m.Get(ctx, runtime.UnitName("pub")); err == nil && u.Active() {
		t.Errorf("pub's VMM still runs after the stop: %+v", u)
	}

	// Node down again, and back with another ipv6_pool and IPv6 management
	// range: "none"'s network is isolated and it is FAILED, saying both,
	// its VMM still running; stop --force recovers it.
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	changed, err := netpol.ParseConfig(labPool, "fd6b:6b00:214::/64", []string{labMgmtNode + "/24", "2001:db8:204::/64"}, []string{labInternet}, "up0")
	if err != nil {
		t.Fatal(err)
	}
	h.network = changed
	rt3, err := h.open(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt3.Close() })
	rt = rt3
	st, err = rt.Status("none")
	if err != nil || st.State != runtime.StateFailed || !strings.Contains(st.Error, "network isolated") ||
		!strings.Contains(st.Error, "management_cidrs changed since launch") ||
		!strings.Contains(st.Error, "ipv6_pool changed since launch (recorded "+labPool6+", now fd6b:6b00:214::/64)") || strings.Contains(st.Error, "\n") {
		t.Errorf("none after takeover with another ipv6_pool and IPv6 management range: %+v, %v; want FAILED naming both", st, err)
	}
	if u, err := h.m.Get(ctx, runtime.UnitName("none")); err != nil || !u.Active() {
		t.Errorf("none's VMM after isolation: %+v, %v; want it still running", u, err)
	}
	if err := rt.Stop(context.Background(), "none", 0); err != nil {
		t.Fatal(err)
	}
	if u, err := h.m.Get(ctx, runtime.UnitName("none")); err == nil && u.Active() {
		t.Errorf("none's VMM still runs after the stop: %+v", u)
	}
}

// hostPort joins an address of either family and a port.
func hostPort(addr string, port int) string { return net.JoinHostPort(addr, strconv.Itoa(port)) }
