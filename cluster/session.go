package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"sync"
	"time"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// sessionRegistry holds the control connections attached to this leader.
type sessionRegistry struct {
	mu    sync.Mutex
	conns map[string]*liveSession // by node id
}

type liveSession struct {
	nodeID, sessionID string
	conn              net.Conn
	kick              chan struct{} // pending Workspace commands may have changed
}

// kickAll wakes every session's dispatcher.
func (r *sessionRegistry) kickAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ls := range r.conns {
		ls.wake()
	}
}

// kick wakes the dispatchers of the named nodes' sessions.
func (r *sessionRegistry) kick(nodes []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range nodes {
		if ls := r.conns[n]; ls != nil {
			ls.wake()
		}
	}
}

func (ls *liveSession) wake() {
	select {
	case ls.kick <- struct{}{}:
	default:
	}
}

func (r *sessionRegistry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}

func newSessionRegistry() *sessionRegistry {
	return &sessionRegistry{conns: map[string]*liveSession{}}
}

func (r *sessionRegistry) attach(ls *liveSession) {
	r.mu.Lock()
	old := r.conns[ls.nodeID]
	r.conns[ls.nodeID] = ls
	r.mu.Unlock()
	if old != nil {
		old.conn.Close() // a node has one session: the newest wins
	}
}

func (r *sessionRegistry) detach(ls *liveSession) {
	r.mu.Lock()
	if r.conns[ls.nodeID] == ls {
		delete(r.conns, ls.nodeID)
	}
	r.mu.Unlock()
}

func (r *sessionRegistry) attached(nodeID, sessionID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ls := r.conns[nodeID]
	return ls != nil && ls.sessionID == sessionID
}

func (r *sessionRegistry) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ls := range r.conns {
		ls.conn.Close()
	}
}

func (s *Server) acceptSessions() {
	l := newChanListener(s.mux, s.mux.session)
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		// Each session is the member's until it ends: Shutdown and Kill
		// close the connections, then wait for s.wg.
		s.wg.Go(func() { s.handleSession(c) })
	}
}

func newSessionID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "sess-" + hex.EncodeToString(b)
}

// sessionConn serializes writes of one control connection. Its encoder
// writes what the standard library's does (one compact message a line,
// HTML escaped), in about half its CPU.
type sessionConn struct {
	c   net.Conn
	mu  sync.Mutex
	enc *json.Encoder
}

func (sc *sessionConn) send(m api.SessionMsg) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return sc.enc.Encode(m)
}

