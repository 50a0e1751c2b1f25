package cluster

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/ctrl"
	"github.com/kibotos/kibotos/fsm"
)

// raftConfig is this ctrl member's Raft configuration: the timings of
// its Config, leadership changes sent to s.leadership.
func (s *Server) raftConfig() *raft.Config {
	c := raft.DefaultConfig()
	c.LocalID = raft.ServerID(s.id.NodeID)
	t := s.cfg.Timings
	c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = t.RaftHeartbeat, t.RaftElection, t.RaftLeaderLease
	// CommitTimeout is the idle replication tick; the library default
	// (50 ms) keeps an idle cluster quiet, writes do not wait for it.
	c.SnapshotThreshold = t.SnapshotThreshold
	c.SnapshotInterval = 30 * time.Second
	c.TrailingLogs = 4096
	c.BatchApplyCh = true
	c.MaxAppendEntries = 256
	c.Logger = s.hclog("raft", hclog.Warn)
	c.NotifyCh = s.leadership
	return c
}

// startRaft opens the log, stable and snapshot stores in the data
// directory and starts this member's Raft node with the FSM.
func (s *Server) startRaft() error {
	d := s.cfg.DataDir
	if err := os.MkdirAll(d.RaftDir(), 0o700); err != nil {
		return err
	}
	var err error
	if s.fsm, err = fsm.Open(d.StateFile()); err != nil {
		return err
	}
	if s.logStore, err = openLogStore(s.life, d.RaftDir(), s.log, s.hclog("raft-wal", hclog.Warn)); err != nil {
		return err
	}
	snaps, err := openSnapshots(d.RaftDir(), s.hclog("snapshot", hclog.Warn))
	if err != nil {
		return err
	}
	adv, err := net.ResolveTCPAddr("tcp", s.id.Advertise)
	if err != nil {
		return fmt.Errorf("advertise address %s: %w", s.id.Advertise, err)
	}
	layer := &raftLayer{chanListener: newChanListener(s.mux, s.mux.raft), life: s.life, advertise: adv, client: s.client, serverAt: s.serverAt}
	s.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: layer, MaxPool: 5, Timeout: 10 * time.Second,
		Logger: s.hclog("raft-net", hclog.Error),
	})
	rf := &raftFSM{f: s.fsm, changed: s.changed, admission: s.noteAdmissionChanges, halt: s.halt, stopped: s.stop}
	s.rfsm = rf
	// The leader replicates recent entries from memory instead of reading
	// them back from the log store.
	logs, err := raft.NewLogCache(1024, s.logStore)
	if err != nil {
		return err
	}
	r, err := raft.NewRaft(s.raftConfig(), rf, logs, s.logStore, snaps, s.transport)
	if err != nil {
		if rf.restoreErr != nil {
			return fmt.Errorf("start raft in %s: %w", d.RaftDir(), rf.restoreErr)
		}
		return fmt.Errorf("start raft in %s: %w", d.RaftDir(), err)
	}
	s.raft = r
	s.levels = s.newLevels()
	s.rounds = ctrl.NewRounds(s.levels, s.fsm.View)
	s.leader = s.newLeader()
	return s.levels.CheckState()
}

// halt stops a member that cannot apply the log as the others do (see
// raftFSM.halt): it logs why, once, and shuts the member down; Halted and
// HaltErr tell the process, which exits with the error.
func (s *Server) halt(err error) {
	s.haltOnce.Do(func() {
		s.haltErr = err
		s.log.Error(err.Error(), "release", buildinfo.ReleaseName())
		close(s.halted)
		// Not here: raft.Shutdown waits for the goroutine that is applying
		// the log, which is this one. Shutdown and Kill wait for it.
		go func() {
			defer close(s.haltDone)
			<-s.opened
			s.stopOnce.Do(s.shutdown)
		}()
	})
}

// Halted is closed when the member stopped applying the Raft log and shut
// itself down; HaltErr says why.
func (s *Server) Halted() <-chan struct{} { return s.halted }

// HaltErr is why the member halted (an *api.Error), nil while it has not.
func (s *Server) HaltErr() error {
	select {
	case <-s.halted:
		return s.haltErr
	default:
		return nil
	}
}

// stopRaft shuts Raft down and releases the writes still waiting for it.
func (s *Server) stopRaft() {
	if s.raft != nil {
		s.raft.Shutdown().Error()
	}
	close(s.raftDown)
}

// hclog routes a hashicorp library's log lines into the member's log.
func (s *Server) hclog(name string, level hclog.Level) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: level, Output: slogWriter{s.log.With("component", name)}, DisableTime: true})
}

// slogWriter turns each written line into one structured log record.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn(strings.TrimSpace(string(p)))
	return len(p), nil
}
