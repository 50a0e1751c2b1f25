#!/usr/bin/env bash
# Issue 46's benchmarks of the E2B API: the official E2B JS SDK (e2b@2.51.0)
# against the native Go SDK (sdk/kibotos), in one `kibotos dev` cluster,
# alternating, both on the E2B-style template e2b-base (E2B's "base"), at
# the same size (1 CPU, 512 MiB):
#   1. create -> first `true` answered: Sandbox.create + commands.run('true')
#      against Workspaces.Create + Exec(true); cold (a guest that boots),
#      then from a warm guest (dev restarted on the same data directory with
#      --warm e2b-base=1; before each warm create the script waits until the
#      warm guest is ready again, and each create runs alone);
#   2. exec round trip on one sandbox: commands.run('true') against Exec of
#      true; to tell the path from the command, also Exec of
#      /bin/bash -l -c true (what commands.run starts in the guest) and
#      the SDK's own Process/Start of true (the E2B path without the shell);
#   3. a 10 MiB upload: files.write against Files.WriteFile; also the
#      request files.write sends (POST /files through E2B_SANDBOX_URL)
#      made with Go's HTTP client, which tells the E2B server's part from
#      the Node SDK's.
# The programs (e2b/e2b.mjs, e2b/main.go) time in their own process, after
# one untimed call; their start is not in the figures.
#
#   bench/e2b.sh                       # 5 create pairs, 3x10 execs, 5 uploads
#   BENCH_RUNS=3 BENCH_EXEC_ROUNDS=3 BENCH_EXECS=10 BENCH_UPLOADS=5 bench/e2b.sh
#
# Needs root, QEMU, debootstrap, jq, node and what scripts/install-deps.sh
# installs (the SDK in e2e/e2bsdk/node_modules; E2B_SDK_DIR=DIR names
# another install of the same package.json). The Platform is built once
# into $KIBOTOS_PLATFORM_CACHE (default the tests' /tmp/kibotos-test-platform);
# e2b-base is built with debootstrap at each run (2-3 minutes). About
# 8 minutes in all on 2 cores.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need jq "apt-get install jq"
need node "apt-get install nodejs"
bench_init
runs=${BENCH_RUNS:-5}
exec_rounds=${BENCH_EXEC_ROUNDS:-3}
execs=${BENCH_EXECS:-10}
uploads=${BENCH_UPLOADS:-5}
size=$((10 << 20))
export E2B_SDK_DIR=${E2B_SDK_DIR:-$BENCH_ROOT/e2e/e2bsdk}
[[ -f "$E2B_SDK_DIR/node_modules/e2b/package.json" ]] ||
	die "the E2B SDK is not installed in $E2B_SDK_DIR: run scripts/install-deps.sh (npm ci there), or give E2B_SDK_DIR"
log "building kibotos (static, as the Platform's guest agent must be) and bench/e2b"
KIBOTOS_BIN_DIR="$BENCH_TMP/bin" bash "$BENCH_ROOT/scripts/build.sh" >/dev/null
(cd "$BENCH_ROOT" && go build -o "$BENCH_TMP/bin/e2bbench" ./bench/e2b) || die "build failed"
KIBOTOS="$BENCH_TMP/bin/kibotos"
KIBO="$BENCH_TMP/bin/kibo"
export KIBOTOS_DATA_DIR="$BENCH_TMP/dev"
export KIBOTOS_PLATFORM_CACHE=${KIBOTOS_PLATFORM_CACHE:-/tmp/kibotos-test-platform}
port=$((21000 + RANDOM % 8000))
api="127.0.0.1:$((port + 7))" e2b="127.0.0.1:$((port + 8))"
log "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"

# stop_dev: SIGINT, as Ctrl-C stops it; its VMs and private systemd stay.
stop_dev() {
	[[ -n "${PID_dev:-}" ]] || return 0
	stop_pid "$PID_dev" INT 30
	PID_dev=""
}
# dev's VMs and private systemd outlive it: dev down ends them.
dev_down() {
	local rc=$?
	stop_dev
	"$KIBOTOS" dev down --purge --data-dir "$KIBOTOS_DATA_DIR" >/dev/null 2>&1 || log "kibotos dev down failed"
	(exit "$rc")
	bench_cleanup
}
trap dev_down EXIT