// handleSession runs one control session on the leader: open it in the
// FSM, measure the clock and take full reports at every sync, push new
// overcommit values, and close it in the FSM when the connection ends or the
// node goes quiet for SessionTimeout.
func (s *Server) handleSession(c net.Conn) {
	defer c.Close()
	t := s.cfg.Timings
	peer := c.(*watchedConn).id
	sc := &sessionConn{c: c, enc: json.NewEncoder(c)}
	dec := api.NewSessionDecoder(c)
	c.SetReadDeadline(time.Now().Add(t.SessionTimeout))
	var hello api.SessionMsg
	if err := dec.Decode(&hello); err != nil || hello.Type != api.MsgHello {
		return
	}
	if hello.NodeID != peer.NodeID {
		s.log.Warn("control session refused", "peer", peer.Name(), "claimed_node_id", hello.NodeID, "reason", "certificate of another node")
		sc.send(api.SessionMsg{Type: api.MsgRefused, Refusal: fsm.RefusalNotAdmitted,
			Message: fmt.Sprintf("the certificate of node %s cannot open a control session for node %q: a node opens a session only with its own member certificate", peer.NodeID, hello.NodeID)})
		return
	}
	if !s.IsLeader() {
		sc.send(api.SessionMsg{Type: api.MsgRedirect, Leader: s.leaderAddr()})
		return
	}
	ctx, cancel := context.WithCancel(s.life)
	defer cancel()
	sid := newSessionID()
	res, err := s.ApplyOp(ctx, fsm.OpSessionOpen, fsm.SessionOpenArgs{
		NodeID: hello.NodeID, SessionID: sid, Incarnation: hello.Incarnation, Release: hello.Release, Revision: hello.Revision, Address: "",
	})
	if err == nil && res.Error != nil {
		err = res.Error
	}
	if err != nil {
		sc.send(api.SessionMsg{Type: api.MsgRedirect, Leader: s.leaderAddr(), Message: err.Error()})
		return
	}
	var open fsm.SessionOpenResult
	json.Unmarshal(res.Value, &open)
	if !open.Accepted {
		s.log.Warn("control session refused", "peer_node_id", hello.NodeID, "incarnation", hello.Incarnation, "refusal", open.Refusal, "reason", open.Message)
		sc.send(api.SessionMsg{Type: api.MsgRefused, Refusal: open.Refusal, Message: open.Message})
		return
	}
	ls := &liveSession{nodeID: hello.NodeID, sessionID: sid, conn: c, kick: make(chan struct{}, 1)}
	s.sessions.attach(ls)
	defer s.sessions.detach(ls)
	s.log.Info("control session opened", "peer_node_id", hello.NodeID, "session_id", sid, "incarnation", hello.Incarnation)

	reason := s.runSession(ctx, sc, dec, ls)
	s.log.Info("control session closed", "peer_node_id", hello.NodeID, "session_id", sid, "reason", reason)
	if s.IsLeader() {
		// Recorded even as the member stops: the session ended either way.
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(s.life), 5*time.Second)
		s.ApplyOp(cctx, fsm.OpSessionClose, fsm.SessionCloseArgs{NodeID: hello.NodeID, SessionID: sid, Reason: reason})
		ccancel()
	}
}

