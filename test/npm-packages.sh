#!/usr/bin/env bash
# The repository's npm packages, one a line, relative to its top, in the order
# their dependencies are installed: the JavaScript client first (the
# agent-framework adapters link to it: "durable-ledger": "file:../../clients/js"),
# then the console and every adapter (adapters/*/package.json).
cd "$(dirname "$0")/.." || exit 1
echo clients/js
echo console
for manifest in adapters/*/package.json; do
	[ -f "$manifest" ] && dirname "$manifest"
done
exit 0
