package agent

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/buildinfo"
)

// welcomeKeys are the credential keys of a welcome: CredentialKeys, or
// CredentialKey alone from a leader of an earlier build. They come from
// the network: at most api.MaxCredentialKeys ed25519 public keys.
func welcomeKeys(m api.SessionMsg) ([][]byte, error) {
	keys := m.CredentialKeys
	if len(keys) == 0 && len(m.CredentialKey) > 0 {
		keys = [][]byte{m.CredentialKey}
	}
	if len(keys) > api.MaxCredentialKeys {
		return nil, fmt.Errorf("%d credential keys, at most %d (the cluster CA's and, during a rotation, the next CA's): the leader's build is not compatible with this node's; upgrade it", len(keys), api.MaxCredentialKeys)
	}
	for _, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("a credential key of %d bytes, want %d (an ed25519 public key): the leader's build is not compatible with this node's; upgrade it", len(k), ed25519.PublicKeySize)
		}
	}
	return keys, nil
}

// CredentialKeys are the keys the node's data plane verifies credentials
// with, the signing key first, as the last welcome sent them.
func (a *Agent) CredentialKeys() [][]byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.credentialKeys)
}

// connectOnce finds the leader and runs one session; it returns when the
// session ends.
func (a *Agent) connectOnce(ctx context.Context) error {
	addrs := a.cfg.CtrlAddrs()
	if len(addrs) == 0 {
		return errors.New("no ctrl member known")
	}
	var lastErr error
	tried := map[string]bool{}
	for i := 0; i < len(addrs) && i < 8; i++ {
		addr := addrs[i]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		leader, err := a.session(ctx, addr)
		if leader != "" && !tried[leader] {
			addrs = append(addrs[:i+1], append([]string{leader}, addrs[i+1:]...)...)
		}
		if err == nil || errors.Is(err, ErrIsolated) || errors.Is(err, ErrStale) || ctx.Err() != nil {
			return err
		}
		lastErr = err
	}
	return lastErr
}

// session runs one control session against addr. It returns the leader's
// address when addr redirected.
func (a *Agent) session(ctx context.Context, addr string) (redirect string, err error) {
	conn, err := a.cfg.Dial(ctx, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	enc := json.NewEncoder(conn)
	dec := api.NewSessionDecoder(conn)
	var wmu sync.Mutex
	send := func(m api.SessionMsg) error {
		wmu.Lock()
		defer wmu.Unlock()
		conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		return enc.Encode(m)
	}
	if err := send(api.SessionMsg{Type: api.MsgHello, NodeID: a.cfg.NodeID, Incarnation: a.incarnation,
		Release: buildinfo.ReleaseName(), Revision: buildinfo.SourceRevision()}); err != nil {
		return "", err
	}
	conn.SetReadDeadline(time.Now().Add(a.cfg.SessionTimeout + 5*time.Second))
	var first api.SessionMsg
	if err := dec.Decode(&first); err != nil {
		return "", err
	}
	switch first.Type {
	case api.MsgRedirect:
		return first.Leader, fmt.Errorf("%s is not the ctrl leader (%s)", addr, first.Message)
	case api.MsgRefused:
		return "", a.refusal(first)
	case api.MsgWelcome:
	default:
		return "", fmt.Errorf("unexpected %q from %s", first.Type, addr)
	}
	keys, err := welcomeKeys(first)
	if err != nil {
		return "", fmt.Errorf("welcome from %s: %w", addr, err)
	}
	a.mu.Lock()
	a.sessionID, a.send, a.resultReports = first.SessionID, send, first.ResultReports
	if len(keys) > 0 { // a leader without a CA key sends none: keep the last
		a.credentialKeys = keys
	}
	a.mu.Unlock()
	a.bg.spawn(ctx, a.updateDataPlane)
	defer func() {
		a.mu.Lock()
		a.sessionID, a.send, a.resultReports = "", nil, false
		a.mu.Unlock()
	}()
	a.log.Info("control session established", "session_id", first.SessionID, "ctrl", addr, "incarnation", a.incarnation)
	if a.cfg.OnLeader != nil {
		a.cfg.OnLeader(addr) // only the leader accepts sessions
	}
	for {
		conn.SetReadDeadline(time.Now().Add(a.cfg.SessionTimeout))
		var m api.SessionMsg
		if err := dec.Decode(&m); err != nil {
			return "", fmt.Errorf("control session %s: %w", first.SessionID, err)
		}
		recv := a.now()
		switch m.Type {
		case api.MsgPing:
			err = send(api.SessionMsg{Type: api.MsgPong, T1: m.T1, T2: recv, T3: a.now()})
		case api.MsgSync:
			err = a.sendReport(send, func(r *api.SessionMsg) {
				r.KernelSync, r.T1, r.T2, r.T3 = kernelSync(), m.T1, recv, a.now()
			})
		case api.MsgOvercommit:
			if m.Overcommit != nil {
				a.mu.Lock()
				v := *m.Overcommit
				a.overcommit = &v
				a.mu.Unlock()
				a.log.Info("overcommit values applied", "cpu", v.CPU.String(), "memory", v.Memory.String())
				err = send(api.SessionMsg{Type: api.MsgOvercommitAck, Overcommit: &v})
			}
		case api.MsgForget:
			if rt := a.cfg.Runtime; rt != nil && len(m.Forget) > 0 {
				if err := rt.ForgetEnded(m.Forget); err != nil {
					a.log.Warn("ended-instance records not deleted", "err", err)
				}
			}
			a.keepUnrecognized(m.Unrecognized)
		case api.MsgNodeState:
			if m.Draining != nil {
				a.mu.Lock()
				changed := a.draining != *m.Draining
				a.draining = *m.Draining
				a.mu.Unlock()
				if changed {
					a.log.Info("drain request changed: new Workspaces are refused while draining", "draining", *m.Draining)
				}
			}
		case api.MsgTask:
			if m.Task != nil && (a.cfg.HoldTask == nil || !a.cfg.HoldTask(*m.Task)) {
				a.handleTask(ctx, *m.Task)
			}
		case api.MsgVolumeTask:
			if m.VolumeTask != nil {
				a.handleVolumeTask(ctx, *m.VolumeTask)
			}
		case api.MsgRefused:
			return "", a.refusal(m)
		}
		if err != nil {
			return "", err
		}
	}
}

func (a *Agent) refusal(m api.SessionMsg) error {
	switch m.Refusal {
	case api.RefusalIsolated:
		return fmt.Errorf("%w: %s", ErrIsolated, m.Message)
	case api.RefusalStale:
		return fmt.Errorf("%w: %s", ErrStale, m.Message)
	default:
		a.log.Warn("control session refused", "refusal", m.Refusal, "reason", m.Message)
		return fmt.Errorf("control session refused: %s", m.Message)
	}
}

// kernelSync is what adjtimex says of the host's time synchronization.
func kernelSync() string {
	var tx unix.Timex
	state, err := unix.Adjtimex(&tx)
	switch {
	case err != nil:
		return "unknown"
	case state == unix.TIME_ERROR || tx.Status&unix.STA_UNSYNC != 0:
		return "unsynchronized"
	default:
		return "synchronized"
	}
}
