#!/usr/bin/env bash
# Issue 16's artifact figures, each against a reference measured in the
# same run:
#  - publish (put) and fetch throughput of 1 GiB through the directory
#    store and through S3 (gofakes3 on loopback): BenchmarkPutFetch1GiB;
#  - a Workspace's first start on a node that lacks its template and
#    Platform (fetch + boot) against a start on the same node once it
#    holds them: the two-host e2e test logs both.
# Needs root, QEMU and what scripts/install-deps.sh installs; about 4 min.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
go test ./artifacts -run '^$' -bench PutFetch1GiB -benchtime 1x | grep -E 'Benchmark|ok'
line=$(go test ./e2e -run '^TestTemplateFetchedFromArtifactStore$' -count=1 -v | grep 'bench: first start' || true)
if [ -z "$line" ]; then
	echo "the e2e test did not log its start times" >&2
	exit 1
fi
fetch=$(sed -E 's/.*fetching template and Platform ([0-9.]+) s.*/\1/' <<<"$line")
held=$(sed -E 's/.*holding them ([0-9.]+) s.*/\1/' <<<"$line")
awk -v f="$fetch" -v h="$held" 'BEGIN { printf "first start fetching: %.2f s, start holding: %.2f s, ratio %.2fx\n", f, h, f / h }'
