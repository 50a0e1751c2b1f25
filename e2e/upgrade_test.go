package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
)

// levelTwoCommit is the last commit of this repository whose build is at
// feature level 2 (the one before workspace.pause, level 3): the "old"
// release of the rolling upgrade, built from the repository's own history.
const levelTwoCommit = "29d71eeae117ec5f974d5b487e36a9c290b8abf5"

// A rolling upgrade of the three ctrl voters, one at a time, from a build
// at feature level 2 (released as 0.3.0) to this one, under a stream of
// concurrent register writes and consistent reads: the history is
// linearizable (porcupine), no acknowledged write is lost, writes go on
// after every step, and an op of level 3 is refused naming the old voter
// until the last one runs the new build, then accepted.
func TestRollingCtrlUpgrade(t *testing.T) {
	l := clusterlab.New(t, 3)
	old := buildAtCommit(t, levelTwoCommit, "0.3.0", filepath.Join(l.Dir, "old"))
	if r := runLocal(t, filepath.Join(old, "kibotos"), "--json", "version"); !strings.Contains(r, `"feature_level": 2`) {
		t.Fatalf("the old build is not at feature level 2: %s", r)
	}
	for _, h := range l.Hosts {
		h.SetBin(old)
	}
	c := clusterlab.Form(t, l)
	reg := c.Ctrls[2].NodeID
	const initialV = api.Milli(1000)
	if r := c.Ctrls[0].Kibo("node", "overcommit", "set", reg, "--cpu", initialV.String()); r.Code != 0 {
		t.Fatal(r)
	}

	pool := &members{hosts: append([]*clusterlab.Host(nil), c.Ctrls...)}
	hist := &history{start: time.Now(), stats: map[string]int{}}
	stop := make(chan struct{})
	var next atomic.Int64
	var wg sync.WaitGroup
	const clients = 3
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
			for {
				select {
				case <-stop:
					return
				default:
				}
				h := pool.pick(rng)
				if rng.IntN(2) == 0 {
					v := initialV + api.Milli(next.Add(1))
					if v > api.MaxMultiplier {
						return
					}
					hist.write(id, h, reg, v)
				} else {
					hist.read(id, h, reg)
				}
			}
		}(i)
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	waitAcked := func(after int64, what string) {
		t.Helper()
		testenv.WaitFor(t, 30*time.Second, "10 writes acknowledged after "+what, func() (bool, string) {
			hist.mu.Lock()
			defer hist.mu.Unlock()
			return ackedAfter(hist.ops, after) >= 10, fmt.Sprintf("%v", hist.stats)
		})
	}
	waitAcked(0, "the clients started")

	// pause of a Workspace that does not exist: refused for its level
	// while a voter is old, else "not found" (the level check passed).
	pause := func(h *clusterlab.Host) clusterlab.Result { return h.Kibo("workspace", "pause", "ws-none") }
	upgrade := func(h *clusterlab.Host) {
		t.Helper()
		pool.remove(h)
		h.Stop()
		at := hist.now()
		h.SetBin(l.Bin)
		h.StartServe()
		c.WaitFollowsLeader(t, h)
		pool.add(h)
		waitAcked(at, h.NodeID+" ran the new build")
		t.Logf("%s upgraded at %s", h.NodeID, time.Duration(at))
	}

	// The followers first, then whoever leads. If the old voter left then
	// leads, it is stopped until a new build leads and only then started
	// again (old build still): restarted at once, it would win again, as
	// the followers still know it as their leader and grant it their vote.
	leader := c.Leader(t)
	var order []*clusterlab.Host
	for _, h := range c.Ctrls {
		if h != leader {
			order = append(order, h)
		}
	}
	upgrade(order[0])
	upgrade(leader)
	last := order[1]
	if c.Leader(t) == last {
		t.Logf("%s (old build) leads: stopped until a new build leads", last.NodeID)
		pool.remove(last)
		last.Stop()
		c.WaitLeaderOtherThan(t, last)
		last.StartServe()
		c.WaitFollowsLeader(t, last)
		pool.add(last)
	}
	newHost := c.Leader(t)
	if r := pause(newHost); r.Code != api.ExitFailedPrecondition || !strings.Contains(r.Stderr, fmt.Sprintf("workspace.pause needs every ctrl voter at feature level %d, and voter %s runs 0.3.0 at level 2", fsm.OpLevel("workspace.pause"), last.NodeID)) {
		t.Fatalf("pause with voter %s still old: %v", last.NodeID, r)
	}
	upgrade(last)
	// The leader learns the new level when it asks again (after a refusal
	// at the latest): the op is then accepted.
	testenv.WaitFor(t, 30*time.Second, "pause past the level check once every voter runs the new build", func() (bool, string) {
		r := pause(newHost)
		return r.Code == api.ExitNotFound, r.String()
	})

	close(stop)
	wg.Wait()
	var final api.Milli
	testenv.WaitFor(t, 15*time.Second, "a final consistent read", func() (bool, string) {
		v, ok := hist.read(clients, c.Ctrls[0], reg)
		final = v
		return ok, "read failed"
	})
	t.Logf("history: %d operations %v; final value %s; longest time without an acknowledged write: %s", len(hist.ops), hist.stats, final, longestWriteGap(hist.ops))
	ops, applied, dropped := resolveUnknownWrites(hist.ops)
	t.Logf("writes with unknown outcome: %d seen by a read (so applied), %d never seen (dropped)", applied, dropped)
	model := registerModel(initialV)
	res, info := porcupine.CheckOperationsVerbose(model, ops, 30*time.Second)
	if res != porcupine.Ok {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("%s-upgrade-linearizability.html", l.Prefix))
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			t.Logf("visualization: %v", err)
		}
		t.Fatalf("history is not linearizable (porcupine: %v); visualization in %s", res, path)
	}
	if lost := lostWrites(ops, initialV, final); len(lost) > 0 {
		t.Fatalf("final value %s loses acknowledged writes: %s", final, strings.Join(lost, ", "))
	}
}

// longestWriteGap is the longest time between two acknowledged writes'
// returns.
func longestWriteGap(ops []porcupine.Operation) time.Duration {
	var rets []int64
	for _, op := range ops {
		if in := op.Input.(regInput); in.write && !op.Output.(regOutput).unknown {
			rets = append(rets, op.Return)
		}
	}
	slices.Sort(rets)
	var gap int64
	for i := 1; i < len(rets); i++ {
		gap = max(gap, rets[i]-rets[i-1])
	}
	return time.Duration(gap)
}

// buildAtCommit builds kibotos (static, with release stamped) from the
// given commit of this repository into dir, with the kibo symlink. The
// source comes from git archive: the repository is not changed.
func buildAtCommit(t *testing.T, commit, release, dir string) string {
	t.Helper()
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("module root: %v", err)
	}
	repo := strings.TrimSpace(string(root))
	if err := exec.Command("git", "-C", repo, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		testenv.Skipf(t, "commit %s is not in this checkout's history (a full git clone has it)", commit)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", repo, commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v %s", commit, err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "kibotos"),
		"-ldflags", "-X github.com/kibotos/kibotos/buildinfo.Release="+release, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", commit, err, out)
	}
	if err := os.Symlink("kibotos", filepath.Join(dir, "kibo")); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(src)
	return dir
}

// runLocal runs a command outside the lab and returns its stdout.
func runLocal(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return string(out)
}
