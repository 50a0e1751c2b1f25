#!/usr/bin/env bash
# The fault harness (package nemesis) for longer than CI's short run: a
# cluster of real members in network namespaces, real guests, the seeded
# workload and faults for SECONDS, then the checks. Prints the summary
# (operations by kind and outcome, faults by kind, every anomaly with its
# seed and the history that shows it) and keeps the JSON report.
#
#   bench/nemesis.sh                 # 600 s, seed 1
#   bench/nemesis.sh 3600 7          # an hour, seed 7
#   BENCH_NEMESIS_HOSTS=5 BENCH_NEMESIS_FAULT_EVERY=5s bench/nemesis.sh 1800 3
#
# Needs root, QEMU and what scripts/install-deps.sh installs. Exit 0 when
# the run found no anomaly. The report goes to
# $BENCH_NEMESIS_REPORT (default ./nemesis-SEED.json); with
# BENCH_NEMESIS_KEEP=DIR, the logs of a run with an anomaly are kept there;
# BENCH_NEMESIS_FAULTS=kill-member,pool-full picks from those kinds only;
# BENCH_NEMESIS_HOLD=4s holds each fault 1.2-4 s (default 10s: 3-10 s).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
seed=${2:-1}
report=${BENCH_NEMESIS_REPORT:-$PWD/nemesis-$seed.json}
[[ "$seconds" =~ ^[0-9]+$ && "$seed" =~ ^[0-9]+$ ]] || { echo "usage: bench/nemesis.sh [SECONDS] [SEED]" >&2; exit 2; }
export PATH=/usr/local/go/bin:$PATH
# The run, then settling, read-back, deletion and the checks: give the
# test binary the run's time and half an hour more.
log=${report%.json}.log
set +e
go test -count=1 -v -timeout "$((seconds + 1800))s" -run '^TestNemesis$' ./nemesis -args \
	-nemesis.seconds "$seconds" -nemesis.seed "$seed" \
	-nemesis.hosts "${BENCH_NEMESIS_HOSTS:-3}" -nemesis.fault-every "${BENCH_NEMESIS_FAULT_EVERY:-8s}" \
	-nemesis.hold "${BENCH_NEMESIS_HOLD:-10s}" \
	-nemesis.report "$report" -nemesis.keep "${BENCH_NEMESIS_KEEP:-}" -nemesis.faults "${BENCH_NEMESIS_FAULTS:-}" >"$log" 2>&1
rc=$?
set -e
# The report: from its first line to the next line the test logs.
sed -n '/nemesis_test.go:[0-9]*: report:/,/^    [a-z_]*\.go:[0-9]*: \|^--- /{/\.go:[0-9]*: \|^--- /!p}' "$log" | sed 's/^        //'
grep -E '^(--- |FAIL|ok )' "$log" || true
echo "report: $report; the test's whole output: $log"
exit "$rc"
