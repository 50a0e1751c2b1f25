#!/usr/bin/env bash
# The test command: vet, then every test (unit, in-process cluster, CLI
# golden, the multi-process network-namespace cluster tests, which need
# root and iproute2, and the fault harness), then the race detector over
# the packages that boot no VM (under -race and TCG the VM suites would
# take too long).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
go vet ./...
# e2e runs on its own after the rest: its VMs and agent/runtime's under TCG
# on two cores at once made timing-sensitive guests (egress through a
# SOCKS5 proxy) miss their windows.
# -parallel 6: the in-process cluster tests mostly wait on timers (a third
# of a core each), so six at a time (t.Parallel) cut cluster from about
# 160 s to 55 s, and from 330 s to 100 s under -race.
go test -count=1 -timeout 20m -parallel 6 $(go list ./... | grep -v -e '/e2e$' -e '/nemesis$') "$@"
go test -count=1 -timeout 20m ./e2e "$@"
# The fault harness's short run (60 s of faults, seed 1) after e2e, for the
# same reason; bench/nemesis.sh runs it longer.
go test -count=1 -timeout 15m ./nemesis "$@"
# -short: the FSM property test replays 2 seeds instead of 6 (the run above
# replays all of them without -race). Left out: e2e and every package that
# starts QEMU; of those that start a private systemd only agent/dataplane
# (no VM, about 40 s under -race), whose generation hand-over is the
# concurrency most worth checking.
race_pkgs=(./fsm/... ./cluster/... ./trust/... ./cli/... ./credential/... ./ctrl/... ./api/... ./datadir/...
	./netpol/... ./agent/hostusage/... ./agent/dnsfilter/... ./agent/dataplane/... ./storagepool/... ./metrics/... ./vmm/guest/... ./vmm/guestproto/... ./vmm/platform/... ./internal/...)
go test -race -short -count=1 -timeout 10m -parallel 6 "${race_pkgs[@]}"
