#!/usr/bin/python3
"""The fleet chaos test: at-least-once workers + the ledger + reconciliation
pay every invoice exactly as often as planned, and every report lands on the
attempt it is about.

A downstream "bank" table with no unique constraint stands for a payment API;
it records every try it receives, keyed by (idempotency key, attempt), paid or
declined.  Worker processes pay invoices through the ledger.  An orchestrator
SIGKILLs workers at random moments, delivers some runs to two workers at once,
restarts every interrupted run, and reconciles paused effects the way the
contract says: it asks the bank about the attempt in question, then calls
resolve_effect with a name.  Plans include a payment legitimately made twice
by one run ("again", not "twice"), invoices shared by several runs through a
business key, and business keys whose first try or two the bank declines:
the decline is recorded with fail_effect, and the next begin_effect executes
the key again as attempt n+1.

Reports arrive late and twice, as they do in a fleet: every worker first
re-sends the reports its run's killed predecessors may or may not have sent;
a worker that executes the next attempt of a key whose decline it reported
mostly retries that earlier report first (its answer "was lost"), on the very
lease that has just begun the next attempt; and a separate late reporter
re-sends reports at random delays, once or twice, and once more for every try
at the end -- so reports on the current attempt come in duplicate, and reports
on earlier attempts arrive after a later attempt has started.  Every report is
truthful: it says what the bank really did with that (idempotency key,
attempt), and names that attempt.  Workers are forked from the orchestrator
(one process and one connection each), which spares an interpreter start-up
per worker.

With --reconcilers nobody is paged: bank.pay is reconcilable (set_reconcile;
a grace of 0 with session leases, whose lost worker's try is committed before
its lease ends, and well past a frozen worker's resumption with token
leases), the bank has a lookup API by the provider key it was given, and a
worker whose call pauses for an unknown outcome waits for reconcilable_from,
asks the bank and records what it says (reconcile_effect), then calls again:
a payment found replays, none found pays as the next attempt under a new
provider key.  The orchestrator's person then judges only drifted calls, and
the checks add that no unknown outcome was left for a person.

Agents drift, as models do: with --drift-chance (default 0.3) a worker's
model words the memo of its payments anew (a "memo" arg outside the
business keys), so a replay makes calls its run's earlier attempts did not
make.  bank.pay is registered with the default divergence policy (pause):
such a call pauses the run, and the reconciler compares it with the earlier
effect it may duplicate (same invoice and amount: the same payment) and
calls resolve_divergence, after which the run's next attempt replays.

At the end: every invoice paid exactly as often as planned, no key paid twice,
no attempt at the bank twice, nothing unresolved, no conflict, every drift
paused and resolved by the reconciler, and the ledger's
record of every attempt (effects, past_attempts, audit_log) agrees with what
the bank did for that very attempt.  Prints "ok - ..." / "not ok - ..." lines
and exits non-zero when a check fails.

With --lease token the workers hold token leases instead of session leases,
and with --pooler-dsn every worker, the late reporter and the reconciler
connect through a transaction pooler (PgBouncer, pool_mode = transaction):
a worker takes a token lease for its run (polling take_lease while a twin,
or a killed predecessor whose lease has not expired yet, holds it), renews
it from a heartbeat thread on a connection of its own, passes lease => token
to every begin_effect, and releases it at the end (or when the run pauses).
A lost lease (SQLSTATE 55L01) ends the worker's attempt; the orchestrator
restarts the run.  A SIGKILLed worker's lease is not ended by its death: the
run waits for the lease to expire (--ttl).  Besides the SIGKILLs, a few
workers are frozen (SIGSTOP) for longer than their ttl and then resumed
(--freezes): zombies, whose next begin_effect is refused.  The first run is
always delivered twice.  Setup and the final checks use --dsn, a direct
connection; the checks add that every attempt held a token lease and, through
a pooler, that the workers shared fewer server connections than there were
workers.

    fleet_chaos.py --dsn DSN [--seed 42] [--runs 40] [--kills 60] [--workers 6]
                   [--kill-chance 0.15] [--timeout 240]
                   [--lease session|token] [--pooler-dsn DSN] [--ttl 2]
                   [--freezes 6] [--freeze-chance 0.02] [--drift-chance 0.3]

Its parts, for other tests: "fleet_chaos.py setup --dsn DSN" creates the bank
tables and roles; "fleet_chaos.py worker --dsn DSN --run RUN --plan JSON
[--lease token --ttl S] [--pooled] [--hold PHASE]" is one worker (--pooled:
its DSN goes through a transaction pooler; --hold: it waits for a line on
stdin each time it has printed PHASE).  Exit status 0 when the run is done,
3 when it paused, 5 when its token lease was lost.

The default size runs in well under a minute; a soak run raises --runs and
--kills (see README).  Needs Debian's python3-psycopg (psycopg 3).
"""

import argparse
import collections
import json
import os
import random
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback

import psycopg
from psycopg.types.json import Jsonb

PAUSED = 3    # a worker's exit status when the run pauses for a person
REJECTED = 4  # a worker's exit status when the ledger did not accept a truthful report
LOST = 5      # a worker's exit status when its token lease was lost (55L01)

LEASE_LOST = "55L01"  # the SQLSTATE of a token lease that expired, was released or superseded

# Set when connections go through a transaction pooler: PgBouncer 1.18 does not
# carry prepared statements from one transaction to the next, so psycopg must
# not prepare any.
POOLED = False

# A phase at which a worker waits for a line on stdin ("worker --hold PHASE").
HOLD_AT = None

# Set when --dsn is a proxy database (durable_ledger_proxy) in front of shards:
# the workers name the run in every report about a key, so that it goes
# straight to the run's shard (the late reporter does not, and the proxy finds
# the one shard that has the key).
ROUTED = False


def routed(call, run):
    """A call about a key, and its parameters: with the run last through a proxy."""
    if ROUTED and run is not None:
        return call[:-1] + ", run => %s)", (run,)
    return call, ()


def connect(dsn, **kwargs):
    if POOLED:
        kwargs["prepare_threshold"] = None
    return psycopg.connect(dsn, autocommit=True, **kwargs)

# What the bank's answers look like in the ledger.  Each decline carries the id of
# the bank's record of that try, so a report that landed on another attempt than
# its own could not go unnoticed.
NOT_AT_THE_BANK = {"reason": "no try at the bank with this idempotency key and attempt"}


def payment(bank_id):
    return {"payment_id": bank_id}


def decline(bank_id):
    return {"declined": "insufficient_funds", "bank_id": bank_id}


