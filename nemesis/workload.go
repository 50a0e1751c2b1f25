package nemesis

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/ctxsleep"
)

// opTimeout bounds one CLI call of the workload: a lifecycle change waits
// for its result up to lifecycleWait, then the CLI gives up (exit 16).
const (
	opTimeout     = 90 * time.Second
	lifecycleWait = "60s"
	// retries of an operation whose outcome is unknown, with the same
	// command ID: each is a replay or the first time it happens.
	retries = 2
)

// seqFile is where appends go, in the Workspace's own disk.
const seqFile = "/nemesis.seq"

// volFile is where Volume appends go, in the Volume mounted at volMount.
const (
	volMount = "/data"
	volFile  = volMount + "/nemesis.seq"
)

// workspaceEntry is one Workspace of the workload.
type workspaceEntry struct {
	id      string
	initial bool // made before the run: never deleted by it
	deleted bool
	volume  *volumeEntry // attached at its create, detached by its delete
}

// volumeEntry is one Volume of the workload.
type volumeEntry struct {
	name, id string
	sizeMiB  int
	attached *workspaceEntry
	claimed  bool // by a create attaching it or by its delete, until that ends
	deleted  bool
}

// free says whether v is live and neither attached nor claimed.
func (v *volumeEntry) free() bool { return !v.deleted && v.attached == nil && !v.claimed }

// Workload runs the clients: each picks, from its own seeded source, an
// operation and a Workspace, runs it through the CLI of a host of the lab
// and records it in the history.
type Workload struct {
	cluster *clusterlab.Cluster
	hist    *History
	spec    string // --template, --cpu, --memory, --egress of a create
	proxy   clusterlab.Proxy

	mu         sync.Mutex
	workspaces []*workspaceEntry
	volumes    []*volumeEntry
	volumeN    int
	// lastSeq numbers the appends of the run: one number, one append,
	// also across a fork, whose disk starts with its source's numbers.
	lastSeq int
}

// nextSeq is the number of the next append.
func (w *Workload) nextSeq() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lastSeq++
	return w.lastSeq
}

// kinds and their weights: reads and appends are most of the load, every
// lifecycle change is there, and a few creates and deletes churn the set.
var kinds = []struct {
	name   string
	weight int
}{
	{"read", 28}, {"append", 28}, {"fetch", 4}, {"recover", 4}, {"stop", 7}, {"start", 7}, {"pause", 7}, {"resume", 7}, {"move", 4}, {"fork", 3},
	{"create", 2}, {"delete", 3}, {"drain", 1},
	{"volume-create", 2}, {"volume-append", 6}, {"volume-resize", 1}, {"volume-delete", 1},
}

func pickKind(rng *rand.Rand) string {
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	n := rng.IntN(total)
	for _, k := range kinds {
		if n < k.weight {
			return k.name
		}
		n -= k.weight
	}
	panic("unreachable")
}

// run is one client until ctx ends.
func (w *Workload) run(ctx context.Context, client int, rng *rand.Rand) {
	for ctx.Err() == nil {
		kind := pickKind(rng)
		h := w.cluster.Hosts[rng.IntN(len(w.cluster.Hosts))]
		switch kind {
		case "create":
			w.create(ctx, client, h, nil)
			continue
		case "drain":
			w.drain(ctx, client, h, w.cluster.Hosts[rng.IntN(len(w.cluster.Hosts))].NodeID, rng)
			continue
		case "volume-create", "volume-append", "volume-resize", "volume-delete":
			w.volumeOp(ctx, client, h, kind, rng)
			continue
		}
		ws := w.pick(rng)
		switch {
		case ws == nil:
		case kind == "read":
			w.read(client, h, ws.id)
		case kind == "append":
			w.appendSeq(client, h, ws)
		case kind == "fetch":
			w.fetch(client, h, ws.id)
		case kind == "recover":
			w.recover(ctx, client, h, ws)
		case kind == "delete" && ws.initial:
			// The first Workspaces stay for the append check; only
			// what the workload created itself is deleted.
		case kind == "fork":
			// Refused unless the source is PAUSED.
			w.create(ctx, client, h, ws)
		case kind == "move":
			w.move(ctx, client, h, ws, w.cluster.Hosts[rng.IntN(len(w.cluster.Hosts))].NodeID)
		default:
			w.lifecycle(ctx, client, h, ws, kind, rng)
		}
	}
}

func (w *Workload) live() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.workspaces {
		if !e.deleted {
			n++
		}
	}
	return n
}

