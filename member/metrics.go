package member

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"

	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/metrics"
)

// serveMetrics exposes the member's metrics on the API port (admin
// certificates, served with the rest of local) and on the [metrics] listener: the configured address
// (failing to bind it is an error), none, or by default
// 127.0.0.1:<advertised port+3> (then a busy port is only a warning: the
// member serves anyway, and the API port still has /metrics).
// The listener's server runs in owned until ctx ends.
func serveMetrics(ctx context.Context, owned *sync.WaitGroup, srv *cluster.Server, src metrics.Sources, local cluster.Local, listen string, log *slog.Logger) error {
	reg := metrics.Registry(src)
	local.Metrics = metrics.Handler(reg)
	srv.ServeLocal(local)
	if listen == "none" {
		return nil
	}
	explicit := listen != ""
	if !explicit {
		_, port, err := net.SplitHostPort(srv.Advertise())
		p, perr := strconv.Atoi(port)
		if err != nil || perr != nil {
			return fmt.Errorf("metrics: advertised address %q has no port", srv.Advertise())
		}
		listen = net.JoinHostPort("127.0.0.1", strconv.Itoa(p+3))
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		if explicit {
			return fmt.Errorf("metrics: [metrics] listen %s: %w; choose a free address, or \"none\"", listen, err)
		}
		log.Warn("metrics listener not started: the API port still serves /metrics", "address", listen, "err", err)
		return nil
	}
	owned.Go(func() {
		if err := metrics.Serve(ctx, ln, reg, log); err != nil {
			log.Error("metrics listener stopped", "address", listen, "err", err)
		}
	})
	return nil
}
