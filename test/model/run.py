#!/usr/bin/python3
"""Checks the extension against the model on generated histories.

  run.py --dsn DSN [--seed N] [--examples N] [--steps N]
      a fixed budget of histories from a fixed seed (deterministic): CI
  run.py --dsn DSN --minutes M --keep DIR
      fresh seeds until M minutes have passed (make soak); every failing
      history, shrunk, is written to DIR as a regression file
  run.py --dsn DSN --regressions DIR
      replays every kept history in DIR (each must now agree)
  run.py --dsn DSN --twice [--seed N] [--examples N] [--steps N]
      the budget twice: the same draws must make the same histories (the
      check's premise: Hypothesis replays a history to shrink it)

Prints one "ok N - ..." / "not ok N - ..." line per check (TAP), the
failing history as SQL under a failure.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import itertools
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hypothesis import HealthCheck, Phase, seed, settings  # noqa: E402
from hypothesis.errors import Flaky  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

import machine  # noqa: E402


def check(n_seed: int, examples: int, steps: int) -> tuple[bool, str]:
    """One budget of histories from one seed; (passed, what failed)."""
    machine.last_failure.clear()
    machine.last_begun.clear()
    chosen = settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                      database=None, print_blob=False,
                      phases=[Phase.generate, Phase.shrink],
                      suppress_health_check=list(HealthCheck))
    seed(n_seed)(machine.LedgerMachine)
    try:
        run_state_machine_as_test(machine.LedgerMachine, settings=chosen)
    except AssertionError as e:
        return False, str(e)
    except Flaky as e:
        # the same draws made another history on replay: the machine is not
        # deterministic, a defect of the check itself; the last history that
        # failed is still kept (machine.failed_history)
        return False, f"the check is not deterministic ({e})\n{machine.failed_history_text()}"
    except Exception as e:  # a server or driver error the machine did not expect
        return False, f"{type(e).__name__}: {e}\n{machine.failed_history_text()}"
    return True, ""


def keep(directory: str, n_seed: int, failure: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"seed-{n_seed}.json")
    with open(path, "w") as f:
        json.dump({"seed": n_seed, "steps": machine.failed_history().get("steps", []),
                   "failure": failure.splitlines()[0] if failure else ""}, f, indent=1)
        f.write("\n")
    return path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("--seed", type=int, default=20261202)
    p.add_argument("--examples", type=int, default=60)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--minutes", type=float)
    p.add_argument("--keep")
    p.add_argument("--regressions")
    p.add_argument("--twice", action="store_true",
                   help="the budget twice from the seed: the same histories both times")
    a = p.parse_args()
    machine.DSN = a.dsn
    n = 0
    failed = 0

    def report(ok: bool, what: str, detail: str = "") -> None:
        nonlocal n, failed
        n += 1
        failed += not ok
        print(f"{'ok' if ok else 'not ok'} {n} - {what}", flush=True)
        if detail:
            print("\n".join("# " + line for line in detail.splitlines()), flush=True)

    if a.regressions:
        for path in sorted(glob.glob(os.path.join(a.regressions, "*.json"))):
            with open(path) as f:
                kept = json.load(f)
            try:
                machine.replay(kept["steps"])
                report(True, f"kept history {os.path.basename(path)} agrees with the model")
            except AssertionError as e:
                report(False, f"kept history {os.path.basename(path)}", str(e))
    elif a.minutes:
        until = time.monotonic() + a.minutes * 60
        while time.monotonic() < until:
            n_seed = random.SystemRandom().randrange(1 << 31)
            ok, failure = check(n_seed, a.examples, a.steps)
            detail = failure
            if not ok and a.keep:
                detail = f"kept as {keep(a.keep, n_seed, failure)}\n{failure}"
            report(ok, f"seed {n_seed}: {a.examples} histories of up to {a.steps} steps", detail)
    elif a.twice:
        # the check's own premise: the same draws make the same histories
        # (else Hypothesis cannot replay or shrink what failed)
        runs = []
        for _ in range(2):
            machine.finished.clear()
            ok, failure = check(a.seed, a.examples, a.steps)
            if not ok:
                report(False, f"seed {a.seed}: histories agree with the model", failure)
                break
            runs.append(list(machine.finished))
        else:
            first, second = runs
            pairs = list(itertools.zip_longest(first, second, fillvalue=""))
            differ = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
            detail = ""
            if differ is not None:
                x, y = (h.splitlines() for h in pairs[differ])
                detail = f"history {differ + 1} differs:\n" + "\n".join(
                    list(difflib.unified_diff(x, y, "first run", "second run", lineterm=""))[:80])
            report(differ is None, f"seed {a.seed} twice: the same {len(first)} histories",
                   detail)
    else:
        ok, failure = check(a.seed, a.examples, a.steps)
        report(ok, f"seed {a.seed}: {a.examples} histories of up to {a.steps} steps agree "
               "with the model", failure)
    for what, count in sorted(machine.seen.items()):
        print(f"# {count:6d}  {what}")
    print(f"1..{n}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