def bank_outcome(tried):
    """What the bank's tries of one attempt ((id, status) in id order) say of it:
    (outcome, value, note), as a person and a reconciler record it."""
    paid = [bank_id for bank_id, status in tried if status == "paid"]
    if paid:
        return "completed", payment(paid[0]), "paid at the bank"
    if tried:
        return "failed", decline(tried[0][0]), "declined by the bank"
    return "failed", NOT_AT_THE_BANK, "not at the bank"


def truthful_report(conn, key, attempt, bank_id, bank_status, run=None):
    """Reports what the bank did with (key, attempt), naming the attempt (and,
    through a proxy, the run when given).

    Returns (accepted, row): accepted when the ledger recorded it, or (a failure on
    an attempt that a later one replaced) already had it; row is the effect's row
    as the report function returned it (attempt, status, conflict)."""
    if bank_status == "paid":
        function, value, expected = "complete_effect", payment(bank_id), "completed"
    else:
        function, value, expected = "fail_effect", decline(bank_id), "failed"
    call, more = routed(f"durable_ledger.{function}(%s, %s, %s)", run)
    row = conn.execute(f"SELECT attempt, status::text, conflict FROM {call}",
                       (key, Jsonb(value), attempt) + more).fetchone()
    if row[0] == attempt:
        return row[1] == expected and not row[2], row
    return function == "fail_effect" and not row[2], row


# --------------------------------------------------------------------------
# The worker: one attempt at one run.
# --------------------------------------------------------------------------

def phase(rng, name):
    """Tells the orchestrator where the worker is, then pauses a moment: a
    SIGKILL sent on hearing it lands exactly between two steps.  A worker
    told to hold at this phase waits for a line on stdin first."""
    print(name, flush=True)
    if HOLD_AT is not None and name == HOLD_AT:
        sys.stdin.readline()
    time.sleep(rng.random() * 0.005)


def rejected(what, key, attempt, row):
    print(f"the ledger did not accept {what} for {key[:16]} attempt {attempt}: "
          f"it answered attempt {row[0]}, {row[1]}, conflict {row[2]}", file=sys.stderr)
    sys.exit(REJECTED)


class Heartbeat(threading.Thread):
    """Renews a token lease every quarter of its ttl, on a connection of its
    own, the way a worker busy with a long step (a model call) keeps its lease;
    stops at the first refusal.  A worker frozen whole (SIGSTOP) stops renewing
    too: that is how a live worker's lease expires."""

    def __init__(self, dsn, token, ttl):
        super().__init__(daemon=True)
        self.conn = connect(dsn, application_name="chaos-heartbeat")
        self.token, self.interval = token, ttl / 4
        self.stopping = threading.Event()
        self.lost = None

    def run(self):
        while not self.stopping.wait(self.interval):
            try:
                self.conn.execute("SELECT durable_ledger.renew_lease(%s)", (self.token,))
            except psycopg.Error as e:
                if e.sqlstate != LEASE_LOST:
                    raise
                self.lost = e.diag.message_primary
                print(f"heartbeat: renew_lease refused, {LEASE_LOST}: {self.lost}", file=sys.stderr)
                return

    def stop(self):
        self.stopping.set()
        self.join()
        self.conn.close()


def take_token_lease(conn, run, ttl, rng):
    """Takes a token lease on run, polling while another lease holds it (a twin
    delivered at the same time, or a killed predecessor whose lease has not
    expired yet): take_lease never waits.  Returns (token, epoch)."""
    holder = f"chaos-worker-{os.getpid()}"
    while True:
        token, epoch = conn.execute(
            "SELECT token, epoch FROM durable_ledger.take_lease(%s, %s * interval '1 second', %s)",
            (run, ttl, holder)).fetchone()
        if token is not None:
            return token, epoch
        time.sleep(0.02 + rng.random() * 0.03)


def lease_lost(e):
    """A worker whose token lease is gone stops its attempt, writing nothing more."""
    print(f"lease lost, {e.sqlstate}: {e.diag.message_primary}", file=sys.stderr)
    sys.exit(LOST)


def reconcile_at_bank(conn, run, key, attempt, provider_key, patience=60):
    """A worker's reconciler (--reconcilers): once the tool's grace has passed by
    the server's clock (reconcilable_from; waited for, never guessed), asks the
    bank's lookup API by the provider key the lost attempt gave it, and records
    what the bank says (reconcile_effect).  False when the effect may not be
    reconciled (the pause is then left for the person, the orchestrator's
    reconciler)."""
    deadline = time.monotonic() + patience
    due_call, due_more = routed("durable_ledger.reconcilable_from(%s, %s)", run)
    while True:
        known, due = conn.execute(
            f"SELECT f IS NOT NULL, f <= clock_timestamp() FROM {due_call} f",
            (key, attempt) + due_more).fetchone()
        if not known or time.monotonic() > deadline:
            return False
        if due:
            break
        time.sleep(0.05)  # the grace: a request still in flight may yet land
    outcome, evidence, _ = bank_outcome(conn.execute(
        "SELECT id, status FROM bank_payments WHERE provider_key = %s ORDER BY id",
        (provider_key,)).fetchall())
    call, more = routed("durable_ledger.reconcile_effect(%s, %s, %s, %s)", run)
    conn.execute(f"SELECT {call}", (key, attempt, outcome == "completed", Jsonb(evidence)) + more)
    return True


