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
		socks, err = ListenSockets(s.cfg.TCPListen, s.cfg.DNSListen)
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
	num := s.lastGen + 1
	if err := writeGeneration(s.cfg.StateDir, num); err != nil {
		return nil, err
	}
	s.lastGen = num
	g := &generation{num: num, unit: UnitName(s.cfg.Scope, num)}
	argv := []string{s.cfg.Executable, "egress", "serve", "--socket-dir", s.cfg.SocketDir,
		"--generation", strconv.FormatUint(num, 10), "--warm-connections", strconv.Itoa(s.cfg.WarmConnections)}
	if s.cfg.LogFormat != "" {
		argv = append(argv, "--log-format", s.cfg.LogFormat)
	}
	u, err := s.cfg.Units.StartService(ctx, units.Spec{
		Name:        g.unit,
		Description: "kibotos egress (generation " + strconv.FormatUint(num, 10) + ")",
		Argv:        argv,
		Slice:       units.EgressSlice,
		// Its group is the account's own (systemd's default for User=).
		User:               s.acct.name,
		NoNewPrivileges:    true,
		NoCapabilities:     true,
		ReadOnlyFilesystem: true,
		ReadWritePaths:     []string{s.cfg.SocketDir},
		InaccessiblePaths:  []string{s.cfg.StateDir},
		UMask:              0o077,
		// Its connections to proxies and upstreams leave from the node's
		// namespace.
		NetworkNamespacePath: s.managerNetNS(),
	})
	if err != nil {
		return nil, fmt.Errorf("egress: start generation %d: %w", num, err)
	}
	g.mainPID = u.MainPID
	if err := s.waitControl(ctx, g); err != nil {
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

// waitControl waits for g's control socket to answer: Type=exec returns
// once the binary runs, not once it listens.
func (s *Supervisor) waitControl(ctx context.Context, g *generation) error {
	deadline := time.Now().Add(startTimeout)
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		err := s.dial(dctx, g)
		cancel()
		if err == nil {
			return nil
		}
		u, gerr := s.cfg.Units.Get(ctx, g.unit)
		if gerr != nil || !u.Active() {
			state := "gone"
			if gerr == nil {
				state = fmt.Sprintf("%s/%s, result %s, exit status %d", u.ActiveState, u.SubState, u.Result, u.ExecMainStatus)
			}
			return fmt.Errorf("egress: generation %d (%s) exited at start (%s): its log says why (journalctl -u %s)", g.num, g.unit, state, g.unit)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("egress: generation %d (%s) runs but its control socket does not answer after %v: %v (journalctl -u %s)", g.num, g.unit, startTimeout, err, g.unit)
		}
		if serr := ctxsleep.Sleep(ctx, 20*time.Millisecond); serr != nil {
			return fmt.Errorf("egress: generation %d (%s): waiting for its control socket: %w", g.num, g.unit, serr)
		}
	}
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
