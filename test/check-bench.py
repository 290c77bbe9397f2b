#!/usr/bin/python3
"""The arithmetic of make bench that decides what its rows say.

    test/check-bench.py [TOP]

bench/order.py's balanced order (every side in every position, and right after every
other side, equally often over a cycle of rounds); bench/fleet_scale.py's saturation
point, its bracket and the range of the ledger/floor ratio, on steps made up here, and
its step() giving every side the same model turns, run against a ledger made up here;
bench/callgrind/run.sh stopping when a pass did not execute and complete every pair or
printed no total, with stand-ins for the scripts it runs.  No cluster: the bench itself
is not a test.  Prints one TAP line per check and exits non-zero when one fails.
"""

import asyncio
import collections
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import types
import zlib

sys.dont_write_bytecode = True  # nothing written into the tree it checks

# the tree it checks: TOP, or the one this script is in (wherever it is run from)
TOP = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TOP, "bench"))
from order import turn_order, williams_rows  # noqa: E402
import fleet_scale  # noqa: E402

checks = []


def check(ok, name):
    checks.append((bool(ok), name))


for n in range(1, 7):
    rows = williams_rows(n)
    positions, predecessors = collections.Counter(), collections.Counter()
    for row in rows:
        positions.update((side, at) for at, side in enumerate(row))
        predecessors.update(zip(row, row[1:]))
    check(all(sorted(row) == list(range(n)) for row in rows)
          and len(set(positions.values())) == 1 and len(positions) == n * n
          and len(set(predecessors.values())) <= 1 and len(predecessors) == n * (n - 1),
          f"order.py: {n} side(s), each in every position and after every other side equally often")
sides = ["ledger", "floor", "ledger before", "floor before"]
check(sum(turn_order(sides, r).index("ledger") < turn_order(sides, r).index("floor") for r in range(4)) == 2,
      "order.py: the ledger goes before its floor in half the rounds of a cycle (a rotation: three in four)")


def step(nominal, offered, achieved, p99, errors=None):
    return {"nominal": nominal, "offered": offered, "achieved": achieved, "p99": p99, "p50": 1.0,
            "errors": errors or {}, "cpu": "-", "per_call": "-", "server": "-", "load": "-"}


# an overloaded step achieves less than the best one within the bound did: it still
# bounds the saturation point, by the rate it was offered
ledger = [step(300, 292, 291, 8.0), step(1600, 1132, 861, 1812.8), step(950, 923, 921, 23.3)]
floor = [step(300, 292, 292, 8.8), step(1600, 1361, 1227, 622.4), step(950, 923, 921, 33.8)]
best, over = fleet_scale.bracket(ledger)
check(best["nominal"] == 950 and over is not None and over["nominal"] == 1600,
      "fleet: the bracket is the best step within 50 ms and the next step over it, whose achieved rate fell")
check(fleet_scale.saturation(ledger)[0] == 921 and "between 921 calls/s achieved and 1600 offered"
      in fleet_scale.saturation(ledger)[1], "fleet: the saturation point and its bracket as the row says them")
check("the ratio between 0.58 and 1.74" in fleet_scale.ratio_range(fleet_scale.bracket(ledger),
                                                                   fleet_scale.bracket(floor)),
      "fleet: the ratio's range is the ledger's achieved over the rate the floor failed at, and the other way round")
check("unknown (the ledger's top step was within 50 ms)" in fleet_scale.ratio_range(
          fleet_scale.bracket(ledger[:1]), fleet_scale.bracket(floor)),
      "fleet: a side that never passed 50 ms leaves that end of the range unknown")
check(fleet_scale.saturation([step(300, 292, 291, 8.0, {"OperationalError": 1})])[0] == 0.0
      and fleet_scale.ratio_range(fleet_scale.bracket([step(300, 292, 291, 80.0)]), fleet_scale.bracket(floor))
      == "no ratio: a side had no step within 50 ms",
      "fleet: a step with errors is not within the bound; no step within it, no point and no ratio")

# two failing steps above the best one and one below it: the bracket's upper end is the
# failing step at the lowest rate above the best one
steps = [step(250, 250, 249, 5.0), step(500, 498, 497, 80.0), step(750, 751, 750, 20.0),
         step(1000, 990, 900, 300.0), step(1250, 1100, 700, 900.0)]
best, over = fleet_scale.bracket(steps)
check(best["nominal"] == 750 and over["nominal"] == 1000,
      "fleet: the bracket's upper end is the first failing step above the best, not one below or further up")
