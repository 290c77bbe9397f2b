#!/usr/bin/env bash
# The demo: installs what it needs, builds and installs durable_ledger, starts
# a throwaway PostgreSQL cluster, tells the story in demo/demo.py with real
# worker processes, and removes the cluster.  `make demo` runs this script.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/test/throwaway-cluster.sh"
install_extension "$top"
echo "Starting a throwaway PostgreSQL cluster ..."
start_throwaway_cluster demo 5433

/usr/bin/python3 "$top/demo/demo.py" --dsn "$dsn"
echo "Removing the throwaway cluster."
