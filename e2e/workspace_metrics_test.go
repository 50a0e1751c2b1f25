package e2e

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/trust"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// testMetrics scrapes the dev member as Prometheus would, on its loopback
// listener (port+3) and on the API port with the admin certificate, and
// checks the figures against what the CLI shows: one running Instance,
// the Workspace AVAILABLE, this member the Raft leader.
func (d *wsDev) testMetrics(id string) {
	t := d.t
	families := d.scrape()
	value := func(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
		t.Helper()
		return metricValue(t, fams, name, labels...)
	}
	if v := value(families, "kibotos_node_instances", "state", "running"); v != 1 {
		t.Errorf("kibotos_node_instances{state=running} = %v, want 1 (the Workspace's Instance)", v)
	}
	if v := value(families, "kibotos_node_instances", "state", "stopped"); v != 0 {
		t.Errorf("kibotos_node_instances{state=stopped} = %v", v)
	}
	if v := value(families, "kibotos_workspaces", "state", "available"); v < 1 {
		t.Errorf("kibotos_workspaces{state=available} = %v, want at least 1", v)
	}
	if v := value(families, "kibotos_nodes", "status", "ready"); v != 1 {
		t.Errorf("kibotos_nodes{status=ready} = %v, want 1", v)
	}
	// kibotos dev gave its pool its file system's size; the Workspace's
	// layer is charged its template's image size.
	if v := value(families, "kibotos_storage_pool_capacity_bytes", "pool", "dev:default"); v < 1<<30 {
		t.Errorf("kibotos_storage_pool_capacity_bytes{pool=dev:default} = %v", v)
	}
	if v := value(families, "kibotos_storage_pool_used_bytes", "pool", "dev:default"); v < 1<<20 {
		t.Errorf("kibotos_storage_pool_used_bytes{pool=dev:default} = %v, want the layer's template size", v)
	}
	if v := value(families, "kibotos_raft_leader"); v != 1 {
		t.Errorf("kibotos_raft_leader = %v on the one voter", v)
	}
	// The execs so far went through the data plane.
	if v := value(families, "kibotos_node_dataplane_connections_total"); v < 1 {
		t.Errorf("kibotos_node_dataplane_connections_total = %v after the execs", v)
	}
	if v := value(families, "kibotos_node_dataplane_bytes_total", "direction", "out"); v < 1 {
		t.Errorf("kibotos_node_dataplane_bytes_total{direction=out} = %v after the execs", v)
	}
	if v := value(families, "kibotos_control_sessions"); v != 1 {
		t.Errorf("kibotos_control_sessions = %v, want the dev node's one", v)
	}
	if v := value(families, "kibotos_node_host", "item", "memory_total_bytes"); v <= 0 {
		t.Errorf("kibotos_node_host{item=memory_total_bytes} = %v", v)
	}
	// The node's step histograms: one boot (the Workspace's start), one
	// takeover (the runtime's open).
	for _, step := range []string{"boot", "takeover"} {
		n := uint64(0)
		if f := families["kibotos_node_step_seconds"]; f != nil {
			for _, m := range f.Metric {
				for _, l := range m.Label {
					if l.GetName() == "step" && l.GetValue() == step {
						n = m.Histogram.GetSampleCount()
					}
				}
			}
		}
		if n < 1 {
			t.Errorf("kibotos_node_step_seconds{step=%s} has %d samples, want at least 1", step, n)
		}
	}
	// What raft measures itself: the leader's commit time, a summary.
	if f := families["kibotos_raft_commitTime"]; f == nil || len(f.Metric) == 0 || f.Metric[0].Summary.GetSampleCount() == 0 {
		t.Errorf("no raft commit time in the scrape: %v", f)
	}
	var w api.Workspace
	if err := clusterlab.DecodeResult(d.must("workspace", "get", id, "--json", "--wide"), &w); err != nil {
		t.Fatal(err)
	}
	// The denied packets of testNetwork, per Instance, never below what
	// ctrl was told.
	if v := value(families, "kibotos_node_guest_denied_packets_total", "instance_id", w.InstanceID); w.Denied != nil && v < float64(w.Denied.Packets) {
		t.Errorf("denied packets of %s: metrics %v, workspace get %d", w.InstanceID, v, w.Denied.Packets)
	}

	// The API port: an admin certificate only.
	dir := datadir.Dir(d.dir)
	tlsConf, err := dir.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	ident, err := dir.LoadIdentity()
	if err != nil {
		t.Fatal(err)
	}
	want := trust.Want{Kind: trust.KindMember, NodeID: ident.NodeID}
	c := &http.Client{Transport: tlsConf.HTTPTransport(want, 10*time.Second), Timeout: 30 * time.Second}
	resp, err := c.Get("https://" + d.addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape the API port: %v", err)
	}
	if v := value(parseMetrics(t, resp), "kibotos_node_instances", "state", "running"); v != 1 {
		t.Errorf("API port: kibotos_node_instances{state=running} = %v", v)
	}
	anonymous := trust.Client{Pool: tlsConf.Pool, Cert: func() *tls.Certificate { return &tls.Certificate{} }}
	plain := &http.Client{Transport: anonymous.HTTPTransport(want, 10*time.Second), Timeout: 30 * time.Second}
	if resp, err := plain.Get("https://" + d.addr + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("the API port served /metrics without a client certificate")
		}
	}
}

// scrape reads the dev member's metrics listener (port+3).
func (d *wsDev) scrape() map[string]*dto.MetricFamily {
	t := d.t
	t.Helper()
	_, port, _ := net.SplitHostPort(d.addr)
	p, _ := strconv.Atoi(port)
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(p+3) + "/metrics")
	if err != nil {
		t.Fatalf("scrape the metrics listener: %v", err)
	}
	return parseMetrics(t, resp)
}

// metricValue is the value of the gauge or counter name whose labels
// include the given name/value pairs.
func metricValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s in the scrape", name)
	}
metric:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
			}
			if !found {
				continue metric
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		}
	}
	t.Fatalf("no %s%v in the scrape", name, labels)
	return 0
}

// parseMetrics reads one scrape in the text exposition format.
func parseMetrics(t *testing.T, resp *http.Response) map[string]*dto.MetricFamily {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape: %s: %s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape is not in the exposition format: %v", err)
	}
	return fams
}
