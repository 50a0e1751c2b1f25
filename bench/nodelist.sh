#!/usr/bin/env bash
# `kibo node list` latency with 10,000 registered nodes, end to end.
#
#   bench/nodelist.sh
#   BENCH_NODES=2000 BENCH_RUNS=50 bench/nodelist.sh
#
# Starts a real one-voter member (fsync on), registers BENCH_NODES nodes
# through the HTTP API (one enrollment grant and one join per node, see
# bench/nodelist/main.go), breaks the list down by stage (HTTP GET + body,
# client decode, in-process CLI, in-process fsm.ListNodes, JSON encode), then
# times the `kibo node list` binary with its output to /dev/null (hyperfine
# when installed, else a timed loop): median and p95. Target: < 200 ms.
#
# Environment:
#   BENCH_NODES        nodes in the cluster, the member included (default 10000)
#   BENCH_RUNS         timed runs of each measurement (default 30)
#   BENCH_CONCURRENCY  populate workers (default 16)
#   BENCH_PORT_BASE    member port (default 27400; gossip +1, pprof +5)
#   BENCH_PPROF_DIR    run the member with pprof and save a CPU profile of
#                      the member while the binary is timed into this dir
#   BENCH_KEEP=1       keep the temp directory
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NODES=${BENCH_NODES:-10000}
RUNS=${BENCH_RUNS:-30}
CONC=${BENCH_CONCURRENCY:-16}
BASE=${BENCH_PORT_BASE:-27400}

need jq "apt-get install -y jq"
bench_init
build_bins
(cd "$BENCH_ROOT" && go build -o "$BENCH_TMP/bin/nodelist" ./bench/nodelist) || die "build failed"

kib_cluster 1 "$BASE"
DIR=${KIB_DIRS[0]}
STAGES="$BENCH_TMP/stages.jsonl"
log "registering $NODES nodes through the API ($CONC workers) and timing the stages"
"$BENCH_TMP/bin/nodelist" -data-dir "$DIR" -count "$NODES" -concurrency "$CONC" -runs "$RUNS" | tee "$STAGES" >&2

wait_quiet
kib_profile nodelist 10
CMD=("$KIBO" --data-dir "$DIR" node list)
got=$("${CMD[@]}" | tail -n +2 | wc -l)
log "kibo node list prints $got nodes"
read -ra m0 < <(machine_ticks)
if command -v hyperfine >/dev/null; then
	hyperfine -N --warmup 3 --runs "$RUNS" --export-json "$BENCH_TMP/hf.json" "${CMD[*]}" >&2
	mapfile -t times < <(jq -r '.results[0].times[]' "$BENCH_TMP/hf.json")
	hyperfine -N --warmup 3 --runs "$RUNS" --export-json "$BENCH_TMP/hf-json.json" "${CMD[*]} --json" >&2
	mapfile -t jtimes < <(jq -r '.results[0].times[]' "$BENCH_TMP/hf-json.json")
	cpu=$(jq -r '.results[0] | (.user + .system) * 1000 | round' "$BENCH_TMP/hf.json")
	jcpu=$(jq -r '.results[0] | (.user + .system) * 1000 | round' "$BENCH_TMP/hf-json.json")
else
	log "hyperfine not installed (apt-get install -y hyperfine); timing a loop"
	times=() jtimes=() cpu=? jcpu=?
	for i in $(seq 0 "$RUNS"); do
		t0=$(date +%s%N); "${CMD[@]}" >/dev/null; t1=$(date +%s%N)
		"${CMD[@]}" --json >/dev/null; t2=$(date +%s%N)
		((i == 0)) && continue
		times+=("$(echo "($t1 - $t0) / 1000000000" | bc -l)")
		jtimes+=("$(echo "($t2 - $t1) / 1000000000" | bc -l)")
	done
fi
read -ra m1 < <(machine_ticks)
busy_pct=$(((m1[0] - m0[0]) * 100 / (m1[1] - m0[1])))
pctl() { # pctl P SECONDS... -> ms at the nearest-rank percentile
	local p=$1
	shift
	printf '%s\n' "$@" | sort -g | awk -v p="$p" '{a[NR]=$1} END {i=int(NR*p+0.999999); if(i<1)i=1; printf "%.1f", a[i]*1000}'
}
min=$(pctl 0 "${times[@]}") med=$(pctl 0.5 "${times[@]}") p95=$(pctl 0.95 "${times[@]}")
jmin=$(pctl 0 "${jtimes[@]}") jmed=$(pctl 0.5 "${jtimes[@]}") jp95=$(pctl 0.95 "${jtimes[@]}")

echo
echo "kibo node list with $got nodes, kibotos $BENCH_REV ($RUNS runs each, ms; client_cpu = mean user+system CPU of the kibo process):"
printf '  %-44s %8s %8s %8s %11s\n' stage min median p95 "client_cpu"
jq -r 'select(.median_ms != null) | [.stage, .min_ms, .median_ms, .p95_ms] | @tsv' "$STAGES" |
	awk -F'\t' '{printf "  %-44s %8.1f %8.1f %8.1f\n", $1, $2, $3, $4}'
printf '  %-44s %8s %8s %8s %11s\n' "kibo node list (binary, table, >/dev/null)" "$min" "$med" "$p95" "$cpu"
printf '  %-44s %8s %8s %8s %11s\n' "kibo node list --json (binary, >/dev/null)" "$jmin" "$jmed" "$jp95" "$jcpu"
echo "  (the machine's CPU was ${busy_pct}% busy during the binary timing: kibo, the member and anything else)"
jq -r 'select(.stage == "populate") | "  populate: \(.added) nodes added in \(.seconds)s (\(.joins_per_s) grant+join/s)"' "$STAGES"
if ((got < 10000)); then
	verdict="not judged: fewer than 10,000 nodes"
elif awk -v m="$p95" 'BEGIN{exit !(m < 200)}'; then
	verdict=MET
else
	verdict=MISSED
fi
echo "target: node list of 10,000 nodes < 200 ms; p95 ${p95} ms at $got nodes: $verdict"
