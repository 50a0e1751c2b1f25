// Package ctxio ends long reads when their context does.
package ctxio

import (
	"context"
	"io"
)

// Reader reads r until ctx is done; then every read fails with ctx's
// error. A read already blocked in r is not interrupted: meant for files
// and other readers that return quickly, copied in many reads.
func Reader(ctx context.Context, r io.Reader) io.Reader { return reader{ctx, r} }

type reader struct {
	ctx context.Context
	r   io.Reader
}

func (c reader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
