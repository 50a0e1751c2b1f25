package cli

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kibotos/kibotos/api"
)

// formatBytes shows bytes in the largest binary unit with one decimal.
func formatBytes(n uint64) string { return api.FormatBytes(n) }

// formatSkew shows a clock offset with its sign, in ms below a second.
func formatSkew(ns int64) string {
	d := time.Duration(ns)
	sign := "+"
	if d < 0 {
		sign, d = "-", -d
	}
	if d < 50*time.Microsecond {
		sign = "+" // no "-0.0ms"
	}
	if d < time.Second {
		return fmt.Sprintf("%s%.1fms", sign, float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%s%.1fs", sign, d.Seconds())
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func pct(f *float64) string {
	if f == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", *f*100)
}

func optBytes(n *uint64) string {
	if n == nil {
		return "-"
	}
	return formatBytes(*n)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// table writes aligned columns. Output is buffered: tabwriter writes cell
// by cell, which is 20 system calls a row on an unbuffered stdout.
type table struct {
	buf *bufio.Writer
	tw  *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *table {
	buf := bufio.NewWriterSize(w, 64<<10)
	t := &table{buf: buf, tw: tabwriter.NewWriter(buf, 0, 4, 2, ' ', 0)}
	t.row(header...)
	return t
}

// row writes one line; a cell shows control and bidi characters escaped
// (they come from the server, and from whoever named the object).
func (t *table) row(cols ...string) {
	safe := make([]string, len(cols))
	for i, c := range cols {
		safe[i] = api.EscapeText(c)
	}
	fmt.Fprintln(t.tw, strings.Join(safe, "\t"))
}

// shown returns args with every string (and list of strings) escaped for
// a terminal (api.EscapeText): for output formatted with printf verbs.
func shown(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = api.EscapeText(v)
		case []string:
			esc := make([]string, len(v))
			for j, s := range v {
				esc[j] = api.EscapeText(s)
			}
			out[i] = esc
		default:
			out[i] = a
		}
	}
	return out
}

// shownLines escapes each line of a message, keeping its line breaks.
func shownLines(msg string) string {
	lines := strings.Split(msg, "\n")
	for i, l := range lines {
		lines[i] = api.EscapeText(l)
	}
	return strings.Join(lines, "\n")
}

func (t *table) flush() {
	t.tw.Flush()
	t.buf.Flush()
}

// clockColumn is the CLOCK column: the latest skew, "(over)" past the
// allowed skew, "-" without a live control session.
func clockColumn(n *api.Node) string {
	s := n.Session
	if s == nil || !s.Alive || s.Clock == nil {
		return "-"
	}
	out := formatSkew(s.Clock.OffsetNS)
	if s.Clock.Over {
		out += " (over)"
	}
	return out
}

func itoa(n int) string { return strconv.Itoa(n) }
