#!/usr/bin/python3
"""The arithmetic of make bench that decides what its rows say.

    test/check-bench.py TOP

bench/order.py's balanced order (every side in every position, and right after every
other side, equally often over a cycle of rounds) and bench/fleet_scale.py's saturation
point, its bracket and the range of the ledger/floor ratio, on steps made up here (no
cluster: the bench itself is not a test).  Prints one TAP line per check and exits
non-zero when one fails.
"""

import collections
import os
import sys

sys.dont_write_bytecode = True  # nothing written into the tree it checks

sys.path.insert(0, os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "bench"))
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
check(fleet_scale.saturation(ledger)[0] == 921 and "between 921 calls/s achieved and 1132 offered"
      in fleet_scale.saturation(ledger)[1], "fleet: the saturation point and its bracket as the row says them")
check("the ratio between 0.68 and 1.23" in fleet_scale.ratio_range(fleet_scale.bracket(ledger),
                                                                   fleet_scale.bracket(floor)),
      "fleet: the ratio's range is the ledger's achieved over the floor's offered, and the other way round")
check("unknown (the ledger's top step was within 50 ms)" in fleet_scale.ratio_range(
          fleet_scale.bracket(ledger[:1]), fleet_scale.bracket(floor)),
      "fleet: a side that never passed 50 ms leaves that end of the range unknown")
check(fleet_scale.saturation([step(300, 292, 291, 8.0, {"OperationalError": 1})])[0] == 0.0
      and fleet_scale.ratio_range(fleet_scale.bracket([step(300, 292, 291, 80.0)]), fleet_scale.bracket(floor))
      == "no ratio: a side had no step within 50 ms",
      "fleet: a step with errors is not within the bound; no step within it, no point and no ratio")

for n, (ok, name) in enumerate(checks, 1):
    print(f"{'ok' if ok else 'not ok'} {n} - {name}")
print(f"1..{len(checks)}")
sys.exit(0 if all(ok for ok, _ in checks) else 1)
