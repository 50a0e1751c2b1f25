package e2b

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
)

// A sandbox's metrics (GET /sandboxes/{id}/metrics, the SDKs'
// getMetrics): E2B keeps a series sampled every few seconds; a Kibotos
// sandbox is sampled when asked, so the answer is that one sample of its
// guest, as its own kernel counts: CPU busy over a fifth of a second,
// memory in use (total less available), and its root filesystem. A
// paused sandbox has no sample (and is not resumed for one).

// metricsScript prints, as the guest sees itself: the CPUs online, two
// readings of the aggregate CPU line of /proc/stat a fifth of a second
// apart (busy and total jiffies), MemTotal and MemAvailable (KiB), and the
// root filesystem's block size, blocks and free blocks.
const metricsScript = `cpu() { read -r _ u n s i w q sq st _ < /proc/stat; echo $((u+n+s+q+sq+st)) $((u+n+s+i+w+q+sq+st)); }; ` +
	`nproc; cpu; sleep 0.2; cpu; ` +
	`awk '/^MemTotal:/ {t=$2} /^MemAvailable:/ {a=$2} END {print t, a}' /proc/meminfo; ` +
	`stat -f -c '%S %b %f' /`

// sandboxMetric is one sample, as E2B's API answers it.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metrics is GET /sandboxes/{id}/metrics.
func (h *handler) metrics(c *call) error {
	id := c.r.PathValue("id")
	ws, state, err := sandboxWorkspace(c, id)
	if err != nil {
		return err
	}
	if state != stateRunning || ws.State != api.WorkspaceAvailable || h.c.Sandboxes == nil {
		return c.reply(http.StatusOK, []sandboxMetric{})
	}
	token, err := h.c.Sandboxes.AccessToken(c.key, id)
	if err != nil {
		return err
	}
	gc, release, err := h.c.Sandboxes.Open(c.r.Context(), token, id, c.r.RemoteAddr)
	if err != nil {
		return err
	}
	defer release()
	var out bytes.Buffer
	now := time.Now()
	code, stderr, err := runScript(c.r.Context(), gc, scriptExec(c.r, metricsScript, nil, false), nil, &limitedBuffer{b: &out, max: 4 << 10})
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, stderr)
	}
	if err != nil {
		return api.Errorf(api.CodeUnavailable, "sandbox %s: sample its metrics: %v", id, err)
	}
	m, err := parseMetrics(out.String())
	if err != nil {
		return api.Errorf(api.CodeUnavailable, "sandbox %s: its metrics: %v", id, err)
	}
	m.Timestamp, m.TimestampUnix = now.UTC(), now.Unix()
	return c.reply(http.StatusOK, []sandboxMetric{m})
}

// parseMetrics reads metricsScript's output.
func parseMetrics(s string) (sandboxMetric, error) {
	var n []int64
	for _, f := range strings.Fields(s) {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil || v < 0 {
			return sandboxMetric{}, fmt.Errorf("%q is not the guest's counts", s)
		}
		n = append(n, v)
	}
	if len(n) != 10 {
		return sandboxMetric{}, fmt.Errorf("%d numbers from the guest, want 10", len(n))
	}
	m := sandboxMetric{CPUCount: int(n[0]), MemTotal: n[5] << 10, MemUsed: max(n[5]-n[6], 0) << 10, DiskTotal: n[7] * n[8], DiskUsed: n[7] * max(n[8]-n[9], 0)}
	if busy, total := n[3]-n[1], n[4]-n[2]; total > 0 && busy >= 0 {
		m.CPUUsedPct = float64(busy*10000/total) / 100
	}
	return m, nil
}
