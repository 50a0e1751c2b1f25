package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The Grafana dashboard in packaging/ asks only for metrics a member
// exposes: a renamed metric must not leave a panel empty.
func TestDashboardNamesExist(t *testing.T) {
	b, err := os.ReadFile("../packaging/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	known := map[string]bool{
		// What hashicorp/raft reports through go-metrics (raftTelemetry).
		"kibotos_raft_commitTime": true,
	}
	descs := make(chan *prometheus.Desc, 100)
	for _, c := range []prometheus.Collector{nodeCollector{}, ctrlCollector{}, raftCollector{}, hostCollector{}, egressCollector{}, dataPlaneCollector{}, NewSteps().h,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kibotos_control_sessions"}, func() float64 { return 0 })} {
		c.Describe(descs)
	}
	close(descs)
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range descs {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			known[m[1]] = true
		}
	}
	used := regexp.MustCompile(`kibotos_[a-zA-Z_]+`)
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			for _, name := range used.FindAllString(q.Expr, -1) {
				base := strings.TrimSuffix(name, "_bucket")
				if !known[name] && !known[base] {
					t.Errorf("panel %q asks for %s, which no member exposes", p.Title, name)
				}
			}
		}
	}
}
