package artifacts

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkPutFetch1GiB publishes 1 GiB (Put without a digest, as
// `kibo template publish` does) and fetches it to a local file (as a
// node lacking the template does), on each backend: a directory on the
// local disk, and gofakes3 in memory on loopback through minio-go with
// production part sizes. Not run in CI: see bench/README.md.
func BenchmarkPutFetch1GiB(b *testing.B) {
	const size = 1 << 30
	data := content(b, size)
	ctx := context.Background()
	for _, bk := range backends {
		s := bk.open(b)
		if s3, ok := s.(*S3); ok {
			s3.partSize = s3PartBytes
		}
		var o Object
		b.Run(bk.name+"/put", func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				var err error
				if o, err = s.Put(ctx, bytes.NewReader(data), ""); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bk.name+"/fetch", func(b *testing.B) {
			b.SetBytes(size)
			dst := filepath.Join(b.TempDir(), "image")
			for b.Loop() {
				if err := Fetch(ctx, s, o, dst, nil); err != nil {
					b.Fatal(err)
				}
				os.Remove(dst)
			}
		})
	}
}
