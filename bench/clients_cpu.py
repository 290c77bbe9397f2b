"""make bench, section "clients": the CPU a client spends per guarded call (issue 34).

Each client runs RUNS runs, 4 at a time, each a token attempt of three guarded calls on a
pool (take_lease and release_lease included), the tools doing nothing, in a process of
its own: bench/client_cpu.py (Python: Ledger on a psycopg_pool ConnectionPool, 4 threads;
AsyncLedger on an AsyncConnectionPool, 4 tasks) and bench/client_cpu.mjs (JavaScript: a
Ledger on a pg.Pool).  The figure is the process's own CPU (user + system) over the timed
runs, after 200 runs of warm-up, divided by the calls: the client's side only, the server
is another process.  The median of --rounds rounds, the three clients interleaved; target
<= 0.5 ms a call.
"""

import filecmp
import json
import os
import shutil
import statistics
import subprocess

from gateway_latency import node_url

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = "600"


def clients_section(args, dsn, say, before_src=None, was="before"):
    """before_src: an earlier commit's tree (--before): its clients measured too, by this
    tree's harness (copied into it), against the same cluster, the six interleaved."""
    say("clients: CPU per guarded call (token attempts of three calls on a pool) ...")
    trees = [("", HERE)]
    if before_src:
        harness = os.path.join(before_src, "bench")
        os.makedirs(harness, exist_ok=True)
        for name in ("client_cpu.py", "client_cpu.mjs"):
            shutil.copy(os.path.join(HERE, name), harness)
        js = os.path.join(before_src, "clients", "js")
        if not os.path.exists(os.path.join(js, "node_modules")):
            # its own lock file's packages: this tree's, linked, when the lock files are
            # the same; installed from its lock file when they are not
            ours = os.path.join(HERE, "..", "clients", "js")
            lock, our_lock = os.path.join(js, "package-lock.json"), os.path.join(ours, "package-lock.json")
            if os.path.exists(lock) and filecmp.cmp(lock, our_lock, shallow=False):
                os.symlink(os.path.join(ours, "node_modules"), os.path.join(js, "node_modules"))
            else:
                subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=js, check=True)
        trees.append((f", {was}", harness))
    commands = {}
    for side, bench in trees:
        commands.update({
            "Python (Ledger, sync)" + side: ["/usr/bin/python3", os.path.join(bench, "client_cpu.py"), "sync", dsn,
                                             RUNS, "4"],
            "Python (AsyncLedger)" + side: ["/usr/bin/python3", os.path.join(bench, "client_cpu.py"), "async", dsn,
                                            RUNS, "4"],
            "JavaScript (Ledger)" + side: ["node", os.path.join(bench, "client_cpu.mjs"), node_url(dsn), RUNS, "4"],
        })
    per_call = {name: [] for name in commands}
    names = list(commands)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            out = subprocess.run(commands[name], check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            per_call[name].append(result["cpu_seconds"] / result["calls"] * 1000)
    rows = []
    for name, figures in per_call.items():
        rows.append((f"client CPU per guarded call, {name} (ms)", statistics.median(figures),
                     "<= 0.5" if "before" not in name else "(before)",
                     f"rounds {', '.join(f'{x:.3f}' for x in figures)}; {RUNS} runs of 3 calls, 4 at a time"))
        say("  ", rows[-1])
    return rows
