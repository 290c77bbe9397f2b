#!/usr/bin/env bash
# make bench: builds and installs durable_ledger, starts a throwaway cluster
# tuned like a small production server, runs bench/bench.py, and removes the
# cluster.  Not part of the test run.  Extra arguments go to bench.py
# (e.g. --seconds 20 --rounds 5 --big 500000).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] && "$top/test/install-deps.sh" >/dev/null
make -s -C "$top" install >/dev/null

bindir=$(pg_config --bindir)
work=$(mktemp -d /tmp/durable_ledger_bench.XXXXXX)
chmod 755 "$work"
if [ "$(id -u)" = 0 ]; then
	chown postgres: "$work"
	as_cluster_user() { runuser -u postgres -- "$@"; }
else
	as_cluster_user() { "$@"; }
fi
cleanup() {
	as_cluster_user "$bindir/pg_ctl" -D "$work/data" -m fast stop >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

as_cluster_user "$bindir/initdb" -D "$work/data" -A trust -U postgres >/dev/null
cat >>"$work/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$work'
port = 5434
max_connections = 100
shared_buffers = 1GB
max_wal_size = 8GB
checkpoint_timeout = 30min
synchronous_commit = on
fsync = on
CONF
as_cluster_user "$bindir/pg_ctl" -D "$work/data" -l "$work/server.log" -w start >/dev/null
dsn="host=$work port=5434 dbname=postgres user=postgres"
as_cluster_user "$bindir/psql" -X -q -d "$dsn" -c 'CREATE EXTENSION durable_ledger' >/dev/null

/usr/bin/python3 "$top/bench/bench.py" --dsn "$dsn" --pgbench "$bindir/pgbench" "$@"
