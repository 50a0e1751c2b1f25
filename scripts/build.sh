#!/usr/bin/env bash
# Builds bin/kibotos (static, with the source revision stamped) and the
# bin/kibo alias.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
rev=$(git rev-parse HEAD 2>/dev/null || echo unknown)
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/kibotos/kibotos/buildinfo.Revision=$rev" -o bin/kibotos .
ln -sf kibotos bin/kibo
echo "built bin/kibotos ($rev) and bin/kibo"
