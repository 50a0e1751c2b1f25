package cli

import (
	"io"
	"log/slog"
)

// Log formats of every long-running kibotos process (member, data plane,
// egress): text for people, json for journald/Vector pipelines.
const (
	logText = "text"
	logJSON = "json"
)

// newLogger logs at level ("debug", "info", "warn", "error") in format to w.
func newLogger(w io.Writer, level, format string) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lvl}
	if format == logJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
