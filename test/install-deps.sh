#!/usr/bin/env bash
# Installs what building and testing durable_ledger needs on Debian 12, from
# Debian's own packages, then the npm packages of the JavaScript client and the
# console from their lock files.  Run as root (or with sudo); safe to run again.
set -euo pipefail

packages=(
	make gcc                       # the build (PGXS)
	postgresql-15                  # the server, with contrib (pgcrypto, dblink)
	postgresql-server-dev-15       # PGXS, pg_regress, pg_isolation_regress, TAP modules
	libipc-run-perl                # PostgreSQL's TAP tests
	python3-psycopg                # the Python client and the fleet chaos test
	python3-psycopg-pool           # the Python client's token-lease tests (a connection pool)
	python3-hypothesis             # the model check (test/model/): generated histories
	python3-mypy                   # the Python client's type hints, checked --strict
	python3-venv python3-setuptools  # the Python client installed with pip into a virtual environment
	postgresql-15-plproxy          # the proxy (proxy/): the ledger sharded on several clusters
	pgbouncer                      # the tests and bench section through a transaction pooler
	prometheus-postgres-exporter   # the monitoring test: the ledger's metrics as Prometheus scrapes them
	prometheus                     # promtool: the alert rules checked and unit-tested
	chromium                       # the operator console's tests drive it headless (console/test)
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm for the JavaScript client (clients/js); Debian's own unless
# the machine already has a Node.js with its npm.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# the npm packages (the registry is reachable): the JavaScript client's, the
# console's and the agent-framework adapters' (test/npm-packages.sh), when they
# are missing or older than their lock file
top=$(cd "$(dirname "$0")/.." && pwd)
for package in $("$top/test/npm-packages.sh"); do
	installed="$top/$package/node_modules/.package-lock.json"
	if [ ! -f "$installed" ] || [ "$top/$package/package-lock.json" -nt "$installed" ]; then
		(cd "$top/$package" && npm ci --no-audit --no-fund --silent)
	fi
done
echo "dependencies installed: ${packages[*]} nodejs npm; npm packages of $("$top/test/npm-packages.sh" | xargs)"
