"""make bench, section "gateway": what the MCP gateway (adapters/mcp-gateway) adds to the
latency of a tool call, against calling the upstream MCP server directly.

adapters/mcp-gateway/bench/gateway-bench.js does the measuring: the MCP SDK's own client
calls a do-nothing upstream server over stdio directly, and through the gateway's bin (over
stdio, with the upstream as its child), a side-effecting tool (begin_effect and
complete_effect under the session's token lease, each its own transaction) and a read-only
one (passed straight through); and, for scale, the ledger's part alone (the same
begin_effect and complete_effect from a node process, the JavaScript client's guarded()
under a token lease, no MCP); the four sides interleaved round by round, each round a new
connection making calls one after another.  The figures are p50 and p99 over every call of
every round; "added" is the gateway's minus the direct one's.
"""

import json
import os
import subprocess
import urllib.parse

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "adapters", "mcp-gateway", "bench", "gateway-bench.js")


def node_url(dsn):
    """A postgresql:// URL (what node-postgres reads) for a libpq DSN."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    query = urllib.parse.urlencode({"host": info["host"], "port": info.get("port", 5432)})
    user = urllib.parse.quote(info.get("user", "postgres"), safe="")
    return f"postgresql://{user}@/{urllib.parse.quote(info.get('dbname', 'postgres'), safe='')}?{query}"


def gateway_section(args, dsn, say):
    say("MCP gateway: a tool call through the gateway against the upstream server directly ...")
    out = subprocess.run(["node", SCRIPT, "--dsn", node_url(dsn), "--seconds", str(args.seconds),
                          "--rounds", str(args.rounds)],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    d, e, g, l = r["direct"], r["gateway_effect"], r["gateway_read"], r["ledger_only"]
    rows = []
    for what, side in (("a side-effecting call (through the ledger)", e), ("a read-only call (straight through)", g)):
        for q in ("p50", "p99"):
            rows.append((f"MCP gateway: latency added to {what}, {q} (ms)", side[q] - d[q], "(context)",
                         f"through the gateway {q} {side[q]:.2f} ms ({side['per_second']:.0f} calls/s); "
                         f"directly {q} {d[q]:.2f} ms ({d['per_second']:.0f} calls/s)"
                         + (f"; the ledger's part alone {q} {l[q]:.2f} ms ({l['per_second']:.0f} calls/s)"
                            if side is e else "")
                         + f"; stdio, one client, calls one after another, {side['calls']} calls"))
            say("  ", rows[-1])
    return rows