func (w *Workload) pick(rng *rand.Rand) *workspaceEntry {
	w.mu.Lock()
	defer w.mu.Unlock()
	var live []*workspaceEntry
	for _, e := range w.workspaces {
		if !e.deleted {
			live = append(live, e)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return live[rng.IntN(len(live))]
}

// op starts an Op record for client on h.
func (w *Workload) op(client int, h *clusterlab.Host, kind, ws string) Op {
	return Op{Client: client, Kind: kind, Workspace: ws, Host: h.NodeID, Call: w.hist.now()}
}

// finish fills in the outcome of r and records the op.
func (w *Workload) finish(o Op, r clusterlab.Result) Op {
	o.Return = w.hist.now()
	o.Code = r.Code
	o.Outcome = outcomeOf(r.Code)
	if o.Outcome != OK {
		o.Detail = firstLine(r.Stderr)
	}
	w.hist.add(o)
	return o
}

// outcomeOf sorts an exit code (api's table): a refusal changed nothing;
// a timeout, an unreachable member or a killed CLI may have.
func outcomeOf(code int) Outcome {
	switch code {
	case api.ExitOK:
		return OK
	case api.ExitInvalidArgument, api.ExitNotFound, api.ExitFailedPrecondition, api.ExitVersionMismatch,
		api.ExitResourceExhausted, api.ExitAlreadyExists, api.ExitPermissionDenied, api.ExitUsage:
		return Fail
	}
	return Unknown
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// read is a consistent read of the Workspace's version and state.
func (w *Workload) read(client int, h *clusterlab.Host, ws string) (api.Workspace, bool) {
	o := w.op(client, h, "read", ws)
	r := h.KiboTimeout(opTimeout, "workspace", "get", ws, "--consistent", "--json")
	var got api.Workspace
	if r.Code == 0 {
		if err := clusterlab.DecodeResult(r, &got); err != nil {
			r.Code, r.Stderr = -1, err.Error()
		}
	}
	o.Version, o.State = got.Version, got.State
	o = w.finish(o, r)
	return got, o.Outcome == OK
}

// appendSeq appends the Workspace's next number to seqFile and syncs
// that file: acknowledged, it must be there after any fault. (sync
// without a file reports no write error: a guest whose disk failed would
// acknowledge data it lost.)
func (w *Workload) appendSeq(client int, h *clusterlab.Host, ws *workspaceEntry) {
	seq := w.nextSeq()
	o := w.op(client, h, "append", ws.id)
	o.Seq = seq
	r := h.KiboTimeout(opTimeout, "workspace", "exec", ws.id, "--", "sh", "-c", fmt.Sprintf("echo %d >> %s && sync %s", seq, seqFile, seqFile))
	w.finish(o, r)
}

// fetch has the Workspace get the lab's web page through its Egress (the
// node's egress process and the lab's SOCKS5 server). Its outcome is only
// recorded: a fault may cut it; after the faults it must work (readBack).
func (w *Workload) fetch(client int, h *clusterlab.Host, ws string) Op {
	o := w.op(client, h, "fetch", ws)
	r := h.KiboTimeout(opTimeout, "workspace", "exec", ws, "--", "wget", "-T", "5", "-t", "1", "-q", "-O-", w.proxy.URL)
	if r.Code == 0 && r.Stdout != w.proxy.Page {
		r.Code, r.Stderr = -1, fmt.Sprintf("wget through the Egress printed %q, not the page", clusterlab.TrimTo(r.Stdout, 100))
	}
	return w.finish(o, r)
}

// fillProbe has a Workspace write 4 MiB of new data into its layer and
// sync, through h, in the background: the nemesis's probe of a full pool.
// The channel gives its Op once it returned (within opTimeout); nil when
// no Workspace was found running.
func (w *Workload) fillProbe(rng *rand.Rand, h *clusterlab.Host) <-chan Op {
	// One that runs, as far as a read just now says.
	var ws *workspaceEntry
	for range 5 {
		if e := w.pick(rng); e != nil {
			var got api.Workspace
			if h.KiboJSON(&got, "workspace", "get", e.id, "--consistent") == nil && got.State == api.WorkspaceAvailable {
				ws = e
				break
			}
		}
	}
	if ws == nil {
		return nil
	}
	done := make(chan Op, 1)
	o := w.op(-1, h, "fill-probe", ws.id)
	go func() {
		r := h.KiboTimeout(opTimeout, "workspace", "exec", ws.id, "--", "sh", "-c", "head -c 4194304 /dev/urandom > /nemesis.fill && sync && rm /nemesis.fill")
		done <- w.finish(o, r)
	}()
	return done
}

// lifecycle is stop, start, pause, resume or delete, half of them with the
// version a read just gave as the expected one. An unknown outcome is
// tried again with the same command ID while the run lasts.
func (w *Workload) lifecycle(ctx context.Context, client int, h *clusterlab.Host, ws *workspaceEntry, kind string, rng *rand.Rand) {
	args := []string{"workspace", kind, ws.id, "--timeout", lifecycleWait, "--command-id", commandID()}
	var expected uint64
	if rng.IntN(2) == 0 {
		got, ok := w.read(client, h, ws.id)
		if !ok {
			return
		}
		expected = got.Version
		args = append(args, "--expected-version", strconv.FormatUint(expected, 10))
	}
	o := w.op(client, h, kind, ws.id)
	o.Expected = expected
	o = w.finish(o, w.retried(ctx, h, args))
	if kind == "delete" && o.Outcome == OK {
		w.mu.Lock()
		ws.deleted = true
		if ws.volume != nil {
			ws.volume.attached = nil // detached, kept
		}
		w.mu.Unlock()
	}
}

// recover is what an operator does with a FAILED Workspace (a killed VMM,
// a failed stop): stop --force, which releases what its Instance held,
// then start. A Workspace a read finds in another state is left alone.
func (w *Workload) recover(ctx context.Context, client int, h *clusterlab.Host, ws *workspaceEntry) {
	got, ok := w.read(client, h, ws.id)
	if !ok || got.State != api.WorkspaceFailed {
		return
	}
	o := w.op(client, h, "stop-force", ws.id)
	o.Expected = got.Version
	args := []string{"workspace", "stop", ws.id, "--force", "--timeout", lifecycleWait, "--command-id", commandID(), "--expected-version", strconv.FormatUint(got.Version, 10)}
	if o = w.finish(o, w.retried(ctx, h, args)); o.Outcome != OK {
		return
	}
	o = w.op(client, h, "start", ws.id)
	w.finish(o, w.retried(ctx, h, []string{"workspace", "start", ws.id, "--timeout", lifecycleWait, "--command-id", commandID()}))
}

// maxLive bounds the Workspaces of the run: all of them fit on the hosts
// at once (3 hosts of 2 CPUs, 1 CPU each), so a refusal for capacity
// says something.
const maxLive = 5

// create makes one more Workspace, or a fork of from; it joins the set
// once it is known.
func (w *Workload) create(ctx context.Context, client int, h *clusterlab.Host, from *workspaceEntry) {
	if w.live() >= maxLive {
		return
	}
	o := w.op(client, h, "create", "")
	args := []string{"workspace", "create", "--wait-timeout", lifecycleWait, "--command-id", commandID(), "--json"}
	var vol *volumeEntry
	if from != nil {
		o.Kind, o.From = "fork", from.id
		args = append(args, "--from", from.id)
	} else {
		args = append(args, strings.Fields(w.spec)...)
		// A free Volume, when there is one, goes with it.
		if vol = w.claimVolume(); vol != nil {
			o.Volume = vol.id
			args = append(args, "--volume", vol.name+":"+volMount)
		}
	}
	r := w.retried(ctx, h, args)
	var ws api.Workspace
	if r.Code == 0 {
		if err := clusterlab.DecodeResult(r, &ws); err == nil {
			o.Workspace = ws.WorkspaceID
		}
	}
	o = w.finish(o, r)
	if o.Outcome == OK && o.Workspace != "" {
		e := w.add(o.Workspace, false)
		w.mu.Lock()
		if vol != nil {
			e.volume, vol.attached, vol.claimed = vol, e, false
		}
		w.mu.Unlock()
	} else if vol != nil {
		// Not made, or not known to be: the Volume stays as it was
		// (a create of unknown outcome may hold it; the Workspace
		// list after the run tells).
		w.releaseVolume(vol)
	}
}

// retried runs the CLI with args through h, again (same command ID) while
// the outcome is unknown, up to retries times while the run lasts.
func (w *Workload) retried(ctx context.Context, h *clusterlab.Host, args []string) clusterlab.Result {
	for try := 0; ; try++ {
		r := h.KiboTimeout(opTimeout, args...)
		if outcomeOf(r.Code) != Unknown || try == retries || ctx.Err() != nil {
			return r
		}
	}
}

// move stops the Workspace and starts it on node.
func (w *Workload) move(ctx context.Context, client int, h *clusterlab.Host, ws *workspaceEntry, node string) {
	o := w.op(client, h, "move", ws.id)
	o.Detail = "to " + node
	w.finish(o, w.retried(ctx, h, []string{"workspace", "move", ws.id, "--node", node, "--timeout", lifecycleWait, "--command-id", commandID()}))
}

// drain drains node for a few seconds, then cancels the drain: placement
// avoids it meanwhile, and every drain is cancelled (healNodes, after the
// run, cancels what a cut host left behind).
func (w *Workload) drain(ctx context.Context, client int, h *clusterlab.Host, node string, rng *rand.Rand) {
	o := w.op(client, h, "drain", "")
	o.Detail = node
	w.finish(o, w.retried(ctx, h, []string{"node", "drain", node, "--command-id", commandID()}))
	ctxsleep.Sleep(ctx, time.Duration(2+rng.IntN(4))*time.Second)
	o = w.op(client, h, "cancel-drain", "")
	o.Detail = node
	w.finish(o, w.retried(context.Background(), h, []string{"node", "cancel-drain", node, "--command-id", commandID()}))
}

func (w *Workload) add(id string, initial bool) *workspaceEntry {
	e := &workspaceEntry{id: id, initial: initial}
	w.mu.Lock()
	w.workspaces = append(w.workspaces, e)
	w.mu.Unlock()
	return e
}

// commandID is a fresh idempotency key.
func commandID() string {
	b := make([]byte, 8)
	crand.Read(b)
	return "nemesis-" + hex.EncodeToString(b)
}
