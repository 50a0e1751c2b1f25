#!/usr/bin/env bash
# compare.sh REF PKG PATTERN [ROUNDS] [BENCHTIME]
#
# Runs the Go benchmarks of PKG matching PATTERN on the build at REF (a
# commit of this repository) and on this work tree, alternating ROUNDS
# times (default 5) so that both see the same machine, and prints for
# every benchmark and metric the medians and the ratio this/REF. A metric
# where lower is better (ns/op, ms, B/op) is better below 1.0; a rate
# (…/s) above.
#
#	bench/compare.sh ee48c54 ./fsm 'ApplyBatchCommands|PlaceWorkspaces|CreateToAvailable'
#	bench/compare.sh ee48c54 ./agent/runtime PauseResume 3 3x
set -euo pipefail
source "$(dirname "$0")/lib.sh"

ref=${1:?usage: compare.sh REF PKG PATTERN [ROUNDS] [BENCHTIME]}
pkg=${2:?package, e.g. ./fsm}
pattern=${3:?benchmark pattern}
rounds=${4:-5}
benchtime=${5:-1s}

bench_init
git -C "$BENCH_ROOT" rev-parse --verify -q "$ref^{commit}" >/dev/null || die "$ref is not a commit of $BENCH_ROOT"
mkdir "$BENCH_TMP/ref"
git -C "$BENCH_ROOT" archive "$ref" | tar -x -C "$BENCH_TMP/ref"
log "building $pkg's tests at $ref and in this work tree"
(cd "$BENCH_TMP/ref" && go test -c -o "$BENCH_TMP/ref.test" "$pkg")
(cd "$BENCH_ROOT" && go test -c -o "$BENCH_TMP/this.test" "$pkg")

# A test binary runs in its package's directory (testdata, fixtures).
run() { # run WHICH SRCROOT
	(cd "$2/$pkg" && "$BENCH_TMP/$1.test" -test.run '^$' -test.bench "$pattern" -test.benchtime "$benchtime" -test.count 1) |
		awk -v which="$1" '/^Benchmark/ { for (i = 3; i < NF; i += 2) print which, $1, $(i+1), $i }' >>"$BENCH_TMP/results"
}
for i in $(seq 1 "$rounds"); do
	log "round $i of $rounds"
	run ref "$BENCH_TMP/ref"
	run this "$BENCH_ROOT"
done

# results: which benchmark unit value; medians per (benchmark, unit).
printf '%-44s %-14s %14s %14s %8s\n' benchmark unit "$ref" this ratio
sort -k2,2 -k3,3 -k1,1 -k4,4g "$BENCH_TMP/results" | awk '
	function median(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
	function flush() {
		if (key == "") return
		r = median(ref, nr); t = median(this, nt)
		printf "%-44s %-14s %14.4g %14.4g %8.3f\n", bench, unit, r, t, (r ? t / r : 0)
	}
	{
		k = $2 " " $3
		if (k != key) { flush(); key = k; bench = $2; unit = $3; nr = 0; nt = 0 }
		if ($1 == "ref") ref[++nr] = $4; else this[++nt] = $4
	}
	END { flush() }'
