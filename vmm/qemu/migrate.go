package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"github.com/kibotos/kibotos/internal/fdpass"
)

// Saving and restoring a VM through QEMU's migration stream. The stream
// goes to or comes from a file the caller opened and hands QEMU over the
// QMP socket (getfd): a sandboxed QEMU may not open files or start
// programs itself, and the caller decides where the file lives and how
// it is made durable.

// SendFD hands QEMU an open file under name (QMP getfd); a later command
// refers to it as "fd:<name>". QEMU keeps its own copy of the descriptor.
func (q *QMP) SendFD(ctx context.Context, name string, f *os.File) error {
	uc, ok := q.conn.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("qmp getfd on %s: not a unix socket", q.socket)
	}
	b, id, err := encodeRequest("getfd", map[string]string{"fdname": name})
	if err != nil {
		return err
	}
	fd, err := fdpass.FileFD(f)
	if err != nil {
		return fmt.Errorf("qmp getfd %s: %w", name, err)
	}
	return q.exchangeWith(ctx, "getfd", func() error { return fdpass.Send(uc, b, fd) }, "getfd", id)
}

// Version is QEMU's version, "MAJOR.MINOR.MICRO".
func (q *QMP) Version(ctx context.Context) (string, error) {
	var v struct {
		QEMU struct{ Major, Minor, Micro int } `json:"qemu"`
	}
	if err := q.Execute(ctx, "query-version", nil, &v); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d.%d.%d", v.QEMU.Major, v.QEMU.Minor, v.QEMU.Micro), nil
}

// Save stops the guest's vCPUs and writes the VM's whole state (memory
// and devices) to f, returning once QEMU completed the stream (the
// caller fsyncs f). The VM stays stopped; a save that failed or is to be
// given up on is undone with Abandon. QEMU's bandwidth cap (meant for
// live migration over a network) is lifted: the stream goes to a local
// file.
func (q *QMP) Save(ctx context.Context, f *os.File) error {
	if err := q.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return err
	}
	if err := q.Execute(ctx, "stop", nil, nil); err != nil {
		return err
	}
	if err := q.SendFD(ctx, "kibotos-save", f); err != nil {
		return err
	}
	if err := q.Execute(ctx, "migrate", map[string]any{"uri": "fd:kibotos-save"}, nil); err != nil {
		return err
	}
	return q.waitMigration(ctx, "save")
}

// Abandon undoes a Save that failed or was given up on at any step: the
// migration QEMU may still be running is cancelled (QEMU would otherwise
// go on saving behind the caller's back) and waited out, then the
// guest's vCPUs start again. A Save cut short by its context leaves the
// connection mid-exchange, unusable: it is dialed again first.
func (q *QMP) Abandon(ctx context.Context) error {
	if err := q.redialIfBroken(ctx); err != nil {
		return err
	}
	if err := q.Execute(ctx, "migrate_cancel", nil, nil); err != nil {
		return err
	}
	// The migration thread must be done before a cont: one sent while it
	// still runs can leave the vCPUs stopped. A cont is sent even when the
	// wait failed: without one the guest stays stopped for certain.
	werr := q.waitMigrationEnded(ctx)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := q.Cont(cctx); err != nil {
		return errors.Join(werr, err)
	}
	return werr
}

// Load loads the state a Save wrote from f into a QEMU started with
// Config.Incoming, which leaves the guest's vCPUs stopped (-S) until Cont.
func (q *QMP) Load(ctx context.Context, f *os.File) error {
	if err := q.SendFD(ctx, "kibotos-restore", f); err != nil {
		return err
	}
	if err := q.Execute(ctx, "migrate-incoming", map[string]any{"uri": "fd:kibotos-restore"}, nil); err != nil {
		return err
	}
	return q.waitMigration(ctx, "restore")
}

// Cont starts the guest's vCPUs. It is how a caller undoes its stop
// whatever became of its other calls, so a connection a cancelled call
// left unusable is dialed again first.
func (q *QMP) Cont(ctx context.Context) error {
	if err := q.redialIfBroken(ctx); err != nil {
		return err
	}
	return q.Execute(ctx, "cont", nil, nil)
}

// waitMigrationEnded polls the migration until it is over, however.
func (q *QMP) waitMigrationEnded(ctx context.Context) error {
	st, err := q.pollMigration(ctx, "", "none", "completed", "failed", "cancelled")
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("qmp save of %s: still %s after migrate_cancel: %w", q.socket, st.Status, ctx.Err())
	}
	return err
}

// waitMigration polls the migration until it completed or failed.
func (q *QMP) waitMigration(ctx context.Context, what string) error {
	st, err := q.pollMigration(ctx, "completed", "failed", "cancelled")
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("qmp %s of %s: %w", what, q.socket, ctx.Err())
	case err != nil:
		return err
	case st.Status != "completed":
		return fmt.Errorf("qmp %s of %s: migration %s: %s", what, q.socket, st.Status, st.Error)
	}
	return nil
}

// migrationStatus is what query-migrate says of the migration.
type migrationStatus struct {
	Status string `json:"status"`
	Error  string `json:"error-desc"`
}

// pollMigration asks for the migration's status until it is one of ends
// (polled: this client reads replies and skips QEMU's events); when it
// fails or ctx ends it returns the last status seen.
func (q *QMP) pollMigration(ctx context.Context, ends ...string) (migrationStatus, error) {
	var last migrationStatus
	for {
		var st migrationStatus
		if err := q.Execute(ctx, "query-migrate", nil, &st); err != nil {
			return last, err
		}
		if slices.Contains(ends, st.Status) {
			return st, nil
		}
		last = st
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}
