#!/usr/bin/env bash
# measure.sh NAME N BASE RUN: callgrind of a single-user backend running 200 warm-up pairs then N pairs; prints total Ir
# (CG_LEASE=token: every begin_effect under one token lease taken first, as a fleet's workers call; default: the
# session's lease, taken by the first call; CG_LEASE=take: a pair is a new run's take_lease and its release_lease,
# as a fleet's run of calls begins and ends, and its two lines count the takes and releases that returned true)
set -euo pipefail
name=$1 n=$2 base=$3 run=${4:-cgrun}; copy=${CG_WORK:-/tmp/dl-callgrind}/$name; bin=$copy/usr/lib/postgresql/15/bin
take= lease_arg=
case ${CG_LEASE:-session} in
session) ;;
token) take="SELECT set_config('dl.token', (durable_ledger.take_lease('$run', '1 day')).token, false)"
	lease_arg=", lease => current_setting('dl.token')" ;;
take) ;;
*) echo "measure.sh: CG_LEASE is session, token or take" >&2; exit 1 ;;
esac

if [ "${CG_LEASE:-session}" = take ]; then
	{ echo "PREPARE t(text) AS SELECT set_config('dl.token', (durable_ledger.take_lease(\$1, '1 day')).token, false) IS NOT NULL AS taken"
	  echo "PREPARE r AS SELECT durable_ledger.release_lease(current_setting('dl.token')) AS released"
	  for g in $(seq "$base" $((base + 200 + n - 1))); do echo "EXECUTE t('$run-$g')"; echo "EXECUTE r"; done
	} > $copy/in2.sql
	out=$copy/cg.$n.$base.out
	runuser -u postgres -- valgrind --tool=callgrind --callgrind-out-file=$out $bin/postgres --single -D $copy/data postgres < $copy/in2.sql > $copy/out.$n.$base.txt 2>$copy/vg.$n.$base.log
	grep -c 'taken = "t"' $copy/out.$n.$base.txt || true
	grep -c 'released = "t"' $copy/out.$n.$base.txt || true
	grep -E '^(summary|totals):' $out
	exit 0
fi

runuser -u postgres -- $bin/postgres --single -D $copy/data postgres >/dev/null 2>&1 <<SQL
COPY (SELECT l FROM (SELECT jsonb_build_object('invoice', g, 'amount', 4200, 'currency', 'USD') a, g FROM generate_series($base, $base + 200 + $n - 1) g) s, LATERAL (VALUES (1, format('EXECUTE b(%L, %L)', '$run', a)), (2, format('EXECUTE c(%L)', durable_ledger.effect_key('$run', 'bank.pay', a, 1)))) v(o, l) ORDER BY g, o) TO '$copy/in.sql'
SQL
cd $copy
{ [ -z "$take" ] || echo "$take"
  echo "PREPARE b(text, jsonb) AS SELECT (durable_ledger.begin_effect(\$1, 'bank.pay', \$2$lease_arg)).decision"
  echo "PREPARE c(text) AS SELECT (durable_ledger.complete_effect(\$1, '{\"payment_id\": \"pay_1\"}')).status"
  cat $copy/in.sql; } > $copy/in2.sql
out=$copy/cg.$n.$base.out
runuser -u postgres -- valgrind --tool=callgrind --callgrind-out-file=$out $bin/postgres --single -D $copy/data postgres < $copy/in2.sql > $copy/out.$n.$base.txt 2>$copy/vg.$n.$base.log
grep -c execute $copy/out.$n.$base.txt || true
grep -c completed $copy/out.$n.$base.txt || true
grep -E '^(summary|totals):' $out
