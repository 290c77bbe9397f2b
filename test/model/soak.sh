#!/usr/bin/env bash
# make soak: the model check (test/model/run.py) with fresh seeds, for
# SOAK_MINUTES (default 60), on a throwaway cluster.  Every history that
# disagrees with the model is kept, shrunk, in test/model/regressions/, which
# test/t/025_model.pl replays from then on.  Ends with "N passed, M failed".
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/test/throwaway-cluster.sh"
install_extension "$top"
start_throwaway_cluster model_soak $((30000 + RANDOM % 10000)) "max_connections = 50" "shared_preload_libraries = 'durable_ledger'"
set +e
/usr/bin/python3 "$top/test/model/run.py" --dsn "$dsn" --minutes "${SOAK_MINUTES:-60}" \
	--examples "${SOAK_EXAMPLES:-200}" --steps "${SOAK_STEPS:-50}" \
	--keep "$top/test/model/regressions" | tee "$work/soak.log"
rc=${PIPESTATUS[0]}
echo "$(grep -c '^ok ' "$work/soak.log") passed, $(grep -c '^not ok ' "$work/soak.log") failed"
exit "$rc"
