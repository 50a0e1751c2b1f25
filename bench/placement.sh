#!/usr/bin/env bash
# Workspace creates per second and create → AVAILABLE latency of a 3-voter
# kibotos cluster placing on 1,000 simulated nodes, end to end through the
# HTTP API, Raft (fsync on), placement and the nodes' control sessions.
#
#   bench/placement.sh
#   BENCH_NODES=20 BENCH_SECONDS=5 bench/placement.sh       # a smoke run
#   BENCH_PPROF_DIR=/tmp/prof bench/placement.sh            # + CPU profiles of the members
#
# Starts the cluster as raft_vs_etcd.sh does (init + grant + join + serve, 3
# ctrl,node members on loopback), then bench/nodesim: BENCH_NODES nodes
# enrolled through the API (grant + join each) that hold real control
# sessions with the leader and answer each start at once without a VM (see
# bench/nodesim/main.go). When every simulated node is READY, bench/loadgen
# -target create runs BENCH_CLIENTS closed-loop clients, each creating a
# Workspace (1 core, 1 GiB, template "bench") and waiting with blocking reads
# until it is AVAILABLE, then the next; client i talks to member i mod 3.
# Target (issue 15): >= 2,000 creates/s with p99 < 250 ms at 1,000 nodes.
#
# Environment:
#   BENCH_NODES       simulated nodes (default 1000)
#   BENCH_CLIENTS     concurrent clients (default 64)
#   BENCH_SECONDS     measured seconds (default 15; 1 s warm-up is extra)
#   BENCH_REPEAT      runs on the same cluster, one after the other (default 1;
#                     each run adds its Workspaces to the state)
#   BENCH_PORT_BASE   member ports (default 27600, 27610, 27620; gossip +1,
#                     pprof +5)
#   BENCH_WATCH       0: nodes without the agent's once-a-second report
#                     watcher (default 1, as a real node)
#   BENCH_RESULT_REPORTS  0: nodes send the report owed after a task as a
#                     message of its own, as before level 10 (default 1:
#                     with the result, as the agent does)
#   BENCH_WAIT_FILE   before each run, wait while this file exists (a CI
#                     run on the same machine), polling every 20 s
#   BENCH_PPROF_DIR   run the members with pprof and save a CPU profile of
#                     each over each run into this dir
#   BENCH_QUIET_WAIT / BENCH_QUIET_IDLE  see lib.sh wait_quiet
#   BENCH_KEYS        namespaces (default 0): when set, the members serve
#                     the API for applications, each namespace gets a
#                     sandbox key and a quota no run reaches, and every run
#                     is made twice, one after the other: by the operator
#                     certificate (the reference) and by the keys through
#                     the API listeners (client i with key i mod BENCH_KEYS)
#   BENCH_KEEP=1      keep the temp directory (data dirs, logs)
#
# The Workspaces are not deleted one by one: the cluster and its data dirs
# are removed at exit.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NODES=${BENCH_NODES:-1000}
CLIENTS=${BENCH_CLIENTS:-64}
SECS=${BENCH_SECONDS:-15}
REPEAT=${BENCH_REPEAT:-1}
BASE=${BENCH_PORT_BASE:-27600}
TCK=$(getconf CLK_TCK)

need jq "apt-get install -y jq"
need curl "apt-get install -y curl"
bench_init
build_bins
(cd "$BENCH_ROOT" && go build -o "$BENCH_TMP/bin/nodesim" ./bench/nodesim) || die "build failed"

KEYS=${BENCH_KEYS:-0}
((KEYS == 0)) || KIB_API=1
kib_cluster 3 "$BASE"
ADDRS=$(IFS=,; echo "${KIB_ADDRS[*]}")
LEADER=$("$KIBO" status --json --data-dir "${KIB_DIRS[0]}" | jq -r .result.leader)
log "leader: $LEADER"

log "nodesim: enrolling $NODES nodes and opening their control sessions"
start_bg nodesim "$BENCH_TMP/bin/nodesim" -data-dir "${KIB_DIRS[0]}" -addrs "$ADDRS" -nodes "$NODES" \
	-watch="$([[ "${BENCH_WATCH:-1}" == 0 ]] && echo false || echo true)" \
	-result-reports="$([[ "${BENCH_RESULT_REPORTS:-1}" == 0 ]] && echo false || echo true)"
SIM_PID=$!
sim_ready() {
	kill -0 "$SIM_PID" 2>/dev/null || die "nodesim exited: $(tail -5 "$BENCH_TMP/logs/nodesim.log")"
	grep -q '"stage":"ready"' "$BENCH_TMP/logs/nodesim.log"
}
wait_until 600 "$NODES simulated nodes READY" sim_ready
log "nodesim: $(grep '"stage":"ready"' "$BENCH_TMP/logs/nodesim.log")"

# What the sessions alone cost: pings every 2 s, each followed by a
# dispatcher pass on the leader.
i0=$(cpu_ticks "${KIB_PIDS[@]}")
sleep 5
i1=$(cpu_ticks "${KIB_PIDS[@]}")
log "members idle with $NODES sessions: $(((i1 - i0) * 100 / TCK / 5))% of a core (5 s)"

