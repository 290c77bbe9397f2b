#!/usr/bin/env bash
# `make console`: the operator console.
#
#   console/run.sh                      a throwaway cluster holding the demo's
#                                       story, with SCRAM logins for an admin
#                                       and an auditor (printed), removed at exit
#   console/run.sh --database URL ...   the console alone, against your ledger
#                                       (console/bin/console.js's options)
#
# CONSOLE_PORT chooses the port (default 8484).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
port=${CONSOLE_PORT:-8484}

node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ]; then
	echo "the console needs Node.js 20 or later; this machine has $(node --version 2>/dev/null || echo none) (see docs/console.md)" >&2
	exit 1
fi

# the console's npm packages, from its lock file, when they are missing or older
if [ ! -f "$top/console/node_modules/.package-lock.json" ] ||
	[ "$top/console/package-lock.json" -nt "$top/console/node_modules/.package-lock.json" ]; then
	echo "installing the console's npm packages (console/package-lock.json) ..."
	(cd "$top/console" && npm ci --no-audit --no-fund --silent)
fi

if (($#)); then
	exec node "$top/console/bin/console.js" --port "$port" "$@"
fi

. "$top/test/throwaway-cluster.sh"
install_extension "$top"
echo "starting a throwaway PostgreSQL cluster ..."
start_throwaway_cluster console 5434 "password_encryption = 'scram-sha-256'"

echo "telling the demo's story into it (demo/demo.py), and leaving two payments for a person ..."
/usr/bin/python3 "$top/console/seed.py" --dsn "$dsn" --logins "$work/logins" >"$work/story.log" ||
	{ cat "$work/story.log"; exit 1; }
grep -E '^ *(OK|!!) ' "$work/story.log" || true

# From now on every role but the superuser logs in with its SCRAM password
# (the story's workers connected by trust); the console has no login of its own.
printf 'local all postgres trust\nlocal all all scram-sha-256\n' | as_cluster_user tee "$work/data/pg_hba.conf" >/dev/null
as_cluster_user "$bindir/pg_ctl" -D "$work/data" reload >/dev/null

cat <<EOT

The console is at http://127.0.0.1:$port/ (Ctrl-C stops it and removes the cluster).
Log in as
$(sed 's/^/  /' "$work/logins")
Two payments wait for a person there: ap-10 (a worker evicted mid-payment) and
ap-11 (a replay that reworded the memo).

EOT
node "$top/console/bin/console.js" --port "$port" --database "postgresql:///postgres?host=$work&port=5434"