func (s *Server) runSession(ctx context.Context, sc *sessionConn, dec *api.SessionDecoder, ls *liveSession) string {
	t := s.cfg.Timings
	nodeID, sid := ls.nodeID, ls.sessionID
	welcome := api.SessionMsg{Type: api.MsgWelcome, SessionID: sid, ResultReports: true}
	// After attach: a rotation that changes the keys from here on ends
	// this session, and the node learns them in its next welcome.
	if welcome.CredentialKeys = s.CredentialPublicKeys(); len(welcome.CredentialKeys) > 0 {
		welcome.CredentialKey = welcome.CredentialKeys[0] // for nodes of earlier builds
	}
	if err := sc.send(welcome); err != nil {
		return "connection lost"
	}
	disp := &dispatcher{s: s, nodeID: nodeID, sc: sc, sent: map[string]time.Time{}}
	msgs := make(chan api.SessionMsg, 16)
	readErr := make(chan error, 1)
	// The reader ends before the session does. The connection stays open
	// until handleSession recorded the close: the node must not open its
	// next session before that, so the reader is stopped with a deadline.
	readCtx, stopReading := context.WithCancel(ctx)
	readDone := make(chan struct{})
	defer func() {
		stopReading()
		sc.c.SetReadDeadline(time.Now())
		<-readDone
	}()
	go func() {
		defer close(readDone)
		for {
			var m api.SessionMsg
			sc.c.SetReadDeadline(time.Now().Add(t.SessionTimeout))
			if readCtx.Err() != nil { // after the deadline: stopReading's wins
				return
			}
			if err := dec.Decode(&m); err != nil {
				readErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-readCtx.Done():
				return
			}
		}
	}()
	requestSync := func() error {
		return sc.send(api.SessionMsg{Type: api.MsgSync, T1: s.wallNow().UnixNano()})
	}
	if err := requestSync(); err != nil {
		return "connection lost"
	}
	if err := disp.run(); err != nil {
		return "connection lost"
	}
	ping := time.NewTicker(t.SessionPing)
	defer ping.Stop()
	syncT := time.NewTicker(t.SyncInterval)
	defer syncT.Stop()
	var pendingAck *api.Multipliers
	var pendingSince time.Time
	var roundSync time.Time // a sync postponed to the round due then
	// pushOvercommit sends values the node has not acknowledged; it returns
	// why the session must end, or "".
	pushOvercommit := func(o api.Overcommit) string {
		if o.Acknowledged {
			return ""
		}
		want := api.Multipliers{CPU: o.CPU, Memory: o.Memory}
		switch {
		case pendingAck == nil || *pendingAck != want:
			pendingAck, pendingSince = &want, time.Now()
			if sc.send(api.SessionMsg{Type: api.MsgOvercommit, Overcommit: &want}) != nil {
				return "connection lost"
			}
		case time.Since(pendingSince) > t.AckTimeout:
			// The seed: a node that does not confirm is disconnected
			// and gets the value again after it reconnects.
			return "overcommit values not acknowledged within " + t.AckTimeout.String()
		}
		return ""
	}
	// A new session gets the values at once: ctrl places nothing on the
	// node until it acknowledged them.
	if c, err := s.sessionCheck(nodeID); err == nil {
		if why := pushOvercommit(c.Overcommit); why != "" {
			return why
		}
	}
	for {
		select {
		case err := <-readErr:
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return "no word from the node for " + t.SessionTimeout.String()
			}
			return "connection closed"
		case <-s.stop:
			return "ctrl member stopping"
		case <-syncT.C:
			if at, ok := s.rounds.Soon(nodeID, time.Now(), t.SyncInterval/2); ok {
				roundSync = at // the ping after it sends the sync
				continue
			}
			if requestSync() != nil {
				return "connection lost"
			}
		case <-ls.kick:
			if disp.run() != nil {
				return "connection lost"
			}
		case <-ping.C:
			if !s.IsLeader() {
				return "leadership lost"
			}
			c, err := s.sessionCheck(nodeID)
			if err != nil {
				continue
			}
			if !c.Admitted || c.SessionID != sid {
				status := "unknown"
				if n, err := s.localNode(nodeID); err == nil {
					status = n.Status
				}
				sc.send(api.SessionMsg{Type: api.MsgRefused, Refusal: fsm.RefusalNotAdmitted, Message: "node " + nodeID + " is no longer admitted (" + status + ")"})
				return "node " + status
			}
			if why := pushOvercommit(c.Overcommit); why != "" {
				return why
			}
			if !roundSync.IsZero() && !time.Now().Before(roundSync) {
				roundSync = time.Time{}
				syncT.Reset(t.SyncInterval)
				if requestSync() != nil {
					return "connection lost"
				}
			}
			if sc.send(api.SessionMsg{Type: api.MsgPing, T1: s.wallNow().UnixNano()}) != nil {
				return "connection lost"
			}
			if disp.run() != nil {
				return "connection lost"
			}
		case m := <-msgs:
			switch m.Type {
			case api.MsgReport:
				if err := s.applyReport(ctx, sc, nodeID, sid, m, s.wallNow().UnixNano()); err != nil {
					s.log.Warn("node report not stored", "peer_node_id", nodeID, "err", err)
					if api.CodeOf(err) == api.CodeFailedPrecondition {
						return "session replaced"
					}
				}
			case api.MsgTaskResult:
				if m.TaskResult == nil {
					break
				}
				resErr, repErr := s.applyTaskResult(ctx, sc, nodeID, sid, m)
				if resErr != nil {
					s.log.Warn("workspace task result not stored", "peer_node_id", nodeID, "workspace_id", m.TaskResult.WorkspaceID, "err", resErr)
				}
				if repErr != nil {
					s.log.Warn("node report not stored", "peer_node_id", nodeID, "err", repErr)
					if api.CodeOf(repErr) == api.CodeFailedPrecondition {
						return "session replaced"
					}
				}
			case api.MsgVolumeResult:
				if m.VolumeResult != nil {
					if err := s.applyVolumeResult(ctx, nodeID, sid, m.VolumeResult); err != nil {
						s.log.Warn("volume task result not stored", "peer_node_id", nodeID, "volume_id", m.VolumeResult.VolumeID, "err", err)
					}
				}
			case api.MsgOvercommitAck:
				if m.Overcommit != nil {
					res, err := s.ApplyOp(ctx, fsm.OpOvercommitAck, fsm.OvercommitAckArgs{NodeID: nodeID, SessionID: sid, Values: *m.Overcommit})
					if err == nil && res.Error == nil && pendingAck != nil && *pendingAck == *m.Overcommit {
						pendingAck = nil
					}
				}
			}
		}
	}
}

