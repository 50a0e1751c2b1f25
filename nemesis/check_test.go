package nemesis

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/storagepool"
)

func read(client int, call, ret int64, v uint64) Op {
	return Op{Client: client, Kind: "read", Workspace: "ws-a", Call: call, Return: ret, Outcome: OK, Version: v}
}

func write(client int, call, ret int64, expected uint64, oc Outcome) Op {
	return Op{Client: client, Kind: "stop", Workspace: "ws-a", Call: call, Return: ret, Outcome: oc, Expected: expected}
}

func TestVersionsLinearizable(t *testing.T) {
	for _, c := range []struct {
		name  string
		ops   []Op
		legal bool
	}{
		{"reads that only grow", []Op{read(0, 0, 10, 3), read(1, 20, 30, 5), read(0, 40, 50, 5)}, true},
		{"concurrent reads in either order", []Op{read(0, 0, 100, 7), read(1, 10, 20, 5)}, true},
		{"a stale read after a newer one returned", []Op{read(0, 0, 10, 7), read(1, 20, 30, 5)}, false},
		{"a write at the version a read saw", []Op{read(0, 0, 10, 4), write(0, 20, 30, 4, OK), read(1, 40, 50, 6)}, true},
		{"a write that changed nothing (start of a running Workspace)", []Op{write(0, 0, 10, 4, OK), read(1, 20, 30, 4)}, true},
		{"a read older than an acknowledged write's version", []Op{write(0, 0, 10, 4, OK), read(1, 20, 30, 3)}, false},
		{"a write accepted on a version already passed", []Op{read(0, 0, 10, 9), write(1, 20, 30, 4, OK)}, false},
		{"refused and unknown writes bound nothing", []Op{read(0, 0, 10, 9), write(1, 20, 30, 4, Fail), write(1, 40, 50, 2, Unknown), read(0, 60, 70, 9)}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := checkVersions(c.ops)
			if legal := len(got) == 0; legal != c.legal {
				t.Errorf("legal = %v, want %v: %v", legal, c.legal, got)
			}
		})
	}
}

func TestAppends(t *testing.T) {
	ops := []Op{
		{Kind: "append", Workspace: "ws-a", Seq: 1, Outcome: OK},
		{Kind: "append", Workspace: "ws-a", Seq: 2, Outcome: Unknown},
		{Kind: "append", Workspace: "ws-a", Seq: 3, Outcome: OK},
		{Kind: "append", Workspace: "ws-a", Seq: 4, Outcome: Fail},
		{Kind: "append", Workspace: "ws-b", Seq: 5, Outcome: OK},
		{Kind: "volume-append", Workspace: "ws-a", Volume: "vol-1", Seq: 6, Outcome: OK},
	}
	kinds := func(as []Anomaly) []string {
		var out []string
		for _, a := range as {
			out = append(out, a.Kind+" "+a.Detail[strings.LastIndex(a.Detail, ": ")+2:])
		}
		return out
	}
	for _, c := range []struct {
		content string
		want    []string
	}{
		{"1\n3\n", nil},
		{"1\n2\n3\n", nil},
		{"3\n1\n", nil},
		{"1\n", []string{"lost-append 3"}},
		{"1\n3\n3\n", []string{"duplicate-append 3"}},
		{"1\n3\n4\n", nil}, // a failed exec may have run
		{"1\n3\n5\n", []string{"phantom-append 5"}},
		{"1\n3\nx\n", []string{"corrupt-append \"x\""}},
		// A failed append's bytes zeroed: before the next, or at the end.
		{"1\n\x00\x00\x003\n\x00\x00", nil},
		{"1\n3\x00\x00\n", []string{"lost-append 3", "corrupt-append \"3\\x00\\x00\""}},
		{"", []string{"lost-append 1 3"}},
		// A Volume append through ws-a is not in ws-a's own file.
		{"1\n3\n6\n", []string{"phantom-append 6"}},
	} {
		if got := kinds(checkAppends("ws-a", "append", "", ops, c.content)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("content %q: got %q, want %q", c.content, got, c.want)
		}
	}
}

func TestSharedDisks(t *testing.T) {
	qemu := func(ws, vol string) []string {
		return []string{"/usr/bin/qemu-system-x86_64", "-drive", "file=/pool/layers/" + ws + ".qcow2,if=none,id=d1", "-drive", "file=/base/rootfs.img,if=none",
			"-drive", "file=/pool/volumes/data/" + vol + ".img,if=none,id=v-" + vol + ",format=raw"}
	}
	procs := map[int][]string{10: qemu("ws-a", "vol-1"), 11: qemu("ws-b", "vol-2"), 12: qemu("ws-a", "vol-3"), 13: qemu("ws-c", "vol-2")}
	if got, want := sharedDisks(procs), map[string][]int{"ws-a": {10, 12}, "vol-2": {11, 13}}; !reflect.DeepEqual(got, want) {
		t.Errorf("sharedDisks = %v, want %v", got, want)
	}
	delete(procs, 12)
	delete(procs, 13)
	if got := sharedDisks(procs); len(got) != 0 {
		t.Errorf("one QEMU per layer: sharedDisks = %v, want none", got)
	}
}

func TestOutcomeOf(t *testing.T) {
	for code, want := range map[int]Outcome{0: OK, 13: Fail, 14: Fail, 12: Fail, 16: Unknown, 17: Unknown, 1: Unknown, -1: Unknown} {
		if got := outcomeOf(code); got != want {
			t.Errorf("exit %d: %s, want %s", code, got, want)
		}
	}
}

