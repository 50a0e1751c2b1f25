#!/usr/bin/env bash
# The test command: vet, then every test (unit, in-process cluster, CLI
# golden, and the multi-process network-namespace cluster test, which needs
# root and iproute2).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
go vet ./...
go test -count=1 -timeout 20m ./... "$@"
