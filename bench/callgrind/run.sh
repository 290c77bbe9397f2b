#!/usr/bin/env bash
# run.sh [SRC]: instructions per begin+complete pair (bench/README.md, "CPU per pair"):
# a private copy of PostgreSQL with the extension built from SRC (default: this tree), a
# single-user backend under callgrind running 200 warm-up pairs then 500, then a fresh
# backend running 2,500; prints the difference over 2,000.  As root; needs valgrind.
# CG_LEASE=token: every begin_effect under a token lease; CG_LEASE=take: a pair is a new run's
# take_lease and release_lease (measure.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-$(cd "$here/../.." && pwd)}
export CG_WORK=${CG_WORK:-/tmp/dl-callgrind}
mkdir -p "$CG_WORK"
"$here/mkcopy.sh" pair "$src" >/dev/null
"$here/init.sh" pair >/dev/null
# measure.sh prints the backend's executions and completions, then callgrind's total:
# every pair (200 warm-up ones included) must have been executed and completed, or the
# count is of something else (a setup statement that failed, a replay)
# (count runs in a command substitution, where set -e does not reach: every failure exits
# by hand, and the caller's assignment then stops the script)
count() {
	local out pairs=$(($1 + 200)) executed completed total
	out=$("$here/measure.sh" pair "$1" "$2" "$3") || { echo "callgrind: measure.sh $1 failed" >&2; exit 1; }
	executed=$(sed -n 1p <<<"$out") completed=$(sed -n 2p <<<"$out")
	if [ "$executed" != "$pairs" ] || [ "$completed" != "$pairs" ]; then
		echo "callgrind: $pairs pairs sent, $executed executed and $completed completed (see $CG_WORK/pair/out.$1.$2.txt)" >&2
		exit 1
	fi
	total=$(awk '/^(summary|totals):/ {print $2; exit}' <<<"$out")
	[[ $total =~ ^[0-9]+$ ]] || { echo "callgrind: no total in measure.sh $1's output" >&2; exit 1; }
	echo "$total"
}
small=$(count 500 1 cg-small)
large=$(count 2500 100000 cg-large)
what=pair; [ "${CG_LEASE:-session}" != take ] || what=take+release
echo "instructions per $what: $(( (large - small) / 2000 ))  (500 pairs: $small, 2500 pairs: $large)"
