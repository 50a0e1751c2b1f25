package egress

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/vmm/units"
)

// startTimeout bounds the wait for a new process to answer its control socket.
const startTimeout = 15 * time.Second

// listenWait is how long a busy address is tried again: a generation that
// just drained still answers the queries it read (DNSAnswerWindow) from
// its DNS socket before it closes it.
const listenWait = DNSAnswerWindow + 2*time.Second

// startServing starts a generation with new sockets and the config (mu
// held, no generation serving).
func (s *Supervisor) startServing(ctx context.Context) error {
	s.makeRoom(ctx, "a new generation is starting")
	socks, err := s.listen(ctx)
	if err != nil {
		return err
	}
	defer socks.Close()
	g, err := s.launch(ctx, socks)
	if err != nil {
		return err
	}
	s.current = g
	return nil
}

// listen makes the node's sockets, as root in the node's network
// namespace, trying a busy address again for listenWait.
func (s *Supervisor) listen(ctx context.Context) (Sockets, error) {
	var socks Sockets
	err := s.retryBusy(ctx, func() (err error) {
		socks, err = ListenSockets(ctx, s.cfg.TCPListen, s.cfg.DNSListen)
		return err
	})
	return socks, err
}

// listenDNSTCP makes only the DNS TCP listener, for a generation whose
// predecessor (an older build) had none to hand over.
func (s *Supervisor) listenDNSTCP(ctx context.Context) (*os.File, error) {
	var f *os.File
	err := s.retryBusy(ctx, func() (err error) {
		f, err = ListenDNSTCP(s.cfg.DNSListen)
		return err
	})
	return f, err
}

// retryBusy runs listen in the node's namespace until it does not find
// its address in use, for at most listenWait.
func (s *Supervisor) retryBusy(ctx context.Context, listen func() error) error {
	deadline := time.Now().Add(listenWait)
	for {
		err := inNetNS(s.cfg.NetNS, listen)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return err
		}
		if serr := ctxsleep.Sleep(ctx, 50*time.Millisecond); serr != nil {
			return err
		}
	}
}

// launch starts the next generation's unit, hands it socks (the caller
// closes its copies) and the config, and returns it serving. A generation
// that fails on the way is ended.
func (s *Supervisor) launch(ctx context.Context, socks Sockets) (*generation, error) {
	cfg := s.cfg
	p, err := s.series.Start(ctx, func(num uint64) units.Spec {
		argv := []string{cfg.Executable, "egress", "serve", "--socket-dir", cfg.SocketDir,
			"--generation", strconv.FormatUint(num, 10), "--warm-connections", strconv.Itoa(cfg.WarmConnections)}
		if cfg.LogFormat != "" {
			argv = append(argv, "--log-format", cfg.LogFormat)
		}
		return units.Spec{
			Description: "kibotos egress (generation " + strconv.FormatUint(num, 10) + ")",
			Argv:        argv,
			Slice:       units.EgressSlice,
			// Its group is the account's own (systemd's default for User=).
			User:               s.acct.name,
			NoNewPrivileges:    true,
			NoCapabilities:     true,
			ReadOnlyFilesystem: true,
			ReadWritePaths:     []string{cfg.SocketDir},
			InaccessiblePaths:  []string{cfg.StateDir},
			UMask:              0o077,
			// Its connections to proxies and upstreams leave from the node's
			// namespace.
			NetworkNamespacePath: s.managerNetNS(),
		}
	})
	if err != nil {
		return nil, err
	}
	num := p.Generation
	g := &generation{num: num, unit: p.Unit, mainPID: p.MainPID}
	// Type=exec returns once the binary runs, not once it listens.
	if err := s.series.AwaitReady(ctx, p, startTimeout, "", func(ctx context.Context) error { return s.dial(ctx, g) }); err != nil {
		s.end(ctx, g, "its start failed")
		return nil, err
	}
	if err := g.client.SendListeners(ctx, socks); err != nil {
		s.end(ctx, g, "its start failed")
		return nil, fmt.Errorf("egress: start generation %d: %w", num, err)
	}
	if err := g.client.SetConfig(ctx, s.config); err != nil {
		s.end(ctx, g, "its start failed")
		return nil, fmt.Errorf("egress: start generation %d: %w", num, err)
	}
	s.log.Info("egress generation started", "generation", num, "unit", g.unit, "main_pid", g.mainPID,
		"tcp", s.cfg.TCPListen, "dns", s.cfg.DNSListen, "routes", len(s.config.Routes))
	return g, nil
}

func (s *Supervisor) managerNetNS() string {
	if s.cfg.ManagerNetNS != "" {
		return s.cfg.ManagerNetNS
	}
	return s.cfg.NetNS
}

// inNetNS runs f on an OS thread in the network namespace at path (sockets
// made there stay there); path "" runs it here.
func inNetNS(path string, f func() error) error {
	if path == "" {
		return f()
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("egress: network namespace %s: %w", path, err)
	}
	defer ns.Close()
	return netpol.InNamespace(ns, f)
}
