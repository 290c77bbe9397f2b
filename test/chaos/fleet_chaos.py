#!/usr/bin/python3
"""The fleet chaos test: at-least-once workers + the ledger + reconciliation
pay every invoice exactly as often as planned.

A downstream "bank" table with no unique constraint stands for a payment API.
Worker processes pay invoices through the ledger.  An orchestrator SIGKILLs
workers at random moments, delivers some runs to two workers at once, restarts
every interrupted run, and reconciles paused effects the way the contract says:
it asks the bank, then calls resolve_effect with a name.  Plans include a
payment legitimately made twice by one run ("again", not "twice") and invoices
shared by two runs through a business key.

At the end: every invoice paid exactly as often as planned, no key paid twice,
nothing unresolved, no conflict.  Prints "ok - ..." / "not ok - ..." lines and
exits non-zero when a check fails.

    fleet_chaos.py --dsn DSN [--seed 42] [--runs 40] [--kills 60] [--workers 6]
                   [--kill-chance 0.15] [--timeout 240]

The default size runs in well under a minute; a soak run raises --runs and
--kills (see README).  Needs Debian's python3-psycopg (psycopg 3).
"""

import argparse
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time

import psycopg
from psycopg.types.json import Jsonb

PAUSED = 3  # a worker's exit status when the run pauses for a person


# --------------------------------------------------------------------------
# The worker: one attempt at one run.
# --------------------------------------------------------------------------

def phase(rng, name):
    """Tells the orchestrator where the worker is, then pauses a moment: a
    SIGKILL sent on hearing it lands exactly between two steps."""
    print(name, flush=True)
    time.sleep(rng.random() * 0.005)


def worker(dsn, run, plan):
    rng = random.Random()
    # one connection for the ledger and the bank: when the lease ends (the
    # connection closed), any payment this worker made is committed and visible
    conn = psycopg.connect(dsn, autocommit=True, application_name="chaos-worker")
    conn.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
    for step in plan:
        args = {"invoice": step["invoice"], "amount": step["amount"]}
        while True:
            key, decision, status = conn.execute(
                "SELECT key, decision, status FROM durable_ledger.begin_effect(%s, 'bank.pay', %s, %s)",
                (run, Jsonb(args), step.get("business_key"))).fetchone()
            if decision == "execute":
                phase(rng, "intent recorded")
                payment_id = conn.execute(
                    "INSERT INTO bank_payments (invoice, amount, idempotency_key, run)"
                    " VALUES (%s, %s, %s, %s) RETURNING id",
                    (step["invoice"], step["amount"], key, run)).fetchone()[0]
                phase(rng, "paid at the bank")
                conn.execute("SELECT durable_ledger.complete_effect(%s, %s)",
                             (key, Jsonb({"payment_id": payment_id})))
                break
            if decision == "replay" and status == "completed":
                break
            if decision == "replay":
                continue  # it failed (never reached the bank): call again, the next occurrence
            if decision == "pause":
                sys.exit(PAUSED)
            time.sleep(0.01)  # in_progress: another run is paying this business key now
        phase(rng, "step done")
    conn.execute("SELECT durable_ledger.release_run(%s)", (run,))
    conn.close()
    sys.exit(0)


# --------------------------------------------------------------------------
# The orchestrator.
# --------------------------------------------------------------------------

