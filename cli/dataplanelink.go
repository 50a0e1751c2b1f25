package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/vmm/units"
)

// dataPlaneLink is the node's side of its data-plane process: it starts or
// adopts the process and delivers the targets, key and certificate.
type dataPlaneLink struct {
	cfg       dataplane.SupervisorConfig
	cert, key []byte
	log       *slog.Logger

	mu sync.Mutex
	h  *dataplane.Handle
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

// startDataPlane ensures the node's data-plane process runs (adopting one
// of this build) under m.
func startDataPlane(ctx context.Context, d datadir.Dir, m *units.Manager, listen string, log *slog.Logger) (*dataPlaneLink, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("data plane: locate the kibotos executable: %w", err)
	}
	cert, err := os.ReadFile(d.MemberCert())
	if err != nil {
		return nil, fmt.Errorf("data plane: %w", err)
	}
	key, err := os.ReadFile(d.MemberKey())
	if err != nil {
		return nil, fmt.Errorf("data plane: %w", err)
	}
	sockDir := filepath.Join(d.NodeDir(), "dataplane")
	l := &dataPlaneLink{cert: cert, key: key, log: log, cfg: dataplane.SupervisorConfig{
		Units: m, Executable: exe, Scope: dataplane.ScopeFor(sockDir), SocketDir: sockDir, Listen: listen, Logger: log,
	}}
	h, err := dataplane.Ensure(ctx, l.cfg)
	if err != nil {
		return nil, err
	}
	how := "started"
	if h.Adopted {
		how = "adopted"
	}
	log.Info("data-plane process "+how, "unit", h.Unit, "generation", h.Generation, "address", h.Address())
	l.h = h
	return l, nil
}

// Address implements agent.DataPlane.
func (l *dataPlaneLink) Address() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h.Address()
}

// Alive implements agent.DataPlane.
func (l *dataPlaneLink) Alive(ctx context.Context) bool {
	l.mu.Lock()
	h := l.h
	l.mu.Unlock()
	_, err := h.Ping(ctx)
	return err == nil
}

// Update implements agent.DataPlane. A process that is gone (not merely
// slow) is replaced by a new generation, which gets the state at once.
func (l *dataPlaneLink) Update(ctx context.Context, targets []agent.DataTarget, key []byte) error {
	st := dataplane.State{PublicKey: key, CertPEM: l.cert, KeyPEM: l.key, Targets: []dataplane.Target{}}
	for _, t := range targets {
		st.Targets = append(st.Targets, dataplane.Target{WorkspaceID: t.WorkspaceID, InstanceID: t.InstanceID, DataSocket: t.DataSocket})
	}
	l.mu.Lock()
	defer l.mu.Unlock()
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
