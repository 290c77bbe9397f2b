#!/usr/bin/env bash
# init.sh NAME: cluster for copy NAME at ${CG_WORK:-/tmp/dl-callgrind}/NAME/data
set -euo pipefail
name=$1; copy=${CG_WORK:-/tmp/dl-callgrind}/$name; bin=$copy/usr/lib/postgresql/15/bin
chown -R postgres: $copy
rm -rf $copy/data
runuser -u postgres -- $bin/initdb -D $copy/data -A trust -U postgres >/dev/null
cat >> $copy/data/postgresql.conf <<CONF
shared_buffers = 256MB
fsync = off
shared_preload_libraries = 'durable_ledger'
CONF
runuser -u postgres -- $bin/postgres --single -D $copy/data postgres >/dev/null 2>&1 <<SQL
CREATE EXTENSION durable_ledger
SELECT durable_ledger.register_tool('bank.pay', 'bench', divergence => 'off', note => 'cg')
SQL
echo init $name