def worker(dsn, run, plan, seed, lease="session", ttl=2.0, drift_chance=0.0, reconcilers=False):
    rng = random.Random(seed)
    # the memo this worker's model writes into its payments: as planned, or
    # worded anew (a separate random stream: the rest of the chaos is as ever)
    # (without drift, as a worker started on its own: no memo at all)
    drifting = random.Random(seed ^ 0x5eed).random() < drift_chance
    memo = (f"reworded by worker {os.getpid()}" if drifting else "as planned") if drift_chance else None
    if drifting:
        phase(rng, "memo reworded")
    # One connection for the ledger and the bank.  With a session lease, when
    # the lease ends (the connection closed), any try this worker made at the
    # bank is committed and visible.  With a token lease through a pooler, a
    # SIGKILLed worker's try still in flight commits or aborts within
    # milliseconds, long before its lease expires, the earliest the next
    # attempt (and the reconciler) can see its effect as unknown.
    conn = connect(dsn, application_name="chaos-worker")

    # A replacement first re-sends what its killed predecessors may or may not
    # have reported: every try this run made at the bank, in any order.
    tries = conn.execute("SELECT id, idempotency_key, attempt, status FROM bank_payments"
                         " WHERE run = %s ORDER BY id", (run,)).fetchall()
    rng.shuffle(tries)
    for bank_id, key, attempt, bank_status in tries:
        accepted, row = truthful_report(conn, key, attempt, bank_id, bank_status, run)
        if not accepted:
            rejected("a re-sent report", key, attempt, row)
    if tries:
        phase(rng, "reports re-sent")

    token, heartbeat = None, None
    if lease == "token":
        token, epoch = take_token_lease(conn, run, ttl, rng)
        heartbeat = Heartbeat(dsn, token, ttl)
        heartbeat.start()
        phase(rng, f"lease taken, epoch {epoch}")
    else:
        conn.execute("SELECT durable_ledger.acquire_run(%s)", (run,))

    def end_attempt():
        """A token lease is released, not left to expire: the next attempt need not wait."""
        if token is not None:
            heartbeat.stop()
            conn.execute("SELECT durable_ledger.release_lease(%s)", (token,))
        else:
            conn.execute("SELECT durable_ledger.release_run(%s)", (run,))

    declined = {}  # key -> (bank id, attempt) of the last decline this worker reported
    for step in plan:
        args = {"invoice": step["invoice"], "amount": step["amount"]}
        if memo is not None and not step.get("business_key"):
            args["memo"] = memo  # a business key names its operation: its args never drift
        while True:
            if token is None:
                key, decision, status, attempt, provider_key = conn.execute(
                    "SELECT key, decision, status, attempt, downstream_key"
                    "  FROM durable_ledger.begin_effect(%s, 'bank.pay', %s, %s)",
                    (run, Jsonb(args), step.get("business_key"))).fetchone()
            else:
                try:
                    key, decision, status, attempt, provider_key = conn.execute(
                        "SELECT key, decision, status, attempt, downstream_key"
                        "  FROM durable_ledger.begin_effect(%s, 'bank.pay', %s, %s, lease => %s)",
                        (run, Jsonb(args), step.get("business_key"), token)).fetchone()
                except psycopg.Error as e:
                    if e.sqlstate != LEASE_LOST:
                        raise
                    lease_lost(e)
            if decision == "execute":
                phase(rng, "intent recorded")
                earlier = declined.get(key)
                if earlier and earlier[1] < attempt and rng.random() < 0.7:
                    # The answer to its report of the earlier attempt "was lost", so the
                    # worker retries that report now, on the very lease that has just
                    # begun the next attempt: it must leave the next attempt in flight.
                    accepted, row = truthful_report(conn, key, earlier[1], earlier[0], "declined", run)
                    if token is not None and accepted and row[0] == attempt and row[1] == "unknown":
                        # the next attempt reads unknown only once its lease has ended: this
                        # worker's token lease expired meanwhile (its heartbeat was late)
                        print(f"lease lost, {LEASE_LOST}: the lease expired while the earlier "
                              "report was retried (expired)", file=sys.stderr)
                        sys.exit(LOST)
                    if not accepted or row[0] != attempt or row[1] != "started":
                        rejected("its retried report on an earlier attempt", key, earlier[1], row)
                    phase(rng, "earlier report retried")
                # The bank: declines the first tries of a key it was told to
                # decline, pays the others, deduplicates nothing.
                bank_id, bank_status = conn.execute(
                    "INSERT INTO bank_payments (invoice, amount, idempotency_key, attempt, run, status,"
                    "                           provider_key)"
                    " SELECT %(invoice)s, %(amount)s, %(key)s, %(attempt)s, %(run)s,"
                    "        CASE WHEN (SELECT count(*) FROM bank_payments WHERE idempotency_key = %(key)s)"
                    "                < COALESCE((SELECT declines FROM bank_declines"
                    "                             WHERE idempotency_key = %(key)s), 0)"
                    "             THEN 'declined' ELSE 'paid' END, %(provider_key)s"
                    " RETURNING id, status",
                    {"invoice": step["invoice"], "amount": step["amount"], "key": key,
                     "attempt": attempt, "run": run, "provider_key": provider_key}).fetchone()
                phase(rng, f"{bank_status} at the bank")
                accepted, row = truthful_report(conn, key, attempt, bank_id, bank_status, run)
                if not accepted:
                    rejected("its own report", key, attempt, row)
                if bank_status == "paid":
                    break
                declined[key] = (bank_id, attempt)
                phase(rng, "decline recorded")
                continue  # a business key is executed again: the next attempt
            if decision == "replay" and status == "completed":
                break
            if decision == "replay":
                continue  # it failed (never reached the bank): call again, the next occurrence
            if decision == "pause" and status == "unknown" and reconcilers \
                    and reconcile_at_bank(conn, run, key, attempt, provider_key):
                phase(rng, "reconciled from the bank")
                continue  # the call again: it replays the payment, or pays as the next attempt
            if decision == "pause":
                if token is not None:
                    end_attempt()
                sys.exit(PAUSED)
            time.sleep(0.01)  # in_progress: another run is paying this business key now
        phase(rng, "step done")
    end_attempt()
    conn.close()
    sys.exit(0)


# --------------------------------------------------------------------------
# The late reporter: re-sends reports, late and twice.
# --------------------------------------------------------------------------

def late_reporter(dsn, seed):
    """Re-sends the report of every try at the bank, after a random delay, once or
    twice, until a line arrives on stdin; then once more for every try, in random
    order.  Prints what the ledger made of them as one JSON line."""
    rng = random.Random(seed)
    conn = connect(dsn, application_name="chaos-late-reporter")
    stats = collections.Counter()

    def send(bank_id, key, attempt, bank_status):
        before = conn.execute("SELECT attempt, status::text FROM durable_ledger.effect_status(%s)",
                              (key,)).fetchone()
        accepted, row = truthful_report(conn, key, attempt, bank_id, bank_status)
        stats["sent"] += 1
        if not accepted:
            stats["rejected"] += 1
            print(f"# late report rejected: {key[:16]} attempt {attempt} ({bank_status}) -> "
                  f"attempt {row[0]}, {row[1]}, conflict {row[2]}", file=sys.stderr)
        elif row[0] > attempt:
            stats["on an earlier attempt"] += 1
            if before[0] > attempt and before[1] in ("started", "unknown"):
                stats["on an earlier attempt while a later one was in flight or unknown"] += 1
        elif before[0] == attempt and before[1] in ("started", "unknown"):
            stats["applied"] += 1
        else:
            stats["duplicates"] += 1

    last, tick, queue = 0, 0, []
    while not select.select([sys.stdin], [], [], 0.005)[0]:
        tick += 1
        for bank_try in conn.execute(
                "SELECT id, idempotency_key, attempt, status FROM bank_payments"
                " WHERE id > %s ORDER BY id", (last,)).fetchall():
            last = bank_try[0]
            for _ in range(rng.choice((1, 1, 2))):
                queue.append((tick + rng.randint(0, 60), bank_try))
        due = [t for when, t in queue if when <= tick]
        queue = [(when, t) for when, t in queue if when > tick]
        for bank_try in due:
            send(*bank_try)
    everything = conn.execute(
        "SELECT id, idempotency_key, attempt, status FROM bank_payments ORDER BY id").fetchall()
    rng.shuffle(everything)
    for bank_try in everything:
        send(*bank_try)
    conn.close()
    print(json.dumps(stats), flush=True)
    sys.exit(0)