# an overloaded step begins fewer calls than the best step carried (a run's next call waits
# for its last): the bracket's upper end is the rate it was offered, never below the point
collapsed = [step(950, 923, 921, 23.3), step(1275, 905, 700, 900.0)]
text = fleet_scale.ratio_range(fleet_scale.bracket(collapsed), fleet_scale.bracket(floor))
low, high = (float(x) for x in text.rsplit("the ratio between ", 1)[1].split(" and "))
check(fleet_scale.ceiling(*fleet_scale.bracket(collapsed)) == 1275 and low <= 921 / 921 <= high,
      "fleet: a collapsed step's bracket ends at its offered rate, and the point's ratio lies in its range")
check("or errors came" in fleet_scale.saturation([step(300, 292, 291, 8.0), step(600, 590, 588, 9.0, {"E": 1})])[1],
      "fleet: a step that failed by errors alone is named as such")


def turns_of_each_run(latency):
    """step()'s model turns, recorded by the generator that drew them, with a ledger whose
    calls take 0 to 6 times latency seconds (by the run's name)."""
    draws = collections.defaultdict(list)

    class Recording(random.Random):
        def __init__(self, seed):
            super().__init__(seed)
            self.seed_name = seed

        def uniform(self, a, b):
            x = super().uniform(a, b)
            draws[self.seed_name].append(x)
            return x

    class Ledger:
        @contextlib.asynccontextmanager
        async def token_attempt(self, name, ttl):
            yield

        async def guarded(self, name, tool, args, fn):
            await asyncio.sleep(latency * (zlib.crc32(name.encode()) % 7))
            return fn("k")

    real, fleet_scale.random = fleet_scale.random, types.SimpleNamespace(Random=Recording)
    try:
        asyncio.run(fleet_scale.step(Ledger(), None, 0, 20, 0, 2, "s0"))
    finally:
        fleet_scale.random = real
    return draws


fast, slow = turns_of_each_run(0.0), turns_of_each_run(0.05)
check(len(fast) > 10 and set(fast) == set(slow) and all(k.count("-") == 2 for k in fast)
      and all(a[:len(b)] == b[:len(a)] for a, b in ((fast[k], slow[k]) for k in fast)),
      "fleet: every run draws its model turns from its own generator, the same whatever the calls' latency")

# bench/callgrind/run.sh with stand-ins: mkcopy.sh and init.sh do nothing, measure.sh
# prints executions, completions and a total as the mode says
work = tempfile.mkdtemp(prefix="check-bench.")
try:
    shutil.copy(os.path.join(TOP, "bench", "callgrind", "run.sh"), work)
    for name in ("mkcopy.sh", "init.sh"):
        with open(os.path.join(work, name), "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
    with open(os.path.join(work, "measure.sh"), "w") as f:
        f.write("""#!/bin/sh
n=$(($2 + 200))
case $MODE in
ok) echo $n; echo $n; echo "summary: $(($2 * 1000 + 5))" ;;
replay) echo $((n - 1)); echo $n; echo "summary: $(($2 * 1000))" ;;
nototal) echo $n; echo $n ;;
failed) echo $n; echo $n; echo "summary: $(($2 * 1000))"; exit 1 ;;
esac
""")
    for name in ("mkcopy.sh", "init.sh", "measure.sh"):
        os.chmod(os.path.join(work, name), 0o755)
    runs = {mode: subprocess.run(["bash", os.path.join(work, "run.sh"), work], capture_output=True, text=True,
                                 env={**os.environ, "MODE": mode, "CG_WORK": os.path.join(work, "w")})
            for mode in ("ok", "replay", "nototal", "failed")}
    check(runs["ok"].returncode == 0 and "instructions per pair: 1000 " in runs["ok"].stdout,
          "callgrind/run.sh: the difference of the two passes over 2,000 pairs")
    take = subprocess.run(["bash", os.path.join(work, "run.sh"), work], capture_output=True, text=True,
                          env={**os.environ, "MODE": "ok", "CG_LEASE": "take", "CG_WORK": os.path.join(work, "w")})
    check(take.returncode == 0 and "instructions per take+release: 1000 " in take.stdout,
          "callgrind/run.sh: CG_LEASE=take names its pair a take+release")
    check(all(runs[m].returncode != 0 and "instructions per pair" not in runs[m].stdout
              for m in ("replay", "nototal", "failed")),
          "callgrind/run.sh: no figure when a pair was not executed, a total is missing, or measure.sh failed")
finally:
    shutil.rmtree(work, ignore_errors=True)

for n, (ok, name) in enumerate(checks, 1):
    print(f"{'ok' if ok else 'not ok'} {n} - {name}")
print(f"1..{len(checks)}")
sys.exit(0 if all(ok for ok, _ in checks) else 1)