# start_dev LOG ARGS...: kibotos dev with the E2B API, until it printed
# the E2B environment (the dev API key exists then).
start_dev() {
	local name=$1
	shift
	start_bg "$name" "$KIBOTOS" dev --data-dir "$KIBOTOS_DATA_DIR" --advertise "127.0.0.1:$port" --no-demo \
		--api-listen "$api" --e2b-listen "$e2b" --e2b-template e2b-base "$@"
	PID_dev=$!
	wait_until 900 "kibotos dev to announce its E2B API" grep -q "set -a; \. " "$BENCH_TMP/logs/$name.log"
}

# go_run ARGS...: the Go SDK program with the dev API key.
go_run() {
	"$BENCH_TMP/bin/e2bbench" -api-url "https://$api" -token-file "$KIBOTOS_DATA_DIR/api-key" \
		-ca-file "$KIBOTOS_DATA_DIR/tls/ca.crt" "$@"
}
# e2b_run ARGS...: the E2B SDK program with nothing but dev's e2b.env.
e2b_run() {
	(
		set -a
		. "$KIBOTOS_DATA_DIR/e2b.env"
		set +a
		exec node "$BENCH_ROOT/bench/e2b/e2b.mjs" "$@"
	)
}
# rotate I WORD...: the words, rotated by I (the order of round I).
rotate() {
	local i=$1
	shift
	local n=$#
	local w=("$@") k
	for k in $(seq 0 $((n - 1))); do echo "${w[$(((i + k) % n))]}"; done
}
# create_pair KIND I: one create -> first `true` through each SDK, the
# order alternating with I, each Workspace deleted before the next create.
# In the warm phase each create waits for its warm guest first.
warm_phase=0
create_pair() {
	local kind=$1 i=$2 path out ms id
	for path in $(rotate "$i" go e2b); do
		((warm_phase == 0)) || wait_until 300 "the next warm guest" warm_ready
		if [[ $path == go ]]; then out=$(go_run -op create -template e2b-base); else out=$(e2b_run create); fi
		ms=$(jq -r '.ms[0]' <<<"$out") id=$(jq -r .workspace <<<"$out")
		"$KIBO" workspace delete "$id" >/dev/null
		echo "$kind $path $ms" >>"$BENCH_TMP/create.txt"
		log "create $kind run $i: $path $ms ms"
	done
}

log "starting kibotos dev (builds e2b-base with debootstrap: 2-3 minutes)"
start_dev dev
log "kibotos dev ready; load $(cut -d' ' -f1-3 /proc/loadavg)"

for i in $(seq 1 "$runs"); do create_pair cold "$i"; done

# Exec and upload on one sandbox, made through E2B so that both SDKs can
# reach it (a sandbox is a Workspace; the reverse is not a sandbox).
sbx=$(e2b_run keep | jq -r .workspace)
log "sandbox $sbx for the exec and upload rounds; load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$BENCH_TMP/exec.jsonl"
for r in $(seq 1 "$exec_rounds"); do
	for path in $(rotate "$r" go e2b e2b-rpc go-shell); do
		case $path in
		go) go_run -op exec -workspace "$sbx" -n "$execs" ;;
		go-shell) go_run -op exec -workspace "$sbx" -n "$execs" -shell | jq -c '.path = "go-shell"' ;;
		e2b) e2b_run exec "$sbx" "$execs" ;;
		e2b-rpc) e2b_run exec-rpc "$sbx" "$execs" | jq -c '.path = "e2b-rpc"' ;;
		esac >>"$BENCH_TMP/exec.jsonl"
	done
	log "exec round $r: $(tail -4 "$BENCH_TMP/exec.jsonl" | jq -r '"\(.path) \(.ms | sort | .[length / 2 | floor]) ms"' | paste -sd' ')"