def make_plans(rng, runs):
    """Per run, a list of payments; and how many bank payments each invoice must get."""
    shared = {f"SHARED-{k}": 100 + k for k in range(max(2, runs // 8))}
    plans, expected = {}, {}
    for r in range(runs):
        run = f"chaos-run-{r}"
        plan = []
        for i in range(rng.randint(2, 4)):
            invoice = f"INV-{r}-{i}"
            plan.append({"invoice": invoice, "amount": rng.randint(10, 5000)})
            expected[invoice] = 1
        if rng.random() < 0.3:  # the same payment made twice on purpose: two payments
            again = dict(rng.choice(plan))
            plan.insert(rng.randint(0, len(plan)), again)
            expected[again["invoice"]] += 1
        if rng.random() < 0.4:  # an invoice shared with other runs: one payment in all
            invoice = rng.choice(sorted(shared))
            plan.insert(rng.randint(0, len(plan)),
                        {"invoice": invoice, "amount": shared[invoice], "business_key": invoice})
            expected[invoice] = 1
        plans[run] = plan
    return plans, expected


def with_user(dsn, user):
    return psycopg.conninfo.make_conninfo(dsn, user=user)


def setup(admin_dsn):
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("""
            DROP TABLE IF EXISTS bank_payments;
            CREATE TABLE bank_payments (      -- a downstream API: no unique constraint
                id bigserial, invoice text, amount integer, idempotency_key text, run text);
            DO $$ BEGIN
              IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'chaos_worker') THEN
                CREATE ROLE chaos_worker LOGIN; END IF;
              IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'chaos_reconciler') THEN
                CREATE ROLE chaos_reconciler LOGIN; END IF;
            END $$;
            GRANT durable_ledger_worker TO chaos_worker;
            GRANT durable_ledger_admin TO chaos_reconciler;
            GRANT INSERT, SELECT ON bank_payments TO chaos_worker;
            GRANT USAGE ON SEQUENCE bank_payments_id_seq TO chaos_worker;
            GRANT SELECT ON bank_payments TO chaos_reconciler;
        """)


def reconcile(reconciler_dsn):
    """Ask the bank about every effect that needs a person, and resolve it."""
    resolved = 0
    with psycopg.connect(reconciler_dsn, autocommit=True, application_name="chaos-reconciler") as conn:
        for key, conflict in conn.execute(
                "SELECT key, conflict FROM durable_ledger.unresolved ORDER BY created_at").fetchall():
            if conflict:
                continue  # a contradiction is a bug here; the final check reports it
            paid = conn.execute("SELECT min(id) FROM bank_payments WHERE idempotency_key = %s",
                                (key,)).fetchone()[0]
            if paid is not None:
                outcome, value, note = "completed", {"payment_id": paid}, "found at the bank"
            else:
                outcome, value, note = "failed", {"reason": "no payment with this idempotency key"}, "not at the bank"
            # a view read is not a lock: a late report may have settled it meanwhile
            try:
                conn.execute("SELECT durable_ledger.resolve_effect(%s, %s, %s, 'chaos-reconciler', %s)",
                             (key, outcome, Jsonb(value), note))
                resolved += 1
            except psycopg.errors.ObjectNotInPrerequisiteState as e:
                print(f"# not resolved, {key[:12]}: {e.diag.message_primary}")
    return resolved


def orchestrate(args):
    rng = random.Random(args.seed)
    admin_dsn = args.dsn
    worker_dsn = with_user(admin_dsn, "chaos_worker")
    reconciler_dsn = with_user(admin_dsn, "chaos_reconciler")
    setup(admin_dsn)
    plans, expected = make_plans(rng, args.runs)

    pending = sorted(plans)           # runs to (re)deliver
    done = set()
    live = []                         # (process, run)
    selector = selectors.DefaultSelector()
    stats = {"workers started": 0, "killed": 0, "delivered twice": 0,
             "paused": 0, "resolved by the reconciler": 0, "errors": 0}
    kills_left = args.kills
    deadline = time.monotonic() + args.timeout

    def start(run):
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "worker", "--dsn", worker_dsn,
             "--run", run, "--plan", json.dumps(plans[run])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        live.append((proc, run))
        selector.register(proc.stdout, selectors.EVENT_READ, proc)
        stats["workers started"] += 1

    while (pending or live) and time.monotonic() < deadline:
        while pending and len(live) < args.workers:
            run = pending.pop(rng.randrange(len(pending)))
            start(run)
            if rng.random() < 0.2 and len(live) < args.workers:
                start(run)  # the queue redelivers: two workers on one run at once
                stats["delivered twice"] += 1

        # a worker reports each step; now and then it is killed right there
        for event, _ in selector.select(timeout=0.01):
            proc = event.data
            line = proc.stdout.readline()
            if not line:
                selector.unregister(proc.stdout)
                continue
            if kills_left > 0 and rng.random() < args.kill_chance and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)  # the pod is evicted
                kills_left -= 1
                stats["killed"] += 1

        need_reconcile = False
        for proc, run in list(live):
            code = proc.poll()
            if code is None:
                continue
            live.remove((proc, run))
            if proc.stdout in selector.get_map():
                selector.unregister(proc.stdout)
            proc.stdout.close()
            err = proc.stderr.read().decode(errors="replace")
            proc.stderr.close()
            if code == 0:
                done.add(run)
                continue
            if code == PAUSED:
                stats["paused"] += 1
                need_reconcile = True
            elif code != -signal.SIGKILL:
                stats["errors"] += 1
                print(f"# worker for {run} exited with {code}: {err.strip()[-400:]}")
            # restart the interrupted run, unless its twin already finished it
            if run not in done and run not in pending and all(r != run for _, r in live):
                pending.append(run)
        if need_reconcile:
            stats["resolved by the reconciler"] += reconcile(reconciler_dsn)

    for proc, _ in live:
        proc.kill()
        proc.wait()
    # what the killed workers left unknown after their last attempt
    stats["resolved by the reconciler"] += reconcile(reconciler_dsn)
    return plans, expected, done, stats


def check(dsn, plans, expected, done, stats):
    failures = 0

    def report(ok, what):
        nonlocal failures
        print(("ok - " if ok else "not ok - ") + what)
        failures += 0 if ok else 1

    with psycopg.connect(dsn, autocommit=True) as conn:
        paid = dict(conn.execute(
            "SELECT invoice, count(*) FROM bank_payments GROUP BY invoice").fetchall())
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT idempotency_key FROM bank_payments"
            " GROUP BY 1 HAVING count(*) > 1) s").fetchone()[0]
        unresolved = conn.execute("SELECT count(*) FROM durable_ledger.unresolved").fetchone()[0]
        conflicts = conn.execute("SELECT count(*) FROM durable_ledger.effects WHERE conflict").fetchone()[0]
        leases = conn.execute("SELECT count(*) FROM durable_ledger.leases").fetchone()[0]

    wrong = {inv: (paid.get(inv, 0), n) for inv, n in expected.items() if paid.get(inv, 0) != n}
    report(done == set(plans), f"every run finished ({len(done)} of {len(plans)})")
    report(not wrong, f"every invoice paid exactly as often as planned ({len(expected)} invoices, "
                      f"{sum(expected.values())} payments)" + (f": wrong {sorted(wrong.items())[:10]}" if wrong else ""))
    report(set(paid) <= set(expected), "no payment for an invoice nobody planned")
    report(twice == 0, f"no idempotency key paid twice ({twice})")
    report(unresolved == 0, f"nothing unresolved ({unresolved})")
    report(conflicts == 0, f"no contradicting reports ({conflicts})")
    report(leases == 0, f"no lease left held ({leases})")
    report(stats["killed"] > 0 and stats["paused"] > 0,
           "the chaos happened: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
    report(stats["errors"] == 0, f"no worker failed other than by SIGKILL or pause ({stats['errors']})")
    print(f"{9 - failures} passed, {failures} failed")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="orchestrator", choices=["orchestrator", "worker"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--kills", type=int, default=60)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=240,
                        help="seconds before the orchestrator gives up")
    parser.add_argument("--kill-chance", type=float, default=0.15,
                        help="chance that a worker is killed at a step it reports")
    parser.add_argument("--run")
    parser.add_argument("--plan")
    args = parser.parse_args()
    if args.role == "worker":
        worker(args.dsn, args.run, json.loads(args.plan))
    try:
        plans, expected, done, stats = orchestrate(args)
    except Exception as e:  # report it as a failed check, not a bare traceback
        print(f"not ok - the orchestrator ran to its end: {type(e).__name__}: {e}")
        print("0 passed, 1 failed")
        raise
    sys.exit(1 if check(args.dsn, plans, expected, done, stats) else 0)


if __name__ == "__main__":
    main()
