package ctrl

import (
	"cmp"
	"context"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// commandExpiryBatch bounds the command records one expiry entry drops:
// about 60 ms of every member's apply on this project's 2-core machines
// (`go test ./fsm -bench CommandsExpire`), so that writes wait no longer
// behind it.
const commandExpiryBatch = 2000

// expireCommands drops the command records past their retention, in
// bounded entries until budget when every voter takes a limit; it
// reports whether old records are left for the next tick.
func (l *Leader) expireCommands(ctx context.Context, budget time.Time) bool {
	t := l.t
	retention := cmp.Or(t.CommandRetention, fsm.CommandRetentionHours*time.Hour)
	args := fsm.CommandsExpireArgs{Before: time.Now().Add(-retention).UTC()}
	if l.levels.Reach("bounded command expiry", fsm.LevelExpireLimit) == nil {
		args.Limit = cmp.Or(t.CommandExpiryBatch, commandExpiryBatch)
	}
	for {
		res, err := l.c.ApplyOp(ctx, fsm.OpCommandsExpire, args)
		if err == nil {
			err = res.Err()
		}
		var out fsm.CommandsExpireResult
		if err == nil {
			err = json.Unmarshal(res.Value, &out)
		}
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("command expiry failed; the next one retries", "err", err)
			}
			return false
		}
		if !out.More {
			return false
		}
		if time.Now().After(budget) {
			return true
		}
	}
}

// sweepSessions closes the sessions the state holds open that no control
// connection to this leader backs (they were the previous leader's).
func (l *Leader) sweepSessions(ctx context.Context) {
	var live map[string]string
	l.c.View(func(tx *bolt.Tx) error {
		var err error
		live, err = fsm.LiveSessions(tx)
		return err
	})
	for node, sid := range live {
		if !l.c.SessionAttached(node, sid) {
			l.c.ApplyOp(ctx, fsm.OpSessionClose, fsm.SessionCloseArgs{NodeID: node, SessionID: sid, Reason: "no control connection to the leader"})
		}
	}
}

// reconcileVoters drops retired or revoked ctrl members from the voters.
func (l *Leader) reconcileVoters() {
	servers, err := l.c.Servers()
	if err != nil {
		return
	}
	for _, srv := range servers {
		id := srv.ID
		if id == l.id {
			continue
		}
		var n *api.Node
		if err := l.c.View(func(tx *bolt.Tx) (err error) { n, err = fsm.GetNode(tx, id); return }); err != nil {
			continue
		}
		if n.Retired || n.Admission != api.Admitted {
			l.log.Info("removing ctrl voter", "voter", id, "status", n.Status)
			l.c.RemoveServer(id)
		}
	}
}
