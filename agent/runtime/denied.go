package runtime

import (
	"time"

	"github.com/kibotos/kibotos/netpol"
)

// DefaultDeniedInterval is how often the node reads every running
// Instance's denied counter; it is also the rate limit of the log line: at
// most one per Instance per interval, however many packets were dropped.
const DefaultDeniedInterval = 10 * time.Second

// deniedCount is what the node knows of an Instance's dropped packets.
type deniedCount struct {
	// seen is the counter at the last read; a table replace starts the
	// counter again from zero (what it dropped since that read and the
	// replace is not counted).
	seen  uint64
	total uint64
}

// watchDenied reads the denied counters and logs increases.
func (rt *Runtime) watchDenied() { rt.everyInstance(rt.cfg.DeniedInterval, rt.readDenied) }

func (rt *Runtime) readDenied(in *instance) {
	in.mu.Lock()
	state, rec := in.state, in.rec
	in.mu.Unlock()
	if state != StateRunning || rec.Network == nil {
		return
	}
	ns, err := rt.net.ns.Open(rec.Network.Namespace)
	if err != nil {
		return
	}
	packets, _, err := netpol.DeniedCount(int(ns))
	ns.Close()
	if err != nil {
		return
	}
	in.mu.Lock()
	d := &in.denied
	delta := packets - d.seen
	if packets < d.seen {
		delta = packets // the table was replaced since
	}
	d.seen = packets
	d.total += delta
	total := d.total
	in.mu.Unlock()
	if delta > 0 {
		rt.log.Info("guest connections denied", "instance_id", in.id, "packets", delta, "total", total, "egress", rec.Network.Policy.Egress)
	}
}
