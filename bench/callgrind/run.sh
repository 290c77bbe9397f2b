#!/usr/bin/env bash
# run.sh [SRC]: instructions per begin+complete pair (bench/README.md, "CPU per pair"):
# a private copy of PostgreSQL with the extension built from SRC (default: this tree), a
# single-user backend under callgrind running 200 warm-up pairs then 500, then a fresh
# backend running 2,500; prints the difference over 2,000.  As root; needs valgrind.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-$(cd "$here/../.." && pwd)}
export CG_WORK=${CG_WORK:-/tmp/dl-callgrind}
mkdir -p "$CG_WORK"
"$here/mkcopy.sh" pair "$src" >/dev/null
"$here/init.sh" pair >/dev/null
small=$("$here/measure.sh" pair 500 1 cg-small | awk '/^(summary|totals):/ {print $2; exit}')
large=$("$here/measure.sh" pair 2500 100000 cg-large | awk '/^(summary|totals):/ {print $2; exit}')
echo "instructions per pair: $(( (large - small) / 2000 ))  (500 pairs: $small, 2500 pairs: $large)"
