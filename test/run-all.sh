#!/usr/bin/env bash
# Runs every test suite of durable_ledger, each in a throwaway PostgreSQL
# cluster of its own, and ends with one line "N passed, M failed".
#
# Clusters run as the invoking user, or as the "postgres" OS user when invoked
# as root (initdb and postgres refuse root).  Nothing is left behind.
set -uo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}
bindir=$("$PG_CONFIG" --bindir)
pgxs_dir=$(dirname "$("$PG_CONFIG" --pgxs)")/../..
pg_regress=$pgxs_dir/src/test/regress/pg_regress

make -s -C "$top" install >/dev/null || { echo "make install failed"; echo "0 passed, 1 failed"; exit 1; }
# the JavaScript client's one dependency (node-postgres), from the lock file
(cd "$top/clients/js" && npm ci --no-audit --no-fund --silent) ||
	{ echo "npm ci in clients/js failed"; echo "0 passed, 1 failed"; exit 1; }

work=$(mktemp -d /tmp/durable_ledger_tests.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$top/sql" "$top/expected" "$top/test" "$top/demo" "$top/clients" "$top/README.md" "$work/"

if [ "$(id -u)" = 0 ]; then
	chown -R postgres: "$work"
	as_cluster_user() { runuser -u postgres -- "$@"; }
else
	as_cluster_user() { "$@"; }
fi
# Every suite runs from the copy, a directory the cluster user can enter: the
# clone may sit where only root can (under /root, mode 0700), and programs the
# suites start as that user (psql in TAP's poll_query_until) would otherwise
# fail to change into their working directory.
cd "$work"

passed=0
failed=0

# Adds the "... ok" / "... FAILED" lines of a pg_regress-style log to the totals.
count_results() {
	local log=$1 ok bad
	ok=$(grep -cE '\.\.\. ok' "$log")
	bad=$(grep -cE '\.\.\. FAILED|\.\.\. failed' "$log")
	passed=$((passed + ok))
	failed=$((failed + bad))
}

run_suite() {
	local name=$1
	shift
	echo "== $name"
	as_cluster_user "$@" >"$work/$name.log" 2>&1
	local rc=$?
	cat "$work/$name.log"
	count_results "$work/$name.log"
	if [ $rc -ne 0 ]; then
		for diffs in "$work"/*/regression.diffs; do
			[ -f "$diffs" ] && { echo "---- $diffs"; cat "$diffs"; }
		done
		# a suite that failed without reporting a failed test still counts
		grep -qE '\.\.\. (FAILED|failed)' "$work/$name.log" || failed=$((failed + 1))
	fi
}

regress_tests=$(make -s -C "$top" print-REGRESS)
run_suite regression "$pg_regress" \
	--temp-instance="$work/regress-instance" \
	--bindir="$bindir" \
	--inputdir="$work" \
	--outputdir="$work/regress" \
	--encoding=UTF8 \
	--load-extension=pgcrypto --load-extension=dblink \
	$regress_tests

isolation_tests=$(make -s -C "$top" print-ISOLATION)
run_suite isolation "$pgxs_dir/src/test/isolation/pg_isolation_regress" \
	--temp-instance="$work/isolation-instance" \
	--bindir="$bindir" \
	--inputdir="$work/test" \
	--outputdir="$work/isolation" \
	--encoding=UTF8 \
	--load-extension=durable_ledger \
	$isolation_tests

# TAP: what SQL cannot show (memory over a long workload; later crashes,
# restarts, dump and restore).  Each test makes and removes its own cluster.
count_tap() {
	local log=$1 ok bad
	ok=$(grep -cE '^ok [0-9]+' "$log")
	bad=$(grep -cE '^not ok [0-9]+' "$log")
	passed=$((passed + ok))
	failed=$((failed + bad))
}
echo "== tap"
as_cluster_user env PATH="$bindir:$PATH" TESTDIR="$work" \
	PG_REGRESS="$pg_regress" PERL5LIB="$pgxs_dir/src/test/perl" \
	prove -v "$work"/test/t/*.pl >"$work/tap.log" 2>&1
tap_rc=$?
cat "$work/tap.log"
count_tap "$work/tap.log"
if [ $tap_rc -ne 0 ] && ! grep -qE '^not ok [0-9]+' "$work/tap.log"; then
	failed=$((failed + 1))
	for log in "$work"/tmp_check/log/*; do
		[ -f "$log" ] && { echo "---- $log"; tail -n 50 "$log"; }
	done
fi

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