// applyReport stores a full report; a report answering a sync carries the
// four timestamps of the clock measurement (NTP style).
func (s *Server) applyReport(ctx context.Context, sc *sessionConn, nodeID, sid string, m api.SessionMsg, t4 int64) error {
	if m.Report == nil {
		return nil
	}
	args := s.reportArgs(nodeID, sid, m)
	if m.T1 != 0 && m.T2 != 0 && m.T3 != 0 {
		offset := ((m.T2 - m.T1) + (m.T3 - t4)) / 2
		uncertainty := ((t4 - m.T1) - (m.T3 - m.T2)) / 2
		if uncertainty < 0 {
			uncertainty = 0
		}
		args.Clock = &fsm.ClockArgs{OffsetNS: offset, UncertaintyNS: uncertainty, KernelSync: m.KernelSync}
	}
	res, err := s.ApplyOp(ctx, fsm.OpNodeReport, args)
	if err != nil {
		return err
	}
	if err := res.Err(); err != nil {
		return err
	}
	var rr fsm.ReportResult
	if json.Unmarshal(res.Value, &rr) == nil {
		return sendForget(sc, rr)
	}
	return nil
}

// reportArgs is the entry's form of the report in m, with what the
// voters' levels allow of it.
func (s *Server) reportArgs(nodeID, sid string, m api.SessionMsg) fsm.ReportArgs {
	args := fsm.ReportArgs{NodeID: nodeID, SessionID: sid, Report: *m.Report, HostUsage: m.HostUsage}
	s.rounds.Mark(&args, time.Now())
	args.OOMStops = s.levels.TroubleshootingRules()
	if len(args.Report.TemplateDigests) > 0 && s.levelsReach("template catalog", fsm.LevelArtifacts) != nil {
		args.Report.TemplateDigests = nil // a voter below the level would not store them
	}
	if len(args.Report.Warm) > 0 && s.levelsReach("warm guests", fsm.LevelWarm) != nil {
		args.Report.Warm = nil
	}
	return args
}

// sendForget tells the node what a stored report concluded: it may
// delete those records, and keeps those ctrl does not recognize without
// sending them again.
func sendForget(sc *sessionConn, rr fsm.ReportResult) error {
	if len(rr.Forget) == 0 && len(rr.Unrecognized) == 0 {
		return nil
	}
	return sc.send(api.SessionMsg{Type: api.MsgForget, Forget: rr.Forget, Unrecognized: rr.Unrecognized})
}

func (s *Server) localNode(id string) (*api.Node, error) {
	var n *api.Node
	err := s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		n, err = fsm.GetNode(tx, id)
		return err
	})
	return n, err
}

// sessionCheck is what a control session checks of its node at every
// ping, from the local state.
func (s *Server) sessionCheck(id string) (fsm.SessionCheck, error) {
	var c fsm.SessionCheck
	err := s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		c, err = fsm.GetSessionCheck(tx, id)
		return err
	})
	return c, err
}

// kickAllSessions makes every control session deliver its node's pending
// Workspace commands now.
func (s *Server) kickAllSessions() { s.sessions.kickAll() }
