package fsm

import (
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/trust"
)

func (h *harness) caRotation() *CARotation {
	h.t.Helper()
	var r *CARotation
	if err := h.f.View(func(tx *bolt.Tx) error {
		var err error
		r, err = GetCARotation(tx)
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
	return r
}

// beginArgs makes a new CA replacing old, as the leader does.
func beginArgs(t *testing.T, old *trust.CA) (CARotateBeginArgs, *trust.CA) {
	t.Helper()
	next, err := trust.NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	key, err := trust.EncodeKey(next.Key)
	if err != nil {
		t.Fatal(err)
	}
	return CARotateBeginArgs{OldCert: string(old.CertPEM), NewCert: string(next.CertPEM), NewKey: string(key)}, next
}

func TestCARotationPhases(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	first, err := trust.NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	a, next := beginArgs(t, first)
	fp := trust.Fingerprint(next.Cert)
	h.fail(api.CodeFailedPrecondition, OpCARotateSign, CARotateSignArgs{Fingerprint: fp})
	h.fail(api.CodeFailedPrecondition, OpCARotateFinish, CARotateFinishArgs{Fingerprint: fp})

	r := decode[CARotation](t, h.ok(OpCARotateBegin, a, withActor("admin@ctrl-1")))
	if r.NewKey != "" {
		t.Fatal("the begin's result carries the new CA key: results reach command records and answers")
	}
	got := h.caRotation()
	if got.Phase != CAPhaseTrusting || got.NewKey != a.NewKey || got.StartedBy != "admin@ctrl-1" || !got.StartedAt.Equal(h.now) {
		t.Fatalf("after begin: %+v", got)
	}
	again, _ := beginArgs(t, first)
	if e := h.fail(api.CodeFailedPrecondition, OpCARotateBegin, again); !strings.Contains(e.Message, "under way") {
		t.Fatalf("second begin: %v", e)
	}
	// Finishing before ctrl signs with the new CA would drop the CA of
	// every certificate there is.
	h.fail(api.CodeFailedPrecondition, OpCARotateFinish, CARotateFinishArgs{Fingerprint: fp, Force: true})
	// A sign meant for another CA changes nothing.
	h.fail(api.CodeFailedPrecondition, OpCARotateSign, CARotateSignArgs{Fingerprint: trust.Fingerprint(first.Cert)})
	h.fail(api.CodeInvalidArgument, OpCARotateSign, CARotateSignArgs{})

	h.advance(time.Minute)
	h.ok(OpCARotateSign, CARotateSignArgs{Fingerprint: fp})
	if got := h.caRotation(); got.Phase != CAPhaseSigning || !got.SigningAt.Equal(h.now) {
		t.Fatalf("after sign: %+v", got)
	}
	h.fail(api.CodeFailedPrecondition, OpCARotateSign, CARotateSignArgs{Fingerprint: fp})

	h.advance(time.Minute)
	h.ok(OpCARotateFinish, CARotateFinishArgs{Fingerprint: fp, Force: true})
	got = h.caRotation()
	if got.UnderWay() || got.OldCert != string(first.CertPEM) || got.NewCert != string(next.CertPEM) || !got.Forced || !got.FinishedAt.Equal(h.now) {
		t.Fatalf("after finish: %+v", got)
	}
	// The next rotation replaces the CA the last one made, and only it.
	h.fail(api.CodeFailedPrecondition, OpCARotateBegin, again)
	a2, _ := beginArgs(t, next)
	h.ok(OpCARotateBegin, a2)
}

func TestCARotateBeginChecksTheNewCA(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	first, _ := trust.NewCA("c1")
	a, _ := beginArgs(t, first)
	other, _ := beginArgs(t, first)
	for name, bad := range map[string]CARotateBeginArgs{
		"foreign key":   {OldCert: a.OldCert, NewCert: a.NewCert, NewKey: other.NewKey},
		"no new cert":   {OldCert: a.OldCert, NewKey: a.NewKey},
		"no old cert":   {NewCert: a.NewCert, NewKey: a.NewKey},
		"same as old":   {OldCert: a.OldCert, NewCert: a.OldCert, NewKey: a.NewKey},
		"key not a key": {OldCert: a.OldCert, NewCert: a.NewCert, NewKey: "x"},
	} {
		if e := h.fail(api.CodeInvalidArgument, OpCARotateBegin, bad); e == nil {
			t.Fatalf("%s: accepted", name)
		}
	}
}

func TestCARotationOpsNeedLevel13(t *testing.T) {
	for _, op := range []string{OpCARotateBegin, OpCARotateSign, OpCARotateFinish} {
		if OpLevel(op) != LevelCARotation || LevelCARotation > FeatureLevel {
			t.Fatalf("%s at level %d, build at %d", op, OpLevel(op), FeatureLevel)
		}
		err := CheckOpLevel(op, []MemberLevel{{NodeID: "ctrl-1", Level: FeatureLevel}, {NodeID: "ctrl-2", Level: 12, Release: "v0.9.0"}})
		if api.CodeOf(err) != api.CodeFailedPrecondition {
			t.Fatalf("%s with a voter at level 12: %v", op, err)
		}
	}
}

// propertyCAs are the CAs the random logs rotate between: made once,
// since a log is drawn once and then a fixed input for every replica.
var propertyCAs = sync.OnceValue(func() []CARotateBeginArgs {
	var out []CARotateBeginArgs
	for range 3 {
		ca, err := trust.NewCA("c1")
		if err != nil {
			panic(err)
		}
		key, _ := trust.EncodeKey(ca.Key)
		out = append(out, CARotateBeginArgs{NewCert: string(ca.CertPEM), NewKey: string(key)})
	}
	return out
})

// drawCARotation draws the next step of a rotation as the reference FSM
// stands (mostly right, now and then out of turn or for another CA).
func (g *logGen) drawCARotation() Entry {
	cas := propertyCAs()
	var cur *CARotation
	g.ref.View(func(tx *bolt.Tx) error {
		var err error
		cur, err = GetCARotation(tx)
		return err
	})
	pick := cas[g.cas.Intn(len(cas))]
	fp := fingerprintPEM(pick.NewCert)
	if cur != nil && g.cas.Intn(100) < 80 {
		fp = fingerprintPEM(cur.NewCert)
	}
	op, args := OpCARotateBegin, any(nil)
	switch {
	case cur.UnderWay() && cur.Phase == CAPhaseTrusting && g.cas.Intn(100) < 80:
		op, args = OpCARotateSign, CARotateSignArgs{Fingerprint: fp}
	case cur.UnderWay() && g.cas.Intn(100) < 80:
		op, args = OpCARotateFinish, CARotateFinishArgs{Fingerprint: fp, Force: g.cas.Intn(2) == 0}
	default:
		a := pick
		a.OldCert = cas[(g.cas.Intn(len(cas)))].NewCert
		if cur != nil && g.cas.Intn(100) < 80 {
			a.OldCert = cur.NewCert
		}
		args = a
	}
	e := makeEntry(g.now, op, args)
	e.Actor = "op"
	return e
}