KEYS_FILE="$BENCH_TMP/keys"
if ((KEYS > 0)); then
	log "making $KEYS namespaces, each with a quota and a sandbox key"
	: >"$KEYS_FILE"
	for k in $(seq 1 "$KEYS"); do
		ns=$(printf 'tenant-%03d' "$k")
		"$KIBO" namespace create "$ns" --data-dir "${KIB_DIRS[0]}" >/dev/null
		"$KIBO" namespace set-quota "$ns" --workspaces 1000000 --cpu 1000000 --memory 1000TiB --data-dir "${KIB_DIRS[0]}" >/dev/null
		"$KIBO" api-key create app -n "$ns" --data-dir "${KIB_DIRS[0]}" >>"$KEYS_FILE"
	done
	API_ADDRS=$(IFS=,; echo "${KIB_API_ADDRS[*]}")
fi
modes=(operator)
((KEYS == 0)) || modes+=(keys)

RESULTS="$BENCH_TMP/results.jsonl"
: >"$RESULTS"
for run in $(seq 1 "$REPEAT"); do
for mode in "${modes[@]}"; do
	if [[ -n "${BENCH_WAIT_FILE:-}" ]]; then
		while [[ -e "$BENCH_WAIT_FILE" ]]; do
			log "waiting: $BENCH_WAIT_FILE exists"
			sleep 20
		done
	fi
	wait_quiet
	kib_profile "placement-c$CLIENTS-n$NODES-$(date +%H%M%S)" "$SECS"
	log "run $run/$REPEAT ($mode): loadgen -target create, $CLIENTS clients, ${SECS}s"
	by=()
	[[ $mode == operator ]] || by=(-keys-file "$KEYS_FILE" -api-addrs "$API_ADDRS")
	s0=$(cpu_ticks "${KIB_PIDS[@]}")
	n0=$(cpu_ticks "$SIM_PID")
	read -ra m0 < <(machine_ticks)
	line=$("$LOADGEN" -target create -data-dir "${KIB_DIRS[0]}" -addrs "$ADDRS" -clients "$CLIENTS" -duration "${SECS}s" "${by[@]}") ||
		die "loadgen failed: $line"
	read -ra m1 < <(machine_ticks)
	s1=$(cpu_ticks "${KIB_PIDS[@]}")
	n1=$(cpu_ticks "$SIM_PID")
	# CPU per create (ms) of the members and of the simulated nodes; the
	# machine's busy share over the run (1 s warm-up included).
	line=$(jq -c --arg mode "$mode" --argjson srv "$((s1 - s0))" --argjson sim "$((n1 - n0))" --argjson tck "$TCK" \
		--argjson busy "$((m1[0] - m0[0]))" --argjson total "$((m1[1] - m0[1]))" --argjson nodes "$NODES" \
		'. + {mode: $mode, nodes: $nodes,
		      members_cpu_ms_per_create: (if .ops > 0 then ($srv / $tck * 1000 / .ops * 1000 | round) / 1000 else null end),
		      nodesim_cpu_ms_per_create: (if .ops > 0 then ($sim / $tck * 1000 / .ops * 1000 | round) / 1000 else null end),
		      machine_busy_pct: ($busy * 100 / $total | round)}' <<<"$line")
	echo "$line" >&2
	echo "$line" >>"$RESULTS"
done
done

ws_count() { "$KIBO" workspace list --all -q --page-size 5000 --data-dir "${KIB_DIRS[0]}" "$@" | wc -l; }
log "workspaces in the cluster: $(ws_count), of which AVAILABLE: $(ws_count --state AVAILABLE)"
stop_pid "$SIM_PID"
log "nodesim: $(grep '"stage":"done"' "$BENCH_TMP/logs/nodesim.log" || echo 'no summary')"

echo
echo "Workspace creates to AVAILABLE, kibotos $BENCH_REV, 3 voters, $NODES simulated nodes, $CLIENTS clients, ${SECS}s per run (latencies in ms):"
printf '  %-4s %-8s %10s %8s %8s %10s %10s %7s %12s %12s %6s\n' row by creates/s p50 p99 accept_p50 accept_p99 errors members_ms nodesim_ms busy%
jq -r '[.mode, .ops_per_s, .p50_ms, .p99_ms, .accept_p50_ms, .accept_p99_ms, .errors, .members_cpu_ms_per_create, .nodesim_cpu_ms_per_create, .machine_busy_pct] | @tsv' "$RESULTS" |
	awk -F'\t' '{printf "  %-4d %-8s %10s %8s %8s %10s %10s %7s %12s %12s %6s\n", NR, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10}'
jq -r 'select(.first_error != null) | "  first error: \(.first_error)"' "$RESULTS"
if ((KEYS > 0)); then
	# Keys against the operator certificate, each keys run against the
	# operator run just before it on the same cluster (every run adds its
	# Workspaces to the state, so later pairs see more).
	jq -rs --arg keys "$KEYS" '[range(0; length; 2) as $i | {o: .[$i], k: .[$i + 1]} | select(.k != null)] |
		"keys across \($keys) namespaces against the operator certificate, run by run: creates/s " +
		([.[] | (.k.ops_per_s / .o.ops_per_s * 100 | round / 100 | tostring) + "x"] | join(", ")) +
		"; members CPU per create " +
		([.[] | (.k.members_cpu_ms_per_create / .o.members_cpu_ms_per_create * 100 | round / 100 | tostring) + "x"] | join(", "))' "$RESULTS"
fi
best=$(jq -s 'map(select(.mode == "operator")) | max_by(.ops_per_s)' "$RESULTS")
if jq -e '.ops_per_s >= 2000 and .p99_ms < 250' <<<"$best" >/dev/null; then verdict=MET; else verdict=MISSED; fi
echo "target: >= 2,000 creates/s with p99 < 250 ms at 1,000 nodes; best run $(jq -r '"\(.ops_per_s) creates/s, p99 \(.p99_ms) ms"' <<<"$best") at $NODES nodes: $verdict"
