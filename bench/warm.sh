#!/usr/bin/env bash
# Issue 15's warm-start figure through the whole product: from `kibo
# workspace create` to the answer of its first `kibo workspace exec`, for a
# Workspace that adopts a warm guest against one that boots, alternating
# in one `kibotos dev --warm kibotos-coding=1` cluster. In dev the
# templates kibotos-base and kibotos-coding are the same busybox system, so
# the warm guest is the only difference; both at a create's default size
# (1 CPU, 512MiB). Before each warm create the script waits until the node
# reports its warm guest ready again and makes the cold create first: no
# warm guest boots during either, and each runs alone (the other's VM is
# deleted before).
#
#   bench/warm.sh                  # 5 pairs
#   BENCH_RUNS=9 bench/warm.sh
#   BENCH_PAGE_REPORTING=off bench/warm.sh   # this VM host's free page reporting paused (lib.sh)
#
# Needs root, QEMU, jq and what scripts/install-deps.sh installs; the
# Platform is built once into $KIBOTOS_PLATFORM_CACHE (default the tests'
# /tmp/kibotos-test-platform). About 1-2 minutes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need jq "apt-get install jq"
bench_init
host_page_reporting
runs=${BENCH_RUNS:-5}
log "building kibotos (static, as the Platform's guest agent must be)"
KIBOTOS_BIN_DIR="$BENCH_TMP/bin" bash "$BENCH_ROOT/scripts/build.sh" >/dev/null
KIBOTOS="$BENCH_TMP/bin/kibotos"
KIBO="$BENCH_TMP/bin/kibo"
export KIBOTOS_DATA_DIR="$BENCH_TMP/dev"
export KIBOTOS_PLATFORM_CACHE=${KIBOTOS_PLATFORM_CACHE:-/tmp/kibotos-test-platform}
port=$((21000 + RANDOM % 8000))

# dev's VMs and private systemd outlive it: dev down ends them.
dev_down() {
	local rc=$?
	[[ -n "${PID_dev:-}" ]] && stop_pid "$PID_dev"
	"$KIBOTOS" dev down --purge --data-dir "$KIBOTOS_DATA_DIR" >/dev/null 2>&1 || log "kibotos dev down failed"
	(exit "$rc")
	bench_cleanup
}
trap dev_down EXIT

start_bg dev "$KIBOTOS" dev --data-dir "$KIBOTOS_DATA_DIR" --advertise "127.0.0.1:$port" --no-demo --warm kibotos-coding=1
warm_ready() {
	"$KIBO" node get dev --json | jq -e '.result.report.warm[]? | select(.template == "kibotos-coding") | .ready == 1' >/dev/null
}
log "waiting for node dev and its warm guest"
wait_until 300 "node dev with a warm guest of kibotos-coding" warm_ready

now_ms() { date +%s%3N; }
# first_exec TEMPLATE: ms from create to the first exec's answer.
first_exec() {
	local t0 id
	t0=$(now_ms)
	id=$("$KIBO" workspace create -q --template "$1")
	"$KIBO" workspace exec "$id" -- true
	echo "$(($(now_ms) - t0)) $id"
}
warm=() cold=()
for i in $(seq 1 "$runs"); do
	# The warm guest's replacement boots after the warm create: the cold
	# one goes first, while no boot runs.
	# Each runs alone: the other's VM is deleted first.
	wait_until 120 "the next warm guest" warm_ready
	read -r c cid < <(first_exec kibotos-base)
	"$KIBO" workspace delete "$cid" >/dev/null
	read -r w wid < <(first_exec kibotos-coding)
	"$KIBO" workspace delete "$wid" >/dev/null
	log "run $i: warm $w ms, cold $c ms"
	warm+=("$w") cold+=("$c")
done
starts=$("$KIBO" node get dev --json | jq -r '.result.report.warm[] | select(.template == "kibotos-coding") | .starts')
[[ "$starts" == "$runs" ]] || die "the node counted $starts starts from warm guests, not $runs: a warm create booted"
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mw=$(median "${warm[@]}") mc=$(median "${cold[@]}")
awk -v w="$mw" -v c="$mc" -v n="$runs" 'BEGIN { printf "create -> first exec, median of %d: warm %d ms, cold %d ms, warm/cold %.2f\n", n, w, c, w / c }'