func TestNotFound(t *testing.T) {
	gone := Op{Kind: "resume", Workspace: "ws-a", Call: 10, Return: 20, Outcome: Fail, Code: 12}
	found := read(0, 30, 40, 5)
	if got := checkNotFound([]Op{gone, found}); len(got) != 1 || got[0].Kind != "false-not-found" {
		t.Errorf("not found, then found: %v", got)
	}
	if got := checkNotFound([]Op{gone, read(0, 15, 40, 5)}); len(got) != 0 {
		t.Errorf("a read concurrent with the refusal proves nothing: %v", got)
	}
	del := Op{Kind: "delete", Workspace: "ws-a", Call: 0, Return: 5, Outcome: Unknown}
	if got := checkNotFound([]Op{del, gone, found}); len(got) != 0 {
		t.Errorf("after a delete that may have happened: %v", got)
	}
}

// A writer whose object's holder record names another node is reported
// once it goes on past fenceBound, not before; one the record names is
// never reported.
func TestWriterNotHolder(t *testing.T) {
	dir := t.TempDir()
	pool := filepath.Join(dir, "shared")
	layer := filepath.Join(pool, "layers", "ws-a.qcow2")
	if err := os.MkdirAll(filepath.Dir(layer), 0o700); err != nil {
		t.Fatal(err)
	}
	hold := func(node string) {
		if err := storagepool.WriteHolder(layer, storagepool.Holder{NodeID: node, Incarnation: 1, Grant: "inst-1"}); err != nil {
			t.Fatal(err)
		}
	}
	hostA := filepath.Join(dir, "h1")
	procs := map[int][]string{10: {"qemu-system-x86_64", "-chardev", "socket,path=" + hostA + "/storage/qmp.sock", "-drive", "file=" + layer + ",if=none,id=layer"}}
	s := &diskSampler{hosts: map[string]string{hostA: "node-a"}}
	sec := int64(time.Second)

	hold("node-a")
	s.checkHolders(procs, 0)
	s.checkHolders(procs, 30*sec)
	if len(s.overdue) != 0 {
		t.Fatalf("the holder's own writer reported: %v", s.overdue)
	}
	hold("node-b")
	s.checkHolders(procs, 31*sec)
	s.checkHolders(procs, 50*sec)
	if len(s.overdue) != 0 {
		t.Fatalf("reported within fenceBound: %v", s.overdue)
	}
	s.checkHolders(procs, 52*sec)
	s.checkHolders(procs, 60*sec)
	if len(s.overdue) != 1 || s.overdue[0].Kind != "writer-not-holder" || s.overdue[0].Workspace != "ws-a" {
		t.Fatalf("overdue = %v, want one writer-not-holder of ws-a", s.overdue)
	}
	// Fenced (gone), then a new writer of the holder's: nothing more.
	s.checkHolders(map[int][]string{}, 61*sec)
	hold("node-a")
	s.checkHolders(procs, 62*sec)
	s.checkHolders(procs, 90*sec)
	if len(s.overdue) != 1 {
		t.Fatalf("overdue = %v, want the one reported before", s.overdue)
	}
}

// A fork's file starts as its source's was: the source's appends
// acknowledged before the fork must be there, those begun before it
// returned may, later ones may not; the source's file has none of the
// fork's.
func TestAppendsOfAFork(t *testing.T) {
	sec := int64(time.Second)
	ops := []Op{
		{Kind: "append", Workspace: "ws-src", Seq: 1, Outcome: OK, Call: 1 * sec, Return: 2 * sec},
		{Kind: "append", Workspace: "ws-src", Seq: 2, Outcome: Unknown, Call: 3 * sec, Return: 20 * sec},
		{Kind: "fork", Workspace: "ws-fork", From: "ws-src", Outcome: OK, Call: 4 * sec, Return: 10 * sec},
		{Kind: "append", Workspace: "ws-src", Seq: 3, Outcome: OK, Call: 5 * sec, Return: 6 * sec}, // during the fork
		{Kind: "append", Workspace: "ws-src", Seq: 4, Outcome: OK, Call: 11 * sec, Return: 12 * sec},
		{Kind: "append", Workspace: "ws-fork", Seq: 5, Outcome: OK, Call: 11 * sec, Return: 12 * sec},
	}
	got := func(id, content string) []string {
		var out []string
		from := ""
		if id == "ws-unknown" {
			from = "ws-src"
		}
		for _, a := range checkAppends(id, "append", from, ops, content) {
			out = append(out, a.Kind+" "+a.Detail[strings.LastIndex(a.Detail, ": ")+2:])
		}
		return out
	}
	for _, c := range []struct {
		id, content string
		want        []string
	}{
		{"ws-fork", "1\n5\n", nil},
		{"ws-fork", "1\n2\n3\n5\n", nil},
		{"ws-fork", "5\n", []string{"lost-append 1"}},
		{"ws-fork", "1\n4\n5\n", []string{"phantom-append 4"}},
		{"ws-src", "1\n3\n4\n", nil},
		{"ws-src", "1\n3\n4\n5\n", []string{"phantom-append 5"}},
		// A fork whose create had no answer: ctrl names its source,
		// any of whose numbers may be there, none must.
		{"ws-unknown", "1\n4\n", nil},
		{"ws-unknown", "", nil},
		{"ws-unknown", "5\n", []string{"phantom-append 5"}},
	} {
		if g := got(c.id, c.content); !reflect.DeepEqual(g, c.want) {
			t.Errorf("%s %q: got %q, want %q", c.id, c.content, g, c.want)
		}
	}
}