# --------------------------------------------------------------------------
# The orchestrator.
# --------------------------------------------------------------------------

def make_plans(rng, runs, tenants=None):
    """Per run, a list of payments; how many bank payments each invoice must get;
    and how many tries the bank declines per business key.

    With tenants (through a proxy), run r belongs to tenant r % len(tenants) and is
    named "{tenant}chaos-run-r": the tenant is its routing key, and the invoices it
    shares with other runs through a business key are its tenant's own."""
    shared = {f"SHARED-{k}": 100 + k for k in range(max(2 if tenants is None else len(tenants), runs // 8))}
    declines = {invoice: rng.choice((0, 1, 1, 2)) for invoice in sorted(shared)}
    plans, expected = {}, {}
    for r in range(runs):
        run = f"chaos-run-{r}"
        shareable = sorted(shared)
        if tenants is not None:
            tenant = r % len(tenants)
            run = f"{{{tenants[tenant]}}}{run}"
            shareable = [inv for k, inv in enumerate(sorted(shared, key=lambda i: int(i.split("-")[1])))
                         if k % len(tenants) == tenant]
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
            invoice = rng.choice(shareable)
            plan.insert(rng.randint(0, len(plan)),
                        {"invoice": invoice, "amount": shared[invoice], "business_key": invoice})
            expected[invoice] = 1
        if rng.random() < 0.35:  # an order of this run's own that the bank declines first
            invoice = f"ORDER-{r}"
            declines[invoice] = rng.randint(1, 2)
            plan.insert(rng.randint(0, len(plan)),
                        {"invoice": invoice, "amount": rng.randint(10, 5000), "business_key": invoice})
            expected[invoice] = 1
        plans[run] = plan
    return plans, expected, declines


def with_user(dsn, user):
    return psycopg.conninfo.make_conninfo(dsn, user=user)


def setup(admin_dsn, declines, reconcile_grace=None, shard_dsns=()):
    """The bank (in --dsn's database) and the roles; through a proxy, the roles on
    every shard too (PL/Proxy connects to a shard as the calling role)."""
    for shard_dsn in shard_dsns:
        with psycopg.connect(shard_dsn, autocommit=True) as conn:
            conn.execute("""
                DO $$ BEGIN
                  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'chaos_worker') THEN
                    CREATE ROLE chaos_worker LOGIN; END IF;
                  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'chaos_reconciler') THEN
                    CREATE ROLE chaos_reconciler LOGIN; END IF;
                END $$;
                GRANT durable_ledger_worker TO chaos_worker;
                GRANT durable_ledger_admin TO chaos_reconciler;""")
    registered_at = shard_dsns[0] if shard_dsns else admin_dsn
    with psycopg.connect(registered_at, autocommit=True) as conn:
        registered = conn.execute("SELECT 1 FROM durable_ledger.tools WHERE tool = 'bank.pay'").fetchone()
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("""
            DROP TABLE IF EXISTS bank_payments, bank_declines;
            CREATE TABLE bank_payments (      -- a downstream API: no unique constraint
                id bigserial, invoice text, amount integer, idempotency_key text,
                attempt integer, run text, status text NOT NULL,
                provider_key text);               -- the key it was given: what its lookup API takes
            CREATE INDEX ON bank_payments (provider_key);
            CREATE TABLE bank_declines (      -- the bank declines the first tries of these
                idempotency_key text PRIMARY KEY, declines integer NOT NULL);
            DO $$ BEGIN
              IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'chaos_worker') THEN
                CREATE ROLE chaos_worker LOGIN; END IF;
              IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'chaos_reconciler') THEN
                CREATE ROLE chaos_reconciler LOGIN; END IF;
            END $$;
            GRANT durable_ledger_worker TO chaos_worker;
            GRANT durable_ledger_admin TO chaos_reconciler;
            GRANT INSERT, SELECT ON bank_payments TO chaos_worker;
            GRANT SELECT ON bank_declines TO chaos_worker;
            GRANT USAGE ON SEQUENCE bank_payments_id_seq TO chaos_worker;
            GRANT SELECT ON bank_payments TO chaos_reconciler;
        """)
        # bank.pay changes the world: reviewed, with the default divergence policy (pause)
        if not registered:
            conn.execute("SELECT durable_ledger.register_tool('bank.pay', 'fleet-chaos', note => 'the bank')")
        # with --reconcilers the workers settle unknown outcomes from the bank's lookup API
        conn.execute("SELECT durable_ledger.set_reconcile('bank.pay', %s, 'fleet-chaos')", (reconcile_grace,))
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO bank_declines VALUES (%s, %s)", sorted(declines.items()))


class Forked:
    """A worker process forked from the orchestrator, which has psycopg imported
    already: no interpreter start-up per worker, which is most of a short run's
    time.  The little of subprocess.Popen that the orchestrator uses."""

    def __init__(self, target, *args):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the worker: its own stdout and stderr, nothing else inherited
            code = 1
            try:
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.closerange(3, os.sysconf("SC_OPEN_MAX"))
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                try:
                    target(*args)
                    code = 0
                except SystemExit as e:
                    code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
                except BaseException:
                    traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        os.close(out_w)
        os.close(err_w)
        self.stdout = os.fdopen(out_r, "rb")
        self.stderr = os.fdopen(err_r, "rb")
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def wait(self):
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


class AttemptMovedOn(Exception):
    """The effect went on to a later attempt than the one the bank was asked about."""


def resolve_drift(conn, run, key, args, may_duplicate, stats):
    """A drifted call: the same payment as the earlier effect it may duplicate
    when it pays the same invoice the same amount (only the memo was reworded)."""
    call, more = routed("durable_ledger.effect_status(%s)", run)
    earlier = conn.execute(f"SELECT args FROM {call}", (may_duplicate,) + more).fetchone()[0]
    same = earlier["invoice"] == args["invoice"] and earlier["amount"] == args["amount"]
    verdict = "same" if same else "distinct"
    call, more = routed("durable_ledger.resolve_divergence(%s, %s, 'chaos-reconciler', %s)", run)
    try:
        conn.execute(f"SELECT {call}",
                     (key, verdict, f"compared with {may_duplicate[:12]}: memo {args.get('memo')!r}") + more)
        stats[f"drifts resolved as {verdict}"] += 1
    except psycopg.errors.ObjectNotInPrerequisiteState as e:
        print(f"# divergence not resolved, {key[:12]}: {e.diag.message_primary}")


def reconcile(reconciler_dsn, stats, unknown_outcomes=True):
    """Ask the bank about the attempt of every effect that needs a person, and
    resolve that attempt -- never another one; judge every drifted call.  With
    unknown_outcomes False (--reconcilers: the workers settle those), only the
    drifted calls: an unknown outcome left here stays unresolved, and the final
    check says so."""
    with connect(reconciler_dsn, application_name="chaos-reconciler") as conn:
        for key, run, attempt, conflict, args, may_duplicate in conn.execute(
                "SELECT key, run, attempt, conflict, args, may_duplicate FROM durable_ledger.unresolved"
                " ORDER BY created_at").fetchall():
            if may_duplicate is not None:
                resolve_drift(conn, run, key, args, may_duplicate, stats)
                continue
            if conflict or not unknown_outcomes:
                continue  # a contradiction is a bug here; the final check reports it
            # the lease of this attempt has ended, so its try at the bank, if any, is committed
            outcome, value, note = bank_outcome(conn.execute(
                "SELECT id, status FROM bank_payments"
                " WHERE idempotency_key = %s AND attempt = %s ORDER BY id", (key, attempt)).fetchall())
            # resolve_effect decides the key's current attempt: a view read is not a
            # lock, and meanwhile a late report may have settled this attempt and a
            # later one begun.  The resolution is kept only if it decided the attempt
            # the bank was asked about (the row stays locked until COMMIT).
            # (Through a proxy, a call is committed on its shard when it returns, whatever
            # the transaction does: the resolution names its attempt, and the shard
            # refuses it for any other, 55000.)
            try:
                with conn.transaction():
                    if ROUTED:
                        resolved = conn.execute(
                            "SELECT attempt FROM durable_ledger.resolve_effect(%s, %s, %s, 'chaos-reconciler', %s,"
                            "                                                 attempt => %s, run => %s)",
                            (key, outcome, Jsonb(value), f"attempt {attempt}: {note}", attempt, run)).fetchone()[0]
                    else:
                        resolved = conn.execute(
                            "SELECT attempt FROM durable_ledger.resolve_effect(%s, %s, %s, 'chaos-reconciler', %s)",
                            (key, outcome, Jsonb(value), f"attempt {attempt}: {note}")).fetchone()[0]
                    if resolved != attempt:
                        raise AttemptMovedOn(resolved)
                stats["resolved by the reconciler"] += 1
            except AttemptMovedOn as moved:
                stats["resolutions withdrawn (attempt moved on)"] += 1
                print(f"# not resolved, {key[:12]}: asked the bank about attempt {attempt}, "
                      f"the effect is at attempt {moved.args[0]} now")
            except psycopg.errors.ObjectNotInPrerequisiteState as e:
                print(f"# not resolved, {key[:12]}: {e.diag.message_primary}")


def tenants_over(shard_dsns, proxy_dsn, per_shard=2):
    """Tenant names (routing keys) that the proxy places on every shard, per_shard each."""
    tenants, placed = [], collections.Counter()
    with psycopg.connect(proxy_dsn, autocommit=True) as conn:
        n = 0
        while len(tenants) < per_shard * len(shard_dsns):
            name = f"tenant-{n}"
            shard = conn.execute("SELECT durable_ledger_proxy.shard_of(%s)", (name,)).fetchone()[0]
            if placed[shard] < per_shard:
                placed[shard] += 1
                tenants.append(name)
            n += 1
    return tenants


def orchestrate(args):
    rng = random.Random(args.seed)
    admin_dsn = args.dsn
    # the fleet's connections: direct, or through the pooler
    fleet_dsn = args.pooler_dsn or admin_dsn
    worker_dsn = with_user(fleet_dsn, "chaos_worker")
    reconciler_dsn = with_user(fleet_dsn, "chaos_reconciler")
    tenants = tenants_over(args.shard_dsn, admin_dsn) if args.shard_dsn else None
    plans, expected, declines = make_plans(rng, args.runs, tenants)
    # The grace: with session leases a lost worker's try at the bank is committed
    # before its lease ends (one connection for both), so none is needed; with
    # token leases a frozen worker may make its try once resumed, up to ttl * 1.5
    # + 0.5 s after it was frozen (while its lease was live): wait well past that.
    grace = None
    if args.reconcilers:
        grace = "0" if args.lease == "session" else f"{args.ttl * 3 + 2} seconds"
    setup(admin_dsn, declines, grace, args.shard_dsn or ())

    pending = sorted(plans)           # runs to (re)deliver
    done = set()
    live = []                         # (process, run)
    selector = selectors.DefaultSelector()
    stats = collections.Counter({"workers started": 0, "killed": 0, "delivered twice": 0,
                                 "paused": 0, "resolved by the reconciler": 0, "errors": 0,
                                 "earlier reports retried with the next attempt in flight": 0})
    if args.lease == "token":
        stats["frozen past their ttl"] = 0
        stats["attempts ended by a lost lease"] = 0
    kills_left = args.kills
    deadline = time.monotonic() + args.timeout

    # Zombies (token leases only): a worker frozen with SIGSTOP at a step it
    # reports, for longer than its lease lives, then resumed.  Its heartbeat is
    # frozen too, so its lease expires (and a twin may take the run over); once
    # resumed, its next begin_effect is refused (55L01).  It may have been
    # frozen between an intent and its try at the bank, and makes that try
    # once resumed, so while a zombie is alive (frozen or resumed) the
    # reconciler waits: asking the bank about an attempt is sound only when
    # nobody who might still make that try is alive.  Runs that pause
    # meanwhile are parked until then.  (A separate random stream: the session
    # mode's chaos is the same as ever for a given seed.)
    freeze_rng = random.Random(args.seed + 1)
    freezes_left = args.freezes
    frozen = {}                       # process -> when to resume it
    zombies = set()                   # every process ever frozen
    parked = []                       # paused runs waiting for the reconciler
    reconcile_due = False

    # Through a pooler: how many server connections the fleet's role used at
    # once, against how many worker processes were connected at once.
    pooling = collections.Counter()
    sampler = psycopg.connect(admin_dsn, autocommit=True) if args.pooler_dsn else None
    next_sample = 0.0

    me = os.path.abspath(__file__)
    reporter = subprocess.Popen(
        [sys.executable, me, "reporter", "--dsn", worker_dsn, "--seed", str(rng.randrange(2**32))]
        + (["--pooled"] if args.pooler_dsn else []),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def start(run):
        proc = Forked(worker, worker_dsn, run, plans[run], rng.randrange(2**32), args.lease, args.ttl,
                      args.drift_chance, args.reconcilers)
        live.append((proc, run))
        selector.register(proc.stdout, selectors.EVENT_READ, proc)
        stats["workers started"] += 1

    while (pending or live or parked) and time.monotonic() < deadline:
        while pending and len(live) < args.workers:
            run = pending.pop(rng.randrange(len(pending)))
            start(run)
            # (with token leases the first delivery is always doubled, so that a twin
            # really polls take_lease while the run's lease is held)
            if (rng.random() < 0.2 or (args.lease == "token" and not stats["delivered twice"])) \
                    and len(live) < args.workers:
                start(run)  # the queue redelivers: two workers on one run at once
                stats["delivered twice"] += 1

        # a worker reports each step; now and then it is killed right there
        for event, _ in selector.select(timeout=0.01):
            proc = event.data
            heard = os.read(proc.stdout.fileno(), 65536)  # unbuffered: every step it reported
            if not heard:
                selector.unregister(proc.stdout)
                continue
            stats["earlier reports retried with the next attempt in flight"] += \
                heard.count(b"earlier report retried")
            stats["workers whose memo drifted"] += heard.count(b"memo reworded")
            stats["unknown outcomes reconciled by workers"] += heard.count(b"reconciled from the bank")
            for _ in range(heard.count(b"\n")):
                if kills_left > 0 and rng.random() < args.kill_chance and proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)  # the pod is evicted
                    kills_left -= 1
                    stats["killed"] += 1
                    break
                if freezes_left > 0 and proc not in frozen and proc.poll() is None \
                        and freeze_rng.random() < args.freeze_chance:
                    proc.send_signal(signal.SIGSTOP)  # the VM is suspended, or a long GC pause
                    frozen[proc] = time.monotonic() + args.ttl * 1.5 + 0.5
                    zombies.add(proc)
                    freezes_left -= 1
                    stats["frozen past their ttl"] += 1
                    break
        for proc, when in list(frozen.items()):
            if time.monotonic() >= when or proc.poll() is not None:
                proc.send_signal(signal.SIGCONT)
                del frozen[proc]

        if sampler is not None and time.monotonic() >= next_sample:
            next_sample = time.monotonic() + 0.05
            servers = sampler.execute("SELECT count(*) FROM pg_stat_activity"
                                      " WHERE usename = 'chaos_worker'"
                                      "   AND datname = current_database()").fetchone()[0]
            pooling["server connections"] = max(pooling["server connections"], servers)
            pooling["worker processes"] = max(pooling["worker processes"], len(live))

        zombies = {proc for proc in zombies if proc.poll() is None}
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
            elif code == LOST and args.lease == "token":
                stats["attempts ended by a lost lease"] += 1
                said = [line for line in err.splitlines() if line.startswith("lease lost, ")]
                for why in ("expired", "superseded", "released"):
                    stats[f"lost leases {why}"] += sum(why in line for line in said)
            elif code != -signal.SIGKILL:
                stats["errors"] += 1
                print(f"# worker for {run} exited with {code}: {err.strip()[-400:]}")
            # restart the interrupted run, unless its twin already finished it
            if run not in done and run not in pending and run not in parked \
                    and all(r != run for _, r in live):
                (parked if code == PAUSED and zombies else pending).append(run)
        reconcile_due = reconcile_due or need_reconcile
        if reconcile_due and not zombies:
            reconcile(reconciler_dsn, stats, not args.reconcilers)
            reconcile_due = False
            pending += [run for run in parked if all(r != run for _, r in live)]
            parked = []

    for proc, _ in live:
        proc.kill()
        proc.wait()
    # the last late reports, then what the killed workers left unknown after their last attempt
    out, _ = reporter.communicate("stop\n", timeout=max(60, args.timeout))
    if reporter.returncode != 0:
        stats["errors"] += 1
        print(f"# the late reporter exited with {reporter.returncode}")
    late = collections.Counter(json.loads(out.strip().splitlines()[-1]) if out.strip() else {})
    reconcile(reconciler_dsn, stats, not args.reconcilers)
    if sampler is not None:
        sampler.close()
    return plans, expected, done, stats, late, pooling


def check(dsn, plans, expected, done, stats, late, lease="session", pooling=None, reconcilers=False,
          shard_dsns=()):
    """The checks.  The bank is in dsn's database; the ledger too, or, through a
    proxy, on the shards: its rows are then read from each shard (in shard order,
    so an audit log stays in each key's own order)."""
    failures, checks = 0, 0

    def report(ok, what):
        nonlocal failures, checks
        print(("ok - " if ok else "not ok - ") + what)
        checks += 1
        failures += 0 if ok else 1

    def some(items, n=6):
        items = sorted(items, key=repr)
        return f": {items[:n]}" + (" ..." if len(items) > n else "") if items else ""

    ledgers = [psycopg.connect(d, autocommit=True) for d in shard_dsns]

    def ledger(sql, params=()):
        """The rows of a query of the ledger's tables: the shards' together, or dsn's."""
        return [row for c in (ledgers or [conn]) for row in c.execute(sql, params).fetchall()]

    def ledger_count(sql, params=()):
        return sum(row[0] for row in ledger(sql, params))

    with psycopg.connect(dsn, autocommit=True) as conn:
        # A lease of a worker killed last ends after the kill (a session lease with its
        # backend, a token lease at its expiry): the state is read once every lease has
        # ended, waiting a minute at most (a lease still held then is reported below).
        deadline = time.monotonic() + 60
        while ledger_count("SELECT count(*) FROM durable_ledger.leases") \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        paid = dict(conn.execute(
            "SELECT invoice, count(*) FROM bank_payments WHERE status = 'paid' GROUP BY invoice").fetchall())
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT idempotency_key FROM bank_payments WHERE status = 'paid'"
            " GROUP BY 1 HAVING count(*) > 1) s").fetchone()[0]
        unresolved = ledger_count("SELECT count(*) FROM durable_ledger.unresolved")
        conflicts = ledger_count("SELECT count(*) FROM durable_ledger.effects WHERE conflict")
        leases = ledger_count("SELECT count(*) FROM durable_ledger.leases")
        bank = conn.execute("SELECT id, idempotency_key, attempt, run, status FROM bank_payments"
                            " ORDER BY id").fetchall()
        effects = {row[0]: row[1:] for row in ledger(
            "SELECT key, attempt, status::text, result, error, run, business_key"
            "  FROM durable_ledger.effects")}
        past = {(row[0], row[1]): row[2:] for row in ledger(
            "SELECT key, attempt, status::text, error, run FROM durable_ledger.past_attempts")}
        audit = ledger(
            "SELECT id, key, event::text, attempt, run, lease_epoch, detail FROM durable_ledger.audit_log"
            " WHERE key IS NOT NULL ORDER BY id")
        declined_keys = [k for (k,) in conn.execute(
            "SELECT idempotency_key FROM bank_declines WHERE declines > 0").fetchall()]
        counts = ledger(
            "SELECT count(*), count(*) FILTER (WHERE verdict IS NULL) FROM durable_ledger.divergences"
            " WHERE run = ANY(%s)", (sorted(plans),))
        drifts, undecided = sum(c[0] for c in counts), sum(c[1] for c in counts)
        lease_kinds = collections.Counter()
        for kind, n in ledger(
                "SELECT COALESCE(detail->>'kind', 'session'), count(*) FROM durable_ledger.audit_log"
                " WHERE event = 'lease_acquired' GROUP BY 1"):
            lease_kinds[kind] += n
    shards_used = [c.execute("SELECT count(*) FROM durable_ledger.runs WHERE run = ANY(%s)",
                             (sorted(plans),)).fetchone()[0] for c in ledgers]
    for c in ledgers:
        c.close()

    if ledgers:
        report(all(shards_used), f"the runs were spread over every shard ({shards_used} runs per shard)")
    wrong = {inv: (paid.get(inv, 0), n) for inv, n in expected.items() if paid.get(inv, 0) != n}
    report(done == set(plans), f"every run finished ({len(done)} of {len(plans)})")
    report(not wrong, f"every invoice paid exactly as often as planned ({len(expected)} invoices, "
                      f"{sum(expected.values())} payments)" + (f": wrong {sorted(wrong.items())[:10]}" if wrong else ""))
    report(set(paid) <= set(expected), "no payment for an invoice nobody planned")
    report(twice == 0, f"no idempotency key paid twice ({twice})")
    if stats["workers whose memo drifted"]:
        report(drifts > 0 and undecided == 0,
               f"replays whose memo drifted paused and were resolved by the reconciler ({drifts} drifted "
               f"calls, {stats['drifts resolved as same']} the same payment, "
               f"{stats['drifts resolved as distinct']} distinct, {undecided} undecided)")

    # the bank's tries, per (key, attempt)
    tries = collections.defaultdict(list)
    for bank_id, key, attempt, run, status in bank:
        tries[(key, attempt)].append((bank_id, run, status))
    business = {key for key, e in effects.items() if e[5]}
    bk_paid = collections.Counter(key for (key, _), ts in tries.items() for t in ts
                                  if t[2] == "paid" and key in business)
    retried = {key for key in business if effects[key][0] > 1}
    report(all(n == 1 for n in bk_paid.values()) and bk_paid.keys() == business,
           f"every business-key operation paid exactly once ({len(business)} keys, "
           f"{len(retried)} executed again after a decline)"
           + some(k for k in business if bk_paid.get(k) != 1))
    report(all(len(ts) == 1 for ts in tries.values()),
           f"no attempt tried at the bank twice ({len(tries)} tries)"
           + some(ka for ka, ts in tries.items() if len(ts) != 1))

    def expected_outcome(key, attempt):
        """What the ledger must say about (key, attempt), from the bank alone."""
        ts = tries.get((key, attempt), [])
        if any(t[2] == "paid" for t in ts):
            return "completed", payment(min(t[0] for t in ts if t[2] == "paid"))
        if ts:
            return "failed", decline(ts[0][0])
        return "failed", NOT_AT_THE_BANK

    # Every try at the bank belongs to an attempt the ledger knows, made by that attempt's run.
    strays = []
    for (key, attempt), ts in tries.items():
        e = effects.get(key)
        if e is None or attempt is None or attempt > e[0] or attempt < 1:
            strays.append((key[:16], attempt, "no such attempt"))
            continue
        run = e[4] if attempt == e[0] else (past.get((key, attempt)) or (None, None, None))[2]
        strays += [(key[:16], attempt, t[1], run) for t in ts if t[1] != run]
    report(not strays, "every try at the bank was made under the attempt, and by the run, the ledger "
                       "records for it" + some(strays))

    # The ledger's record of every attempt, current and replaced, agrees with the bank.
    disagree = []
    for key, (attempt, status, result, error, run, is_business) in effects.items():
        want = expected_outcome(key, attempt)
        got = (status, result if status == "completed" else error)
        if got != want:
            disagree.append((key[:16], attempt, got, want))
        have = sorted(a for (k, a) in past if k == key)
        if have != list(range(1, attempt)):
            disagree.append((key[:16], "past attempts", have, attempt))
    for (key, attempt), (status, error, run) in past.items():
        want = expected_outcome(key, attempt)
        if (status, error) != want:
            disagree.append((key[:16], attempt, "replaced", (status, error), want))
    report(not disagree, f"every attempt's record agrees with what the bank did for that very attempt "
                         f"({len(effects)} effects, {len(past)} replaced attempts)" + some(disagree))

    # The audit log: every report filed under its own attempt, run and epoch, saying
    # what the bank did for that attempt; and per key, an attempt executed only after
    # the one before it failed.
    misfiled, sequence = [], []
    intents = {}
    state = {}  # key -> (current attempt, its state)
    for _id, key, event, attempt, run, epoch, detail in audit:
        detail = detail or {}
        cur, st = state.get(key, (0, None))
        if event == "intent":
            intents[(key, attempt)] = (run, epoch)
            if attempt != cur + 1 or (cur and st != "failed"):
                sequence.append((key[:16], f"attempt {attempt} executed", f"attempt {cur} was {st}"))
            state[key] = (attempt, "started")
            continue
        if event not in ("completed", "late_completion", "failed", "late_failure", "resolved", "reconciled"):
            continue
        if attempt is None or intents.get((key, attempt)) != (run, epoch):
            misfiled.append((key[:16], event, attempt, run, epoch, intents.get((key, attempt))))
            continue
        if attempt != cur or st not in ("started", "unknown"):
            sequence.append((key[:16], f"{event} on attempt {attempt}", f"attempt {cur} was {st}"))
        outcome, value = expected_outcome(key, attempt)
        if event == "resolved":
            said = (detail.get("outcome"), detail.get("result" if detail.get("outcome") == "completed" else "error"))
        elif event == "reconciled":
            said = ("completed" if detail.get("happened") else "failed", detail.get("evidence"))
        elif event in ("completed", "late_completion"):
            said = ("completed", value if outcome == "completed" else "a completion")
        else:
            said = ("failed", detail.get("error"))
        if said != (outcome, value):
            misfiled.append((key[:16], event, attempt, said, (outcome, value)))
        state[key] = (attempt, said[0])
    report(not misfiled, f"no report landed on another attempt: every report in the audit log is filed under "
                         f"its own attempt, run and epoch and says what the bank did then "
                         f"({sum(1 for a in audit if a[2] != 'intent')} events)" + some(misfiled))
    report(not sequence, "no attempt executed while an earlier one was unknown, in flight or completed"
           + some(sequence))

    report(unresolved == 0, f"nothing unresolved ({unresolved})")
    report(conflicts == 0, f"no contradicting reports ({conflicts})")
    report(late["rejected"] == 0, f"every truthful late report was accepted ({late['rejected']} rejected)")
    report(leases == 0, f"no lease left held ({leases})")
    if reconcilers:
        reconciled = sum(1 for a in audit if a[2] == "reconciled")
        report(reconciled > 0 and stats["resolved by the reconciler"] == 0,
               f"every unknown outcome settled by the workers' reconcilers from the bank's lookup API, "
               f"none left for a person ({reconciled} reconciled, "
               f"{stats['resolved by the reconciler']} resolved by a person)")
    report(stats["killed"] > 0 and (stats["paused"] > 0 or stats["unknown outcomes reconciled by workers"] > 0)
           and (stats["frozen past their ttl"] == 0 or stats["attempts ended by a lost lease"] > 0),
           "the chaos happened: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
    declined_tries = sum(1 for row in bank if row[4] == "declined")
    in_flight = stats["earlier reports retried with the next attempt in flight"]
    report(declined_tries > 0 and retried and late["on an earlier attempt"] > 0 and late["duplicates"] > 0
           and in_flight > 0,
           f"business keys were declined and executed again, and reports came late and twice: "
           f"{len(declined_keys)} keys set to decline, {declined_tries} declined tries, "
           f"{in_flight} reports on an earlier attempt retried by the lease that had begun the next, "
           f"late reports " + ", ".join(f"{k} {v}" for k, v in sorted(late.items())))
    if lease == "token":
        report(lease_kinds["session"] == 0 and lease_kinds["token"] > 0,
               f"every attempt held a token lease, none a session lease "
               f"({lease_kinds['token']} token leases, {lease_kinds['session']} session leases)")
    if pooling is not None:
        report(0 < pooling["server connections"] < pooling["worker processes"],
               f"through the pooler, the workers and the late reporter shared at most "
               f"{pooling['server connections']} server connections while up to "
               f"{pooling['worker processes']} worker processes ran at once")
    report(stats["errors"] == 0, f"no worker failed other than by SIGKILL, pause or a lost lease "
                                 f"({stats['errors']})" if lease == "token" else
           f"no worker failed other than by SIGKILL or pause ({stats['errors']})")
    print(f"{checks - failures} passed, {failures} failed")
    return failures


def main():
    global POOLED, HOLD_AT, ROUTED
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="orchestrator",
                        choices=["orchestrator", "setup", "worker", "reporter"])
    parser.add_argument("--dsn", required=True,
                        help="the orchestrator's direct connection, as a superuser "
                             "(the worker and reporter roles: their own connection)")
    parser.add_argument("--lease", choices=["session", "token"], default="session",
                        help="the workers' kind of lease")
    parser.add_argument("--pooler-dsn",
                        help="the workers, the late reporter and the reconciler connect here, through a "
                             "transaction pooler (with --lease token: session leases do not work there)")
    parser.add_argument("--ttl", type=float, default=2.0,
                        help="seconds a token lease lives between renewals")
    parser.add_argument("--freezes", type=int,
                        help="workers frozen (SIGSTOP) past their ttl and resumed; token leases only "
                             "(default 6 with --lease token)")
    parser.add_argument("--freeze-chance", type=float, default=0.02,
                        help="chance that a worker is frozen at a step it reports")
    parser.add_argument("--pooled", action="store_true",
                        help="a worker's or reporter's --dsn goes through a transaction pooler")
    parser.add_argument("--hold", help="a worker waits for a line on stdin after printing this phase")
    parser.add_argument("--routed", action="store_true",
                        help="a worker's or reporter's --dsn is a proxy database (set by the orchestrator)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--kills", type=int, default=60)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=240,
                        help="seconds before the orchestrator gives up")
    parser.add_argument("--kill-chance", type=float, default=0.15,
                        help="chance that a worker is killed at a step it reports")
    parser.add_argument("--drift-chance", type=float,
                        help="chance that a worker's model rewords its payments' memo "
                             "(default 0.3; 0 for a worker started on its own)")
    parser.add_argument("--reconcilers", action="store_true",
                        help="the workers settle unknown outcomes themselves from the bank's lookup API "
                             "(bank.pay reconcilable: set_reconcile), instead of leaving them for a person")
    parser.add_argument("--shard-dsn", action="append",
                        help="through a proxy: --dsn is the proxy's database (durable_ledger_proxy, the bank "
                             "there too), and this the ledger database of a shard, as a superuser, once per "
                             "shard in order (roles are created there, the ledger's rows checked there)")
    parser.add_argument("--run")
    parser.add_argument("--plan")
    args = parser.parse_args()
    if args.pooler_dsn and args.lease != "token":
        parser.error("--pooler-dsn needs --lease token: a session lease does not survive transaction pooling")
    if args.freezes is None:
        args.freezes = 6 if args.lease == "token" else 0
    if args.freezes and args.lease != "token":
        parser.error("--freezes needs --lease token: a frozen worker keeps its session lease")
    if args.drift_chance is None and args.role == "orchestrator":
        args.drift_chance = 0.3
    POOLED = args.pooled or bool(args.pooler_dsn)
    ROUTED = bool(args.shard_dsn) or args.routed
    HOLD_AT = args.hold
    if args.role == "setup":
        setup(args.dsn, {})
        sys.exit(0)
    if args.role == "worker":
        worker(args.dsn, args.run, json.loads(args.plan), args.seed, args.lease, args.ttl,
               args.drift_chance or 0.0)
    if args.role == "reporter":
        late_reporter(args.dsn, args.seed)
    try:
        plans, expected, done, stats, late, pooling = orchestrate(args)
    except Exception as e:  # report it as a failed check, not a bare traceback
        print(f"not ok - the orchestrator ran to its end: {type(e).__name__}: {e}")
        print("0 passed, 1 failed")
        raise
    sys.exit(1 if check(args.dsn, plans, expected, done, stats, late, args.lease,
                        pooling if args.pooler_dsn else None, args.reconcilers, args.shard_dsn or ()) else 0)


if __name__ == "__main__":
    main()
