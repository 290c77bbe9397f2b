#!/usr/bin/env bash
# The demo: installs what it needs, builds and installs durable_ledger, starts
# a throwaway PostgreSQL cluster (as the postgres OS user when run as root),
# tells the story in demo/demo.py with real worker processes, and removes the
# cluster.  `make demo` runs this script.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)

if [ "$(id -u)" = 0 ]; then
	"$top/test/install-deps.sh" >/dev/null
fi
make -s -C "$top" install >/dev/null

PG_CONFIG=${PG_CONFIG:-pg_config}
bindir=$("$PG_CONFIG" --bindir)
work=$(mktemp -d /tmp/durable_ledger_demo.XXXXXX)
chmod 755 "$work"

if [ "$(id -u)" = 0 ]; then
	chown postgres: "$work"
	as_cluster_user() { runuser -u postgres -- "$@"; }
else
	as_cluster_user() { "$@"; }
fi

cleanup() {
	as_cluster_user "$bindir/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

echo "Starting a throwaway PostgreSQL cluster in $work ..."
as_cluster_user "$bindir/initdb" -D "$work/data" -A trust -U postgres >/dev/null
as_cluster_user "$bindir/pg_ctl" -D "$work/data" -l "$work/server.log" -w \
	-o "-c listen_addresses='' -c unix_socket_directories='$work' -c port=5433" start >/dev/null
dsn="host=$work port=5433 dbname=postgres user=postgres"
as_cluster_user "$bindir/psql" -X -q -d "$dsn" -c 'CREATE EXTENSION durable_ledger' >/dev/null

/usr/bin/python3 "$top/demo/demo.py" --dsn "$dsn"
echo "Removing the throwaway cluster."
