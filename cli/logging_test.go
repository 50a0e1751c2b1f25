package cli

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// Both log formats carry the seeds' log lines unchanged: the message and
// the key names. text is slog's text handler (what a member always
// logged); json is one object per line that decodes on its own, as
// journald and Vector take it.
func TestLogFormats(t *testing.T) {
	logLines := func(format string) []string {
		var buf bytes.Buffer
		log := newLogger(&buf, "info", format)
		log.Error("instance machine exited", "instance_id", "inst-a", "unit", "kibotos-vmm-inst-a.service", "exit", "status=1",
			"machine_logs", "/var/lib/kibotos/storage/machine-logs/inst-a")
		log.Warn("data-plane generation did not take the node's state before the reply", "generation", 2)
		log.Debug("not at info")
		return strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	}

	text := logLines(logText)
	want := []*regexp.Regexp{
		regexp.MustCompile(`^time=\S+ level=ERROR msg="instance machine exited" instance_id=inst-a unit=kibotos-vmm-inst-a.service exit="status=1" machine_logs=/var/lib/kibotos/storage/machine-logs/inst-a$`),
		regexp.MustCompile(`^time=\S+ level=WARN msg="data-plane generation did not take the node's state before the reply" generation=2$`),
	}
	if len(text) != len(want) {
		t.Fatalf("text: %d lines, want %d (debug filtered out):\n%s", len(text), len(want), strings.Join(text, "\n"))
	}
	for i, re := range want {
		if !re.MatchString(text[i]) {
			t.Errorf("text line %d:\n%s\ndoes not match\n%s", i, text[i], re)
		}
	}
	if got := logLines(""); strings.Join(got, "\n") == "" || !want[0].MatchString(got[0]) {
		t.Errorf("no format given: want text, got %q", got)
	}

	js := logLines(logJSON)
	if len(js) != 2 {
		t.Fatalf("json: %d lines, want 2:\n%s", len(js), strings.Join(js, "\n"))
	}
	wantJSON := []map[string]any{
		{"level": "ERROR", "msg": "instance machine exited", "instance_id": "inst-a", "unit": "kibotos-vmm-inst-a.service", "exit": "status=1",
			"machine_logs": "/var/lib/kibotos/storage/machine-logs/inst-a"},
		{"level": "WARN", "msg": "data-plane generation did not take the node's state before the reply", "generation": float64(2)},
	}
	for i, line := range js {
		var got map[string]any
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Errorf("json line %d does not decode: %v\n%s", i, err, line)
			continue
		}
		if _, ok := got["time"].(string); !ok {
			t.Errorf("json line %d has no time: %s", i, line)
		}
		delete(got, "time")
		if len(got) != len(wantJSON[i]) {
			t.Errorf("json line %d: keys %v, want %v", i, got, wantJSON[i])
		}
		for k, v := range wantJSON[i] {
			if got[k] != v {
				t.Errorf("json line %d: %s = %v, want %v", i, k, got[k], v)
			}
		}
	}
}
