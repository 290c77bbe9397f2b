#!/usr/bin/env bash
# bench/before-cluster.sh REV PORT: a second bench cluster running the
# library as it was at commit REV, for the access section of bench/bench.py
# and the sections --before measures (the same run measures the ledger before
# and after a change, each against its own floor).
#
# The library of REV is built from `git archive REV` into a private copy of
# the PostgreSQL installation (PostgreSQL's binaries find their share and lib
# folders relative to themselves), so that the installed extension is left
# alone.  The cluster gets bench/settings.sh's settings.  Prints one line,
# "dsn=...", when it is up, then waits for its standard input to close and
# removes the cluster and the copy.
set -euo pipefail

rev=$1 port=$2
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/test/throwaway-cluster.sh"
. "$top/bench/settings.sh"

# Debian's layout: PREFIX/lib/postgresql/N/bin, PREFIX/share/postgresql/N,
# PREFIX/include/postgresql
real_bindir=$("${PG_CONFIG:-pg_config}" --bindir)
major=$(basename "$(dirname "$real_bindir")")
prefix=$(cd "$real_bindir/../../../.." && pwd)
copy=$(mktemp -d /tmp/durable_ledger_before.XXXXXX)
chmod 755 "$copy"
trap 'rm -rf "$copy"' EXIT
mkdir -p "$copy/usr/lib/postgresql" "$copy/usr/share/postgresql" "$copy/usr/include" "$copy/src"
cp -a "$prefix/lib/postgresql/$major" "$copy/usr/lib/postgresql/"
cp -a "$prefix/share/postgresql/$major" "$copy/usr/share/postgresql/"
ln -s "$prefix/include/postgresql" "$copy/usr/include/postgresql"
# the installed extension's files go first: a script of a later version that
# REV did not have (a fresh durable_ledger--1.3.sql, say) would be chosen by
# CREATE EXTENSION over REV's own upgrade path
rm -f "$copy/usr/share/postgresql/$major/extension/durable_ledger"* \
	"$copy/usr/lib/postgresql/$major/lib/durable_ledger.so"
rm -rf "$copy/usr/lib/postgresql/$major/lib/bitcode/durable_ledger"*
git -C "$top" archive "$rev" | tar -x -C "$copy/src"
export PG_CONFIG=$copy/usr/lib/postgresql/$major/bin/pg_config
make -s -C "$copy/src" PG_CONFIG="$PG_CONFIG" install >"$copy/build.log" 2>&1 ||
	{ cat "$copy/build.log" >&2; exit 1; }

start_throwaway_cluster before "$port" "${bench_settings[@]}"
trap 'as_cluster_user "$bindir/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$work" "$copy"' EXIT
echo "dsn=$dsn"
echo "src=$copy/src"  # REV's tree, whose clients the clients and fleet sections run
cat >/dev/null
