package cli

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progressBar draws "name  42% 12.3MiB/29.0MiB 85.1MiB/s" on a terminal.
type progressBar struct {
	g       *Globals
	on      bool
	name    string
	total   int64
	mu      sync.Mutex
	n       int64
	start   time.Time
	lastOut time.Time
}

func (g *Globals) progress(want bool, name string, total int64) *progressBar {
	on := want && !g.JSON
	if f, ok := g.stderr.(*os.File); !ok || !isTerminal(f.Fd()) {
		on = false
	}
	return &progressBar{g: g, on: on, name: name, total: total, start: time.Now()}
}

func (p *progressBar) add(n int) { p.update(func() { p.n += int64(n) }) }

// set replaces the label and the count, for work that reports how far it
// is rather than what it added.
func (p *progressBar) set(name string, n int64) { p.update(func() { p.name, p.n = name, n }) }

func (p *progressBar) update(change func()) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	change()
	if time.Since(p.lastOut) > 100*time.Millisecond {
		p.lastOut = time.Now()
		p.draw()
	}
}

func (p *progressBar) draw() {
	rate := float64(p.n) / max(time.Since(p.start).Seconds(), 0.001)
	pctText := ""
	if p.total > 0 {
		pctText = fmt.Sprintf("%3d%% ", p.n*100/p.total)
	}
	total := "?"
	if p.total >= 0 {
		total = formatBytes(uint64(p.total))
	}
	fmt.Fprintf(p.g.stderr, "\r%s  %s%s/%s %s/s   ", p.name, pctText, formatBytes(uint64(p.n)), total, formatBytes(uint64(rate)))
}

func (p *progressBar) done() {
	if !p.on {
		return
	}
	p.mu.Lock()
	p.draw()
	p.mu.Unlock()
	fmt.Fprintln(p.g.stderr)
}

// abandon ends a bar without drawing it again: after a failure, the error
// starts on a line of its own.
func (p *progressBar) abandon() {
	if !p.on {
		return
	}
	p.mu.Lock()
	drawn := !p.lastOut.IsZero()
	p.mu.Unlock()
	if drawn {
		fmt.Fprintln(p.g.stderr)
	}
}

type countingReader struct {
	r io.Reader
	p *progressBar
}

func (c countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.p.add(n)
	return n, err
}

type countingWriter struct {
	w io.Writer
	p *progressBar
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.p.add(n)
	return n, err
}

func (p *progressBar) reader(r io.Reader) io.Reader {
	if !p.on {
		return r
	}
	return countingReader{r, p}
}

func (p *progressBar) writer(w io.Writer) io.Writer {
	if !p.on {
		return w
	}
	return countingWriter{w, p}
}
