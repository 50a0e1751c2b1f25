# Shared helpers of the bench scripts (sourced, not run).
# Every process started here is recorded by PID and stopped by bench_cleanup;
# every file lives under one mktemp -d directory that is removed at exit
# (kept when BENCH_KEEP=1, for reading the member logs).

BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_PIDS=()
BENCH_TMP=""

log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }

need() { # need CMD HOW-TO-INSTALL
	command -v "$1" >/dev/null 2>&1 || die "$1 is not installed; install it with: $2"
}

bench_cleanup() {
	local rc=$? pid i
	trap - EXIT INT TERM
	for pid in "${BENCH_PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${BENCH_PIDS[@]}"; do
		for i in $(seq 1 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			log "process $pid did not stop on SIGTERM within 5s; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
		wait "$pid" 2>/dev/null || true
	done
	if [[ -n "${BENCH_PAGE_REPORTING_ORDER:-}" ]]; then
		echo "$BENCH_PAGE_REPORTING_ORDER" >"$PAGE_REPORTING_ORDER" || log "page_reporting_order not put back to $BENCH_PAGE_REPORTING_ORDER"
	fi
	if [[ -n "$BENCH_TMP" && -d "$BENCH_TMP" ]]; then
		if [[ "${BENCH_KEEP:-0}" == 1 ]]; then
			log "kept $BENCH_TMP (BENCH_KEEP=1)"
		else
			rm -rf "$BENCH_TMP"
		fi
	fi
	exit "$rc"
}

bench_init() {
	BENCH_TMP=$(mktemp -d "${TMPDIR:-/tmp}/kibotos-bench.XXXXXX")
	mkdir -p "$BENCH_TMP/bin" "$BENCH_TMP/logs"
	trap bench_cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

# host_page_reporting: with BENCH_PAGE_REPORTING=off, pause this host's
# free page reporting for the run; bench_cleanup puts it back. A VM host
# with it (these machines: virtio-balloon free page reporting) hands the
# memory a process freed back to its hypervisor after about a second, and
# touching that memory again costs several times more: a VM restore's
# load then measures the hypervisor (150-300 ms within a second of the
# previous VM's exit, 550-1,160 ms after a few seconds). A host without a
# hypervisor underneath does not do this.
PAGE_REPORTING_ORDER=/sys/module/page_reporting/parameters/page_reporting_order
host_page_reporting() {
	[[ "${BENCH_PAGE_REPORTING:-on}" == off ]] || return 0
	[[ -w "$PAGE_REPORTING_ORDER" ]] || die "BENCH_PAGE_REPORTING=off: $PAGE_REPORTING_ORDER is not writable (no free page reporting here, or not root)"
	BENCH_PAGE_REPORTING_ORDER=$(cat "$PAGE_REPORTING_ORDER")
	# Above the largest block the page allocator has: nothing is reported.
	echo 11 >"$PAGE_REPORTING_ORDER"
	log "free page reporting paused for this run (page_reporting_order $BENCH_PAGE_REPORTING_ORDER -> 11)"
}

# start_bg NAME CMD ARGS...: run in the background, output to logs/NAME.log.
start_bg() {
	local name=$1
	shift
	"$@" >"$BENCH_TMP/logs/$name.log" 2>&1 &
	BENCH_PIDS+=("$!")
	eval "PID_${name//[^A-Za-z0-9_]/_}=$!"
}

# stop_pid PID [SIGNAL [SECONDS]]: stop one process started by start_bg
# (SIGTERM, SIGKILL after 5 s unless told otherwise) and forget it.
stop_pid() {
	local pid=$1 sig=${2:-TERM} secs=${3:-5} i keep=()
	kill -"$sig" "$pid" 2>/dev/null || true
	for i in $(seq 1 $((secs * 10))); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	for i in "${BENCH_PIDS[@]}"; do [[ "$i" == "$pid" ]] || keep+=("$i"); done
	BENCH_PIDS=("${keep[@]}")
}

# wait_until SECONDS WHAT CMD...: retry CMD every 0.2 s until it succeeds.
wait_until() {
	local secs=$1 what=$2
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || die "timed out after ${secs}s waiting for $what (logs: $BENCH_TMP/logs, rerun with BENCH_KEEP=1 to keep them)"
		sleep 0.2
	done
}

build_bins() {
	need go "the Go toolchain (go 1.26)"
	log "building kibotos and loadgen"
	(cd "$BENCH_ROOT" && go build -o "$BENCH_TMP/bin/kibotos" . && go build -o "$BENCH_TMP/bin/loadgen" ./bench/loadgen) ||
		die "build failed"
	if [[ -n "${BENCH_PPROF_DIR:-}" ]]; then
		# Same product code, plus net/http/pprof on member port + 5.
		(cd "$BENCH_ROOT" && go build -o "$BENCH_TMP/bin/kibotos" ./bench/kibotos-pprof) || die "build failed"
		mkdir -p "$BENCH_PPROF_DIR"
	fi
	ln -sf kibotos "$BENCH_TMP/bin/kibo"
	BENCH_REV=$(cd "$BENCH_ROOT" && git describe --always --dirty 2>/dev/null || echo unknown)
	KIBOTOS="$BENCH_TMP/bin/kibotos"
	KIBO="$BENCH_TMP/bin/kibo"
	LOADGEN="$BENCH_TMP/bin/loadgen"
}

# --- kibotos cluster ------------------------------------------------------

KIB_DIRS=()
KIB_ADDRS=()
KIB_PIDS=()
KIB_API_ADDRS=() # the API listeners, when KIB_API is set

# kib_cluster_ready N: every member knows the same leader (so each one is in
# the Raft configuration: a member that is not gets no heartbeats and knows
# no leader) and node list shows N nodes, all READY.
kib_cluster_ready() {
	local n=$1 d leader="" l
	for d in "${KIB_DIRS[@]}"; do
		l=$("$KIBO" status --json --data-dir "$d" | jq -er '.result.leader | select(. != "")') || return 1
		[[ -z "$leader" || "$leader" == "$l" ]] || return 1
		leader=$l
	done
	"$KIBO" node list --json --data-dir "${KIB_DIRS[0]}" |
		jq -e --argjson n "$n" '.result.nodes | length == $n and all(.status == "READY")'
}

# kib_cluster N BASE_PORT: a cluster of N ctrl,node members on loopback at
# BASE_PORT, BASE_PORT+10, ... (gossip uses each port + 1).
kib_cluster() {
	local n=$1 base=$2 i dir addr tok
	for i in $(seq 1 "$n"); do
		dir="$BENCH_TMP/kibotos/m$i"
		addr="127.0.0.1:$((base + (i - 1) * 10))"
		if ((i == 1)); then
			"$KIBOTOS" init --data-dir "$dir" --advertise "$addr" --node-id m1 >/dev/null
		else
			tok=$("$KIBO" enrollment grant "m$i" --roles ctrl,node --data-dir "${KIB_DIRS[0]}" 2>/dev/null)
			"$KIBOTOS" join --data-dir "$dir" --advertise "$addr" --grant "$tok" "${KIB_ADDRS[0]}" >/dev/null
		fi
		local conf=()
		if [[ -n "${KIB_API:-}" ]]; then
			# The API for applications (API keys) on port +7, rate limits
			# far above any load these scripts make.
			printf '[api]\nlisten = "127.0.0.1:%d"\nrate = 1000000\nburst = 1000000\n' $((base + (i - 1) * 10 + 7)) >"$BENCH_TMP/kibotos/m$i.toml"
			conf=(--config "$BENCH_TMP/kibotos/m$i.toml")
			KIB_API_ADDRS+=("127.0.0.1:$((base + (i - 1) * 10 + 7))")
		fi
		start_bg "kibotos-m$i" env KIBOTOS_PPROF="${BENCH_PPROF_DIR:+127.0.0.1:$((base + (i - 1) * 10 + 5))}" \
			"$KIBOTOS" serve --data-dir "$dir" --log-level warn "${conf[@]}"
		KIB_PIDS+=("$!")
		KIB_DIRS+=("$dir")
		KIB_ADDRS+=("$addr")
		wait_until 60 "kibotos member m$i to serve" "$KIBO" status --json --data-dir "$dir"
		((i > 1)) || wait_until 60 "kibotos m1 to lead" kib_cluster_ready 1
	done
	wait_until 120 "kibotos cluster of $n with a leader and all nodes READY" kib_cluster_ready "$n"
	log "kibotos cluster ready: ${KIB_ADDRS[*]}"
}

# kib_profile NAME SECONDS: CPU profiles of every member into BENCH_PPROF_DIR
# (in the background; only when BENCH_PPROF_DIR is set).
kib_profile() {
	[[ -n "${BENCH_PPROF_DIR:-}" ]] || return 0
	local name=$1 secs=$2 i port
	for i in "${!KIB_ADDRS[@]}"; do
		port=$((${KIB_ADDRS[$i]##*:} + 5))
		curl -sf -o "$BENCH_PPROF_DIR/$name-m$((i + 1)).cpu.pprof" \
			"http://127.0.0.1:$port/debug/pprof/profile?seconds=$secs" &
		BENCH_PIDS+=("$!")
	done
}

# cpu_idle_pct: percent of CPU time idle over the next second (all cores).
cpu_idle_pct() {
	local a b
	read -ra a < <(head -1 /proc/stat)
	sleep 1
	read -ra b < <(head -1 /proc/stat)
	local total=0 i
	for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
	local idle=$((b[4] - a[4] + b[5] - a[5]))
	echo $((total > 0 ? idle * 100 / total : 100))
}

# wait_quiet: before a measurement, wait up to BENCH_QUIET_WAIT seconds
# (default 60) for the machine to be at least BENCH_QUIET_IDLE % idle
# (default 80) so a build or test running beside the benchmark does not
# skew it; goes on with a warning otherwise.
wait_quiet() {
	local deadline=$((SECONDS + ${BENCH_QUIET_WAIT:-60})) idle
	while :; do
		idle=$(cpu_idle_pct)
		((idle >= ${BENCH_QUIET_IDLE:-80})) && { log "machine ${idle}% idle"; return 0; }
		if ((SECONDS >= deadline)); then
			log "warning: machine only ${idle}% idle before the run: other processes are using the CPU and the figures will be low"
			return 0
		fi
		sleep 2
	done
}

# cpu_ticks PID...: user+system CPU time of the processes, in clock ticks.
cpu_ticks() {
	local pid t=0 v
	for pid in "$@"; do
		# Fields after the command name: 14 utime and 15 stime are $12 and $13.
		v=$(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}') || v=0
		t=$((t + v))
	done
	echo "$t"
}

# machine_ticks: "BUSY TOTAL" clock ticks of all CPUs since boot (/proc/stat).
machine_ticks() {
	awk '/^cpu / {t = 0; for (i = 2; i <= 9; i++) t += $i; print t - $5 - $6, t; exit}' /proc/stat
}
