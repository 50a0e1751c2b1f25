package member

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"
)

// maxClockSkewFile bounds what followClockSkew reads: a duration.
const maxClockSkewFile = 64

// followClockSkew reads the duration in file every second until ctx ends
// and hands each change from last to set: the fault harness steps a host's clock
// beyond the skew limit and back while its member runs. A file that is
// missing means no skew; one that does not hold a duration is logged and
// changes nothing.
func followClockSkew(ctx context.Context, file string, last time.Duration, log *slog.Logger, set func(time.Duration)) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastErr := ""
	for {
		d, err := readClockSkew(file)
		switch {
		case err != nil:
			if err.Error() != lastErr {
				log.Warn("clock skew file not read; the clock stays as it is", "file", file, "err", err)
			}
			lastErr = err.Error()
		case d != last:
			log.Warn("clock stepped (test clock skew)", "file", file, "skew", d)
			set(d)
			last, lastErr = d, ""
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func readClockSkew(file string) (time.Duration, error) {
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, maxClockSkewFile+1)
	n, _ := f.Read(buf)
	if n > maxClockSkewFile {
		return 0, errors.New("longer than a duration")
	}
	s := strings.TrimSpace(string(buf[:n]))
	if s == "" {
		return 0, nil
	}
	return time.ParseDuration(s)
}