done
# Each path writes its own file: the native write leaves a file of root,
# which cat as the sandbox's user could not replace.
: >"$BENCH_TMP/upload.jsonl"
for r in $(seq 1 "$uploads"); do
	for path in $(rotate "$r" go e2b go-e2b); do
		case $path in
		go) go_run -op upload -workspace "$sbx" -n 1 -size "$size" ;;
		go-e2b) (
			set -a
			. "$KIBOTOS_DATA_DIR/e2b.env"
			set +a
			go_run -op upload-e2b -workspace "$sbx" -n 1 -size "$size" -path /home/user/goe2b.bin
		) ;;
		e2b) e2b_run upload "$sbx" 1 "$size" ;;
		esac >>"$BENCH_TMP/upload.jsonl"
	done
	log "upload round $r: $(tail -3 "$BENCH_TMP/upload.jsonl" | jq -r '"\(.path) \(.ms[0]) ms"' | paste -sd' ')"
done
"$KIBO" workspace delete "$sbx" >/dev/null

# The warm phase: the same dev cluster again (same data directory and
# template), now keeping one warm guest of e2b-base.
log "restarting kibotos dev with --warm e2b-base=1"
stop_dev
start_dev dev-warm --warm e2b-base=1
warm_ready() {
	"$KIBO" node get dev --json | jq -e '.result.report.warm[]? | select(.template == "e2b-base") | .ready == 1' >/dev/null
}
warm_starts() {
	"$KIBO" node get dev --json | jq -r '.result.report.warm[] | select(.template == "e2b-base") | .starts'
}
wait_until 300 "a warm guest of e2b-base" warm_ready
starts0=$(warm_starts)
warm_phase=1
for i in $(seq 1 "$runs"); do create_pair warm "$i"; done
starts=$(($(warm_starts) - starts0))
((starts == 2 * runs)) || die "the node counted $starts starts from warm guests, not $((2 * runs)): a warm create booted"
log "load after the run: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- summary ---------------------------------------------------------------
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
p90() { sort -n | awk '{a[NR]=$1} END {i=int(NR*0.9+0.999); if (i<1) i=1; print a[i]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
for kind in cold warm; do
	g=$(awk -v k=$kind '$1 == k && $2 == "go" {print $3}' "$BENCH_TMP/create.txt" | median)
	e=$(awk -v k=$kind '$1 == k && $2 == "e2b" {print $3}' "$BENCH_TMP/create.txt" | median)
	printf 'create -> first true, %s, median of %d: E2B SDK %.0f ms, Go SDK %.0f ms, E2B/Go %s\n' "$kind" "$runs" "$e" "$g" "$(ratio "$e" "$g")"
done
samples() { jq -r --arg p "$2" 'select(.path == $p) | .ms[]' "$BENCH_TMP/$1.jsonl"; }
ge=$(samples exec go | median) ee=$(samples exec e2b | median)
re=$(samples exec e2b-rpc | median) se=$(samples exec go-shell | median)
printf 'exec round trip, %d each: E2B commands.run(true) median %.1f ms p90 %.1f; Go Exec(true) median %.1f ms p90 %.1f; E2B/Go %s (target <= 1.2)\n' \
	$((exec_rounds * execs)) "$ee" "$(samples exec e2b | p90)" "$ge" "$(samples exec go | p90)" "$(ratio "$ee" "$ge")"
printf '  the same command: Go Exec(/bin/bash -l -c true), what commands.run starts, median %.1f ms p90 %.1f; E2B/that %s\n' \
	"$se" "$(samples exec go-shell | p90)" "$(ratio "$ee" "$se")"
printf '  the E2B path alone: Process/Start of true (commands.rpc) median %.1f ms p90 %.1f; /Go Exec(true) %s\n' \
	"$re" "$(samples exec e2b-rpc | p90)" "$(ratio "$re" "$ge")"
gu=$(samples upload go | median) eu=$(samples upload e2b | median) cu=$(samples upload go-e2b | median)
printf '10 MiB upload, median of %d: E2B files.write %.0f ms, Go Files.WriteFile %.0f ms, E2B/Go %s (target <= 1.2)\n' \
	"$uploads" "$eu" "$gu" "$(ratio "$eu" "$gu")"
printf '  the E2B path from Go: POST /files as files.write sends it, %.0f ms; /Go Files.WriteFile %s; E2B files.write/it %s\n' \
	"$cu" "$(ratio "$cu" "$gu")" "$(ratio "$eu" "$cu")"
