package member

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/trust"
	"github.com/kibotos/kibotos/vmm/units"
)

// dataPlaneLink is the node's side of its data-plane process: it starts or
// adopts the process and delivers the targets, the credential key and the
// process's own server certificate and key. The process never sees the
// member's key: its certificate is a data-plane certificate (24 h) that
// ctrl signs for a key made here, renewed at half-life.
type dataPlaneLink struct {
	cfg   dataplane.SupervisorConfig
	issue dataPlaneIssuer
	hosts []string
	log   *slog.Logger

	mu        sync.Mutex
	h         *dataplane.Handle
	cert, key []byte
	leaf      *x509.Certificate // of cert
	renewAt   time.Time
	// signing is the CA ctrl signs with now: a certificate another CA
	// issued (a CA rotation) is replaced at the next update, not at
	// half-life. Nil: only half-life counts.
	signing func() *x509.Certificate
	// seen are the counters last read from each generation, ended ones
	// included: the seed's rule that an exited process's counts still
	// count (Totals).
	seen map[uint64]dataplane.Counters
}

// dataPlaneIssuer gets a data-plane certificate for a key from ctrl.
type dataPlaneIssuer func(ctx context.Context, pub *ecdsa.PublicKey, hosts []string) (api.DataPlaneCertResponse, error)

// credentials returns the process's certificate and key, getting new ones
// when there are none or half their lifetime is gone (mu held). A failed
// renewal keeps the current ones while they are valid.
func (l *dataPlaneLink) credentials(ctx context.Context) error {
	if l.cert != nil && time.Now().Before(l.renewAt) && (l.signing == nil || trust.IssuedBy(l.leaf, l.signing())) {
		return nil
	}
	key, err := trust.NewKey()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := l.issue(ctx, &key.PublicKey, l.hosts)
	if err != nil {
		if l.cert != nil {
			l.log.Warn("data-plane certificate renewal failed; keeping the current one", "err", err)
			return nil
		}
		return fmt.Errorf("data plane: get its certificate from ctrl: %w", err)
	}
	keyPEM, err := trust.EncodeKey(key)
	if err != nil {
		return err
	}
	leaf, err := trust.ParseCertPEM([]byte(out.Cert))
	if err != nil {
		return fmt.Errorf("data plane: the certificate from ctrl: %w", err)
	}
	now := time.Now()
	l.cert, l.key, l.leaf = []byte(out.Cert), keyPEM, leaf
	l.renewAt = now.Add(out.NotAfter.Sub(now) / 2)
	return nil
}

// defaultDataPlaneListen is the advertised host with port+2 (the member
// uses PORT for its API and PORT+1 for gossip).
func defaultDataPlaneListen(advertise string) (string, error) {
	host, port, err := net.SplitHostPort(advertise)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(p+2)), nil
}

// startDataPlane ensures the node's data-plane process runs under m:
// adopted when it is this build, handed over to a new generation of this
// build when it is another build of the release line, replaced otherwise
// (dataplane.Ensure).
func startDataPlane(ctx context.Context, d datadir.Dir, m *units.Manager, listen string, issue dataPlaneIssuer, signing func() *x509.Certificate, logFormat string, log *slog.Logger) (*dataPlaneLink, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("data plane: locate the kibotos executable: %w", err)
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("data plane: listen address %q is not HOST:PORT", listen)
	}
	// The socket directory both this process and the service manager see
	// at the same path (see NodeSocketDir); the scope stays what it was
	// when the directory was under the node's state directory, so the
	// units of earlier builds are still this node's.
	sockDir := DataPlaneSocketDir(d, m.Target().ManagerPID > 1)
	if err := os.MkdirAll(filepath.Dir(sockDir), 0o755); err != nil {
		return nil, fmt.Errorf("data plane: %w", err)
	}
	l := &dataPlaneLink{issue: issue, signing: signing, hosts: []string{host}, log: log, cfg: dataplane.SupervisorConfig{
		Units: m, Executable: exe, Scope: NodeScope(d), SocketDir: sockDir, EarlierSocketDirs: []string{earlierDataPlaneSocketDir(d)},
		Listen: listen, LogFormat: logFormat, Logger: log,
	}}
	// Without ctrl (a node restarting during a ctrl outage) the node still
	// starts: an adopted process keeps serving with the certificate it
	// has, and every resend (at most 15 s apart) asks ctrl again.
	if err := l.credentials(ctx); err != nil {
		log.Warn("data-plane certificate not available yet; retrying with every state resend", "err", err)
	}
	h, err := dataplane.Ensure(ctx, l.cfg)
	if err != nil {
		return nil, err
	}
	how := "started"
	switch {
	case h.Adopted:
		how = "adopted"
	case h.Switched != "":
		how = "switched to a new generation"
	}
	log.Info("data-plane process "+how, "unit", h.Unit, "generation", h.Generation, "address", h.Address(), "draining", len(h.Draining()))
	l.h = h
	return l, nil
}

