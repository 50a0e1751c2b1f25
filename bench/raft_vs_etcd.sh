#!/usr/bin/env bash
# Write throughput and latency of a 3-voter kibotos cluster against a
# 3-member etcd cluster, both on loopback with fsync, driven by the same
# closed-loop Go load generator (bench/loadgen) at 1 and 64 clients.
#
#   bench/raft_vs_etcd.sh                      # 15 s per run
#   BENCH_SECONDS=30 BENCH_CLIENTS="1 16 64" bench/raft_vs_etcd.sh
#
# Environment:
#   BENCH_SECONDS    measured seconds per run (default 15; 1 s warm-up is extra)
#   BENCH_CLIENTS    client counts (default "1 64")
#   BENCH_PORT_BASE  first loopback port (default 27100): etcd uses BASE..BASE+21,
#                    kibotos BASE+100..BASE+121
#   BENCH_QUIET_WAIT / BENCH_QUIET_IDLE  before each run wait up to this many
#                    seconds (60) for the CPU to be this % idle (80)
#   BENCH_OUT        also append the loadgen JSON lines to this file
#   BENCH_KEEP=1     keep the temp directory (data dirs, member logs)
#   BENCH_PPROF_DIR  run the members with pprof (bench/kibotos-pprof) and save
#                    a CPU profile of each member per kibotos run into this dir
#
# The clusters run one after the other so each has both cores to itself.
# Needs etcd 3.4+ (apt-get install -y etcd-server etcd-client), jq and Go.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SECS=${BENCH_SECONDS:-15}
CLIENTS=${BENCH_CLIENTS:-"1 64"}
BASE=${BENCH_PORT_BASE:-27100}

need etcd "apt-get update && apt-get install -y etcd-server etcd-client"
need etcdctl "apt-get update && apt-get install -y etcd-server etcd-client"
need jq "apt-get install -y jq"
bench_init
build_bins
RESULTS="$BENCH_TMP/results.jsonl"
: >"$RESULTS"

run_load() { # run_load ARGS... (loadgen flags; -target and -clients first)
	local line
	wait_quiet
	[[ "$2" != kibotos ]] || kib_profile "kibotos-c$4" "$((SECS > 2 ? SECS : 1))"
	log "loadgen $* (${SECS}s)"
	line=$("$LOADGEN" "$@" -duration "${SECS}s") || die "loadgen failed: $line"
	echo "$line" | tee -a "$RESULTS" >&2
	[[ -z "${BENCH_OUT:-}" ]] || echo "$line" >>"$BENCH_OUT"
}

# --- etcd ------------------------------------------------------------------
log "$(etcd --version | head -1)"
ETCD_PIDS=()
cluster="" endpoints=""
for i in 1 2 3; do
	cluster+="${cluster:+,}e$i=http://127.0.0.1:$((BASE + (i - 1) * 10 + 1))"
	endpoints+="${endpoints:+,}http://127.0.0.1:$((BASE + (i - 1) * 10))"
done
for i in 1 2 3; do
	c=$((BASE + (i - 1) * 10)) p=$((BASE + (i - 1) * 10 + 1))
	# Default durability: every raft entry is fsynced (no --unsafe-no-fsync).
	start_bg "etcd-e$i" etcd --name "e$i" --data-dir "$BENCH_TMP/etcd/e$i" \
		--listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
		--listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
		--initial-cluster "$cluster" --initial-cluster-token kibotos-bench --initial-cluster-state new \
		--logger zap --log-level warn
	ETCD_PIDS+=("$!")
done
wait_until 60 "etcd cluster health" env ETCDCTL_API=3 etcdctl --endpoints "$endpoints" endpoint health
log "etcd cluster ready: $endpoints"
for n in $CLIENTS; do
	run_load -target etcd -clients "$n" -endpoints "$endpoints"
done
for pid in "${ETCD_PIDS[@]}"; do stop_pid "$pid"; done

# --- kibotos ---------------------------------------------------------------
kib_cluster 3 $((BASE + 100))
addrs=$(IFS=,; echo "${KIB_ADDRS[*]}")
for n in $CLIENTS; do
	run_load -target kibotos -clients "$n" -data-dir "${KIB_DIRS[0]}" -addrs "$addrs" -nodes m1,m2,m3
done

# --- table -----------------------------------------------------------------
echo
printf '%-8s %10s %10s %8s %8s %8s %8s %10s %9s\n' clients etcd_ops/s ours_ops/s etcd_p50 ours_p50 etcd_p99 ours_p99 thr_ratio p99_ratio
for n in $CLIENTS; do
	jq -rs --argjson n "$n" '
		(map(select(.target == "etcd" and .clients == $n))[0]) as $e |
		(map(select(.target == "kibotos" and .clients == $n))[0]) as $k |
		[$n, $e.ops_per_s, $k.ops_per_s, $e.p50_ms, $k.p50_ms, $e.p99_ms, $k.p99_ms,
		 (($k.ops_per_s / $e.ops_per_s) * 100 | round / 100),
		 (($k.p99_ms / $e.p99_ms) * 100 | round / 100)] | @tsv' "$RESULTS" |
		awk -F'\t' '{printf "%-8s %10s %10s %8s %8s %8s %8s %9sx %8sx\n", $1,$2,$3,$4,$5,$6,$7,$8,$9}'
done
echo "(thr_ratio = ours/etcd throughput, target >= 1.0; p99_ratio = ours/etcd p99 latency, target <= 1.0; ${SECS}s per run, latencies in ms)"
