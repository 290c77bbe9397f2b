#!/usr/bin/env bash
# make test: every test suite of durable_ledger, with PGXS's own targets, in
# throwaway clusters, ending with one line "N passed, M failed".
#
#   make installcheck       regression and isolation, against a throwaway
#                           cluster this script starts and removes
#   make prove_installcheck TAP (test/t/): each test makes its own clusters
#   make check-clients      the clients', demo's, cookbook's and console's tests (test/apps/)
#   test/check-layers.py    src/ calls only downwards
#   test/check-links.py     every relative link of the Markdown resolves
#   test/check-bench.py     the arithmetic that decides what make bench's rows say
#
# The suites run from a copy of the tree that the cluster user can enter
# (the clone may sit where only root can, under /root); clusters run as the
# invoking user, or as the "postgres" OS user when invoked as root (initdb
# and postgres refuse root).  Nothing is left behind.
set -uo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}
bindir=$("$PG_CONFIG" --bindir)

make -s -C "$top" install >/dev/null && make -s -C "$top/proxy" install >/dev/null ||
	{ echo "make install failed"; echo "0 passed, 1 failed"; exit 1; }
# the npm packages' dependencies, from their lock files: the JavaScript client
# first (the agent-framework adapters, adapters/*, link to it), the console
for package in $("$top/test/npm-packages.sh"); do
	(cd "$top/$package" && npm ci --no-audit --no-fund --silent) ||
		{ echo "npm ci in $package failed"; echo "0 passed, 1 failed"; exit 1; }
done

work=$(mktemp -d /tmp/durable_ledger_tests.XXXXXX)
port=$((20000 + RANDOM % 10000))
if [ "$(id -u)" = 0 ]; then
	as_cluster_user() { runuser -u postgres -- "$@"; }
else
	as_cluster_user() { "$@"; }
fi
stop_cluster() {
	[ -f "$work/data/postmaster.pid" ] &&
		as_cluster_user "$bindir/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1
}
trap 'stop_cluster; rm -rf "$work"' EXIT

tree="$work/tree"
mkdir "$tree"
(cd "$top" && cp -r Makefile durable_ledger.control sql expected test demo clients console adapters docs monitoring README.md "$tree/")
[ "$(id -u)" = 0 ] && chown -R postgres: "$work"
# Every suite runs from the copy, a directory the cluster user can enter:
# programs the suites start as that user (psql in TAP's poll_query_until)
# would otherwise fail to change into their working directory.
cd "$tree"

passed=0
failed=0

# Adds a log's "... ok" / "... FAILED" lines (pg_regress) and "ok N" / "not
# ok N" lines (TAP) to the totals; a suite that failed without saying which
# test failed counts as one failure.
run_suite() {
	local name=$1 rc ok bad
	shift
	echo "== $name"
	"$@" >"$work/$name.log" 2>&1
	rc=$?
	cat "$work/$name.log"
	ok=$(grep -cE '\.\.\. ok|^ok [0-9]+' "$work/$name.log")
	bad=$(grep -cE '\.\.\. (FAILED|failed)|^not ok [0-9]+' "$work/$name.log")
	passed=$((passed + ok))
	failed=$((failed + bad))
	if [ $rc -ne 0 ]; then
		[ "$bad" -eq 0 ] && failed=$((failed + 1))
		for diffs in "$tree/regression.diffs" "$tree/output_iso/regression.diffs"; do
			[ -f "$diffs" ] && { echo "---- $diffs"; cat "$diffs"; }
		done
		for log in "$tree"/tmp_check/log/*; do
			[ -f "$log" ] && { echo "---- $log"; tail -n 50 "$log"; }
		done
	fi
	return 0
}

# the server for installcheck: dblink connects back to it through the
# environment it was started with; the durability suite prepares transactions
as_cluster_user "$bindir/initdb" -D "$work/data" -A trust -U postgres >/dev/null &&
	{
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$work'"
		echo "port = $port"
		echo "max_prepared_transactions = 2"
	} | as_cluster_user tee -a "$work/data/postgresql.conf" >/dev/null &&
	as_cluster_user env PGHOST="$work" PGPORT="$port" \
		"$bindir/pg_ctl" -D "$work/data" -l "$work/server.log" -w start >/dev/null ||
	{ cat "$work/server.log" 2>/dev/null; echo "could not start a cluster"; echo "0 passed, 1 failed"; exit 1; }

run_suite installcheck as_cluster_user env PGHOST="$work" PGPORT="$port" PGUSER=postgres \
	make -s installcheck TAP_TESTS=
stop_cluster

run_suite tap as_cluster_user env PATH="$bindir:$PATH" make -s prove_installcheck PROVE_FLAGS=-v
run_suite apps as_cluster_user env PATH="$bindir:$PATH" make -s check-clients PROVE_FLAGS=-v
run_suite layers /usr/bin/python3 "$top/test/check-layers.py" "$top/src"
run_suite links /usr/bin/python3 "$top/test/check-links.py" "$top"
run_suite bench /usr/bin/python3 "$top/test/check-bench.py" "$top"

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
