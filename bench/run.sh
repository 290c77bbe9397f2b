#!/usr/bin/env bash
# make bench: builds and installs durable_ledger, starts a throwaway cluster
# tuned like a small production server (the library preloaded: event counts
# on, as in production), runs bench/bench.py, and removes the cluster.  Not part of the test run.  Extra arguments go to bench.py
# (e.g. --seconds 20 --rounds 5 --big 500000; --only pooler runs one section).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/test/throwaway-cluster.sh"
. "$top/bench/settings.sh"
install_extension "$top"
make -s -C "$top/proxy" install >/dev/null  # the proxy section's durable_ledger_proxy
# the console section starts the operator console: its npm packages, from its lock file
[ -d "$top/console/node_modules/fastify" ] || (cd "$top/console" && npm ci --no-audit --no-fund --silent)
# the gateway section runs the MCP gateway: its npm packages, after the JavaScript client's (it links to it)
[ -d "$top/clients/js/node_modules/pg" ] || (cd "$top/clients/js" && npm ci --no-audit --no-fund --silent)
[ -d "$top/adapters/mcp-gateway/node_modules/@modelcontextprotocol" ] || (cd "$top/adapters/mcp-gateway" && npm ci --no-audit --no-fund --silent)
# the cluster's port: bench.py's --port (its default, 5434), which also places the second
# clusters of --access-before and --before on the ports after it
port=5434 args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
	case ${args[i]} in
	--port) port=${args[i + 1]:-$port} ;;
	--port=*) port=${args[i]#--port=} ;;
	esac
done
start_throwaway_cluster bench "$port" "${bench_settings[@]}"

/usr/bin/python3 "$top/bench/bench.py" --dsn "$dsn" --pgbench "$bindir/pgbench" "$@"
