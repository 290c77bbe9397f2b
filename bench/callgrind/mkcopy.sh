#!/usr/bin/env bash
# mkcopy.sh NAME SRC: private PG install copy at ${CG_WORK:-/tmp/dl-callgrind}/NAME with the extension built from SRC (a dir)
set -euo pipefail
name=$1 src=$2
real_bindir=$(pg_config --bindir)
major=$(basename "$(dirname "$real_bindir")")
prefix=$(cd "$real_bindir/../../../.." && pwd)
copy=${CG_WORK:-/tmp/dl-callgrind}/$name
rm -rf "$copy"; mkdir -p "$copy/usr/lib/postgresql" "$copy/usr/share/postgresql" "$copy/usr/include" "$copy/src"
chmod 755 "${CG_WORK:-/tmp/dl-callgrind}" "$copy"
cp -a "$prefix/lib/postgresql/$major" "$copy/usr/lib/postgresql/"
cp -a "$prefix/share/postgresql/$major" "$copy/usr/share/postgresql/"
ln -s "$prefix/include/postgresql" "$copy/usr/include/postgresql"
rm -f "$copy/usr/share/postgresql/$major/extension/durable_ledger"* "$copy/usr/lib/postgresql/$major/lib/durable_ledger.so"
rm -rf "$copy/usr/lib/postgresql/$major/lib/bitcode/durable_ledger"*
(cd "$src" && tar -cf - Makefile durable_ledger.control durable_ledger--*.sql src schema docs) | tar -x -C "$copy/src"
make -s -C "$copy/src" clean >/dev/null 2>&1 || true
make -s -C "$copy/src" PG_CONFIG="$copy/usr/lib/postgresql/$major/bin/pg_config" install >"$copy/build.log" 2>&1 || { cat "$copy/build.log"; exit 1; }
echo built $copy