// Address implements agent.DataPlane.
func (l *dataPlaneLink) Address() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h.Address()
}

// Alive implements agent.DataPlane. Every answer's counters are noted.
func (l *dataPlaneLink) Alive(ctx context.Context) bool {
	l.mu.Lock()
	h := l.h
	l.mu.Unlock()
	hello, err := h.Ping(ctx)
	if err == nil {
		l.note(hello)
	}
	return err == nil
}

func (l *dataPlaneLink) note(h dataplane.Hello) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[uint64]dataplane.Counters{}
	}
	l.seen[h.Generation] = h.Counters
}

// Totals are the data-plane counters summed over every generation this
// node process has seen (read now for the running ones, the serving one
// and one draining after a switch, as last read for the others), so they
// never go down when a process is replaced or hands over.
func (l *dataPlaneLink) Totals(ctx context.Context) dataplane.Counters {
	l.mu.Lock()
	h := l.h
	l.mu.Unlock()
	for _, hello := range h.Hellos(ctx) {
		l.note(hello)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	t := dataplane.Counters{Refused: map[string]uint64{}}
	for _, c := range l.seen {
		t.Connections += c.Connections
		t.BytesIn += c.BytesIn
		t.BytesOut += c.BytesOut
		for code, n := range c.Refused {
			t.Refused[code] += n
		}
	}
	return t
}

var _ agent.DataPlaneActivity = (*dataPlaneLink)(nil)

// Activity implements agent.DataPlaneActivity: each Instance's
// connections over every running generation, the serving one and those
// still draining after a switch (whose connections are served to their
// end). Without the serving one's answer, or from a build that does not
// count them, it cannot tell.
func (l *dataPlaneLink) Activity(ctx context.Context) (map[string]agent.InstanceConns, bool) {
	l.mu.Lock()
	h := l.h
	l.mu.Unlock()
	hellos := h.Hellos(ctx)
	if len(hellos) == 0 || hellos[0].Generation != h.Generation {
		return nil, false
	}
	out := map[string]agent.InstanceConns{}
	for _, hello := range hellos {
		l.note(hello)
		if !hello.Activity {
			return nil, false
		}
		for id, c := range hello.Instances {
			sum := out[id]
			sum.Open += c.Open
			sum.Bound += c.Bound
			out[id] = sum
		}
	}
	return out, true
}

// Leaf is the data plane's current certificate (nil before the first),
// for a CA rotation's status.
func (l *dataPlaneLink) Leaf() *x509.Certificate {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaf
}

// Update implements agent.DataPlane. A process that is gone (not merely
// slow) is replaced by a new generation, which gets the state at once.
func (l *dataPlaneLink) Update(ctx context.Context, targets []agent.DataTarget, keys [][]byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.credentials(ctx); err != nil {
		return err
	}
	st := dataplane.State{CertPEM: l.cert, KeyPEM: l.key, Targets: []dataplane.Target{}}
	for _, k := range keys {
		st.PublicKeys = append(st.PublicKeys, k)
	}
	if len(keys) > 0 { // none before the first welcome: the process refuses the state
		st.PublicKey = keys[0]
	}
	for _, t := range targets {
		st.Targets = append(st.Targets, dataplane.Target{WorkspaceID: t.WorkspaceID, InstanceID: t.InstanceID, DataSocket: t.DataSocket, GuestBoot: t.GuestBoot})
	}
	err := l.h.Push(ctx, st)
	if err == nil || errors.Is(err, dataplane.ErrNotAcknowledged) {
		return err
	}
	h, eerr := dataplane.Ensure(ctx, l.cfg)
	if eerr != nil {
		return fmt.Errorf("%v; restarting it failed: %w", err, eerr)
	}
	l.log.Warn("data-plane process replaced", "unit", h.Unit, "generation", h.Generation, "reason", err)
	l.h = h
	return h.Push(ctx, st)
}
