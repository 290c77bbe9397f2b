#!/usr/bin/python3
"""The durable_ledger demo: the double payment, and its cure, with real processes.

An accounts-payable worker pays invoice INV-9 ($4,200) into a "bank" table that,
like a real payment API, accepts whatever it is sent.  Workers are separate OS
processes; "the pod is evicted" is a SIGKILL sent by the orchestrator (this
script).  Run by demo/run.sh (`make demo`) against a throwaway cluster.
"""

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psycopg
from psycopg.types.json import Jsonb

PAY_ARGS = {"invoice": "INV-9", "amount": 4200, "currency": "USD"}


# --------------------------------------------------------------------------
# Workers (each runs in its own process)
# --------------------------------------------------------------------------

def say(text):
    print(f"      [worker {os.getpid()}] {text}", flush=True)


def bank_pay(conn, run, invoice, amount, idempotency_key=None):
    """The downstream payment API: it pays whatever it is asked to pay."""
    return conn.execute(
        "INSERT INTO bank_payments (invoice, amount, idempotency_key, run)"
        " VALUES (%s, %s, %s, %s) RETURNING id",
        (invoice, amount, idempotency_key, run)).fetchone()[0]


def naive_worker(dsn, run):
    """Pays, then would acknowledge the job; no ledger."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        payment = bank_pay(conn, run, PAY_ARGS["invoice"], PAY_ARGS["amount"])
        say(f"paid INV-9 $4,200 (payment {payment}); acknowledging the job ...")
        time.sleep(30)  # the orchestrator kills us here


def reconcile_from_bank(conn, key, attempt, provider_key):
    """A reconciler: once the tool's grace has passed (reconcilable_from, by the
    server's clock), ask the bank by the key it was given and record its answer."""
    while True:
        when, due = conn.execute("SELECT f, f <= clock_timestamp()"
                                 "  FROM durable_ledger.reconcilable_from(%s, %s) f",
                                 (key, attempt)).fetchone()
        if when is None:
            return False  # not the workers' to settle: a person decides
        if due:
            break
        time.sleep(0.1)  # the grace: a request still in flight may yet land
    payment = conn.execute("SELECT id FROM bank_payments WHERE idempotency_key = %s",
                           (provider_key,)).fetchone()
    found = {"payment_id": payment[0]} if payment else {"lookup": "no payment with that key"}
    say(f"the bank's lookup by the key: {found}; reconcile_effect(..., happened => {payment is not None})")
    conn.execute("SELECT durable_ledger.reconcile_effect(%s, %s, %s, %s)",
                 (key, attempt, payment is not None, Jsonb(found)))
    return True


def ledger_worker(dsn, run, calls, die_after, memo=None, reconcile=False, invoice=None, amount=None):
    """Pays through the ledger.  calls: how many identical payments the run makes.
    die_after: 'paid' (killed after recording the result), 'intent' (killed
    between intent and completion), or 'never'.  memo: the free text a model
    writes into the payment (worded anew on every replay).  reconcile: an
    unknown outcome is settled from the bank's record, not left for a person.
    invoice, amount: another payment than INV-9's $4,200."""
    args = dict(PAY_ARGS, **({"memo": memo} if memo else {}))
    args.update({k: v for k, v in (("invoice", invoice), ("amount", amount)) if v is not None})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT durable_ledger.acquire_run(%s)", (run,))  # an attempt begins: the lease
        for _ in range(calls):
            if memo:
                say(f"the model asks to pay {args['invoice']} ${args['amount']:,} with memo {memo!r}")
            key, decision, status, occurrence, result, reason, attempt, provider_key = conn.execute(
                "SELECT key, decision, status, occurrence, result, reason, attempt, downstream_key"
                "  FROM durable_ledger.begin_effect(%s, 'bank.pay', %s)",
                (run, Jsonb(args))).fetchone()
            if decision == "pause" and status == "unknown" and reconcile:
                say("PAUSE: the outcome is unknown; asking the bank instead of a person ...")
                if reconcile_from_bank(conn, key, attempt, provider_key):
                    key, decision, status, occurrence, result, reason = conn.execute(
                        "SELECT key, decision, status, occurrence, result, reason"
                        "  FROM durable_ledger.begin_effect(%s, 'bank.pay', %s)",
                        (run, Jsonb(args))).fetchone()
            say(f"begin_effect -> {decision} (occurrence {occurrence}, key {key[:12]}…)")
            if decision == "execute":
                if die_after == "intent":
                    say("intent recorded; calling the bank ...")
                    payment = bank_pay(conn, run, args["invoice"], args["amount"], key)
                    time.sleep(30)  # killed before complete_effect: nobody knows the bank answered
                payment = bank_pay(conn, run, args["invoice"], args["amount"], key)
                conn.execute("SELECT durable_ledger.complete_effect(%s, %s)",
                             (key, Jsonb({"payment_id": payment})))
                say(f"paid (payment {payment}) and recorded it with complete_effect")
            elif decision == "replay":
                say(f"not paying again: recorded result {result}")
            elif decision == "pause":
                say("PAUSE: " + reason)
                sys.exit(3)
            else:
                say(f"{decision}: {reason}")
                sys.exit(4)
        if die_after == "paid":
            say("acknowledging the job ...")
            time.sleep(30)  # the orchestrator kills us here
        conn.execute("SELECT durable_ledger.release_run(%s)", (run,))
        say("done; lease released")


def email_loop_worker(dsn, run, tries):
    """The seeds' onboarding agent: a retry loop that fires on a network partition and
    has the model word the welcome email anew each time.  Each try is a new call to the
    ledger (new args): only a budget stops the loop."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        for n in range(1, tries + 1):
            args = {"to": "ann@example.com", "body": f"Welcome aboard, Ann! (worded anew, try {n})"}
            key, decision, reason = conn.execute(
                "SELECT key, decision, reason FROM durable_ledger.begin_effect(%s, 'mail.send', %s)",
                (run, Jsonb(args))).fetchone()
            if decision != "execute":
                say(f"begin_effect -> {decision}: {reason}")
                sys.exit(3)
            conn.execute("INSERT INTO mailbox (run, body) VALUES (%s, %s)", (run, args["body"]))
            conn.execute("SELECT durable_ledger.complete_effect(%s, '{\"sent\": true}')", (key,))
            say(f"sent email {n}; the network times out before the answer: the loop tries again")
        say("done")


# --------------------------------------------------------------------------
# The orchestrator and the story
# --------------------------------------------------------------------------

def spawn(dsn, *args):
    return subprocess.Popen([sys.executable, __file__, "--dsn", dsn, *args],
                            stdout=subprocess.PIPE, text=True, bufsize=1)


def follow_together(*procs):
    """Echo several workers' lines in the order they arrive, until all exit."""
    threads = [threading.Thread(target=follow, args=(p,)) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def follow(proc, until=None):
    """Echo a worker's lines; return when it exits or prints `until`."""
    for line in proc.stdout:
        print(line, end="", flush=True)
        if until and until in line:
            return
    proc.wait()


def evict(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    print("      [orchestrator] SIGKILL: the pod is evicted before it acknowledged the job")


def evict_once_paid(conn, proc, run):
    """The bank has the payment (waited for, a minute at most): then the pod is
    evicted, before the worker records it.  False when the payment never came."""
    deadline = time.monotonic() + 60
    while bank_count(conn, run) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    paid = bank_count(conn, run) > 0
    evict(proc)
    if not paid:
        print("   !! the worker's payment never reached the bank")
    return paid


def bank_count(conn, run):
    return conn.execute("SELECT count(*) FROM bank_payments WHERE run = %s", (run,)).fetchone()[0]


def heading(n, title):
    print(f"\n{'=' * 78}\n {n}. {title}\n{'=' * 78}")


def verdict(conn, run, expected, text):
    paid = bank_count(conn, run)
    mark = "OK " if paid == expected else "!! "
    print(f"   {mark}the bank shows {paid} payment{'s' if paid != 1 else ''} for {run}: {text}")
    return paid == expected


ROLES = """
    DO $$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ap_worker') THEN CREATE ROLE ap_worker LOGIN; END IF;
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'maria') THEN CREATE ROLE maria LOGIN; END IF;
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ana') THEN CREATE ROLE ana LOGIN; END IF;
    END $$;
    GRANT durable_ledger_worker TO ap_worker;
    GRANT durable_ledger_admin TO maria;
    GRANT durable_ledger_approver TO ana;"""


def story(dsn, shard_dsns=()):
    """The story, against a ledger (dsn), or through a proxy of a sharded ledger (dsn the
    proxy's database, shard_dsns its shards': the roles are made there too)."""
    ok = True
    for shard_dsn in shard_dsns:
        with psycopg.connect(shard_dsn, autocommit=True) as shard:
            shard.execute(ROLES)
    with psycopg.connect(dsn, autocommit=True) as admin:
        # least privilege: workers may use the ledger and pay; Maria may resolve; Ana approves
        admin.execute("""
            CREATE TABLE bank_payments (id serial, invoice text, amount integer,
                                        idempotency_key text, run text,
                                        paid_at timestamptz DEFAULT now());""")
        admin.execute(ROLES)
        admin.execute("""
            GRANT INSERT, SELECT ON bank_payments TO ap_worker;
            GRANT USAGE ON SEQUENCE bank_payments_id_seq TO ap_worker;
            GRANT SELECT ON bank_payments TO maria;
            CREATE TABLE mailbox (id serial, run text, body text);
            GRANT INSERT, SELECT ON mailbox TO ap_worker;
            GRANT USAGE ON SEQUENCE mailbox_id_seq TO ap_worker;
            GRANT SELECT ON mailbox TO maria;""")
    worker_dsn = psycopg.conninfo.make_conninfo(dsn, user="ap_worker", application_name="ap-worker")
    maria_dsn = psycopg.conninfo.make_conninfo(dsn, user="maria", application_name="ledger-console")
    ana_dsn = psycopg.conninfo.make_conninfo(dsn, user="ana", application_name="ledger-console")
    with psycopg.connect(maria_dsn, autocommit=True) as conn:

        heading(1, "WITHOUT the ledger: the worker is evicted after paying; the retry pays again")
        w = spawn(worker_dsn, "naive", "--run", "ap-1")
        follow(w, until="acknowledging")
        evict(w)
        print("      [orchestrator] the job was never acknowledged: retrying it")
        w = spawn(worker_dsn, "naive", "--run", "ap-1")
        follow(w, until="acknowledging")
        w.kill(); w.wait(); w.stdout.close()
        ok &= verdict(conn, "ap-1", 2, "INV-9 was paid twice ($8,400)")

        heading(2, "WITH the ledger: the same crash and retry")
        w = spawn(worker_dsn, "ledger", "--run", "ap-2", "--die-after", "paid")
        follow(w, until="acknowledging")
        evict(w)
        print("      [orchestrator] retrying the job on a new worker")
        follow(spawn(worker_dsn, "ledger", "--run", "ap-2"))
        ok &= verdict(conn, "ap-2", 1, "the retry replayed the recorded result")

        heading(3, "The worker dies between intent and completion: nobody can tell")
        w = spawn(worker_dsn, "ledger", "--run", "ap-3", "--die-after", "intent")
        follow(w, until="calling the bank")
        ok &= evict_once_paid(conn, w, "ap-3")
        print("      [orchestrator] retrying the job on a new worker")
        follow(spawn(worker_dsn, "ledger", "--run", "ap-3"))
        print("      [orchestrator] the run is paused; it is listed for a person:")
        for key, tool, status, reason in conn.execute(
                "SELECT key, tool, status, reason FROM durable_ledger.unresolved WHERE run = 'ap-3'"):
            print(f"        {key[:12]}…  {tool}  {status}: {reason}")
            print("      [Maria Lopez, accounts payable] checks the bank for idempotency key", key[:12] + "…")
            payment = conn.execute("SELECT id FROM bank_payments WHERE idempotency_key = %s",
                                   (key,)).fetchone()
            outcome = ("completed", {"payment_id": payment[0]}) if payment else ("failed", None)
            print(f"      [Maria Lopez] the bank {'has payment ' + str(payment[0]) if payment else 'has nothing'}:"
                  f" resolve_effect(..., '{outcome[0]}', ..., resolved_by => 'maria.lopez')")
            conn.execute("SELECT durable_ledger.resolve_effect(%s, %s, %s, 'maria.lopez',"
                         " 'checked the bank statement for the idempotency key')",
                         (key, outcome[0], Jsonb(outcome[1]) if outcome[1] else None))
        print("      [orchestrator] retrying the job")
        follow(spawn(worker_dsn, "ledger", "--run", "ap-3"))
        ok &= verdict(conn, "ap-3", 1, "paid once, resolved by a named person, then replayed")

        heading(4, "Two workers are handed the same run at once")
        follow_together(spawn(worker_dsn, "ledger", "--run", "ap-4"),
                        spawn(worker_dsn, "ledger", "--run", "ap-4"))
        ok &= verdict(conn, "ap-4", 1, "the lease serialized them; the second replayed")

        heading(5, '"Again" versus "twice": a run that pays the same amount twice on purpose')
        follow(spawn(worker_dsn, "ledger", "--run", "ap-5", "--calls", "2"))
        print("      [orchestrator] the run is replayed (say, the queue redelivers it)")
        follow(spawn(worker_dsn, "ledger", "--run", "ap-5", "--calls", "2"))
        ok &= verdict(conn, "ap-5", 2, "two payments on purpose (occurrences 1 and 2), none on replay")

        heading(6, "An LLM replays the run and rewords the memo: paused, not paid twice")
        print("      [Maria Lopez] registers bank.pay as a reviewed, side-effecting tool:"
              " register_tool('bank.pay', 'maria.lopez')  (divergence policy: pause)")
        conn.execute("SELECT durable_ledger.register_tool('bank.pay', 'maria.lopez',"
                     " note => 'reviewed by accounts payable')")
        w = spawn(worker_dsn, "ledger", "--run", "ap-6", "--die-after", "paid",
                  "--memo", "Thanks for your order")
        follow(w, until="acknowledging")
        evict(w)
        print("      [orchestrator] retrying the job; the agent plans again, and its model words the memo anew")
        follow(spawn(worker_dsn, "ledger", "--run", "ap-6", "--memo", "Thank you for your order!"))
        print("      [orchestrator] the run is paused; it is listed for a person:")
        for key, may_duplicate, args, reason in conn.execute(
                "SELECT key, may_duplicate, args, reason FROM durable_ledger.unresolved WHERE run = 'ap-6'"):
            earlier = conn.execute("SELECT args, result FROM durable_ledger.effect_status(%s)",
                                   (may_duplicate,)).fetchone()
            print(f"        {key[:12]}…  {args}")
            print(f"        may duplicate {may_duplicate[:12]}…  {earlier[0]} -> {earlier[1]}")
            print("      [Maria Lopez] the same invoice and amount; only the memo differs:"
                  " resolve_divergence(..., 'same', 'maria.lopez', 'the model reworded the memo')")
            conn.execute("SELECT durable_ledger.resolve_divergence(%s, 'same', 'maria.lopez',"
                         " 'the model reworded the memo')", (key,))
        print("      [orchestrator] retrying the job")
        follow(spawn(worker_dsn, "ledger", "--run", "ap-6", "--memo", "Thank you for your order!"))
        ok &= verdict(conn, "ap-6", 1, "the reworded replay got the recorded payment, paid nothing")
        print("      (registered with key_fields => '{invoice,amount,currency}', bank.pay would have"
              " taken the reworded memo for the same call at once)")

        heading(7, "The bank answers lookups: a worker lost mid-payment is settled with no person")
        print("      [Maria Lopez] lets workers settle bank.pay's unknown outcomes from the bank's record,"
              " a second after they are found: set_reconcile('bank.pay', '1 second', 'maria.lopez')")
        conn.execute("SELECT durable_ledger.set_reconcile('bank.pay', '1 second', 'maria.lopez',"
                     " 'the bank answers lookups by idempotency key')")
        w = spawn(worker_dsn, "ledger", "--run", "ap-7", "--die-after", "intent")
        follow(w, until="calling the bank")
        ok &= evict_once_paid(conn, w, "ap-7")
        print("      [orchestrator] retrying the job on a new worker, which reconciles")
        follow(spawn(worker_dsn, "ledger", "--run", "ap-7", "--reconcile"))
        waiting = conn.execute("SELECT count(*) FROM durable_ledger.unresolved WHERE run = 'ap-7'").fetchone()[0]
        print(f"      [orchestrator] unresolved for ap-7: {waiting}; nobody was paged")
        # settled as it happened: the first attempt completed from the bank's record
        # (one finding, of that attempt: every row the join gives is checked)
        settled = conn.execute(
            "SELECT e.status = 'completed' AND e.attempt = 1 AND (h.detail ->> 'happened')::boolean"
            "  FROM durable_ledger.history('ap-7') h, durable_ledger.effect_status(h.key) e"
            " WHERE h.event = 'reconciled' AND h.attempt = 1").fetchall()
        ok &= waiting == 0 and settled == [(True,)]
        ok &= verdict(conn, "ap-7", 1, "paid once, settled from the bank's record, then replayed")

        heading(8, "A payment over $10,000 waits for an approver: paid once, after another person said yes")
        print("      [Maria Lopez] payments over $10,000 need a second person:"
              " set_approval('bank.pay', 'strict $.amount > 10000', 'maria.lopez')")
        conn.execute("SELECT durable_ledger.set_approval('bank.pay', 'strict $.amount > 10000', 'maria.lopez',"
                     " 'payments over $10,000 need an approver')")
        big = ["--invoice", "INV-10", "--amount", "12000"]
        follow(spawn(worker_dsn, "ledger", "--run", "ap-8", *big))
        ok &= verdict(conn, "ap-8", 0, "nothing is paid before the approval")
        with psycopg.connect(ana_dsn, autocommit=True) as ana:
            for key, args, reason in ana.execute(
                    "SELECT key, args, reason FROM durable_ledger.unresolved"
                    " WHERE run = 'ap-8' AND status = 'awaiting_approval'").fetchall():
                print(f"      [Ana Kim, approver] sees {key[:12]}…  {args}: {reason[:40]}…")
                print("      [Ana Kim] checked INV-10 with the supplier:"
                      " approve_effect(..., 'ana.kim', 'INV-10 checked with the supplier')")
                ana.execute("SELECT durable_ledger.approve_effect(%s, 'ana.kim',"
                            " 'INV-10 checked with the supplier')", (key,))
        print("      [orchestrator] retrying the job; then the queue redelivers it once more")
        follow(spawn(worker_dsn, "ledger", "--run", "ap-8", *big))
        follow(spawn(worker_dsn, "ledger", "--run", "ap-8", *big))
        approved = conn.execute(
            "SELECT h.role_name, h.detail ->> 'approved_by' FROM durable_ledger.history('ap-8') h"
            " WHERE h.event = 'approved'").fetchall()
        print(f"      [orchestrator] the audit log's verdict: {approved}")
        ok &= approved == [("ana", "ana.kim")]
        ok &= verdict(conn, "ap-8", 1, "paid once, after an approver of her own role approved it")

        heading(9, "A runaway loop stopped at its budget: three emails, not fourteen")
        print("      [Maria Lopez] registers mail.send with a budget of three emails a run:"
              " set_budget('mail.send', 3, 'maria.lopez')")
        conn.execute("SELECT durable_ledger.register_tool('mail.send', 'maria.lopez')")
        conn.execute("SELECT durable_ledger.set_budget('mail.send', 3, 'maria.lopez',"
                     " 'onboarding sends three emails at most')")
        follow(spawn(worker_dsn, "emails", "--run", "ob-9", "--calls", "14"))
        sent = conn.execute("SELECT count(*) FROM mailbox WHERE run = 'ob-9'").fetchone()[0]
        for run, reason in conn.execute(
                "SELECT run, reason FROM durable_ledger.unresolved WHERE run = 'ob-9'").fetchall():
            print(f"      [orchestrator] listed for a person: {run}: {reason[:72]}…")
        print("      [Maria Lopez] three welcome emails are plenty; the loop is a bug:"
              " abandon_run('ob-9', 'maria.lopez', 'retry loop on a network partition')")
        conn.execute("SELECT durable_ledger.abandon_run('ob-9', 'maria.lopez',"
                     " 'retry loop on a network partition')")
        mark = "OK " if sent == 3 else "!! "
        print(f"   {mark}the mailbox shows {sent} emails for ob-9: the budget stopped the loop at the fourth")
        ok &= sent == 3

        heading(10, "The audit trail of INV-9 in run ap-3, read with plain SQL")
        query = textwrap.dedent("""\
            SELECT a.id, a.event, a.role_name, a.application_name,
                   coalesce(a.detail ->> 'resolved_by', '') AS resolved_by,
                   coalesce(a.detail ->> 'note', a.detail ->> 'cause', '') AS note
              FROM durable_ledger.audit_log a
             WHERE a.run = 'ap-3' AND (a.key IS NULL OR a.key IN (
                   SELECT key FROM durable_ledger.effects WHERE args ->> 'invoice' = 'INV-9'))
             ORDER BY a.id;""")
        if shard_dsns:  # through the proxy: the run's timeline from its shard
            query = textwrap.dedent("""\
                SELECT h.id, h.event, h.role_name, h.application_name,
                       coalesce(h.detail ->> 'resolved_by', '') AS resolved_by,
                       coalesce(h.detail ->> 'note', h.detail ->> 'cause', '') AS note
                  FROM durable_ledger.history('ap-3') h
                 WHERE h.key IS NULL OR h.args ->> 'invoice' = 'INV-9'
                 ORDER BY h.id;""")
        print(textwrap.indent(query, "   "))
        rows = conn.execute(query).fetchall()
        widths = [4, 15, 10, 16, 12, 40]
        header = ["id", "event", "role", "application", "resolved_by", "note"]
        print("   " + " ".join(h.ljust(w) for h, w in zip(header, widths)))
        for row in rows:
            print("   " + " ".join(str(v)[:w].ljust(w) for v, w in zip(row, widths)))

    print("\n" + ("Every story ended as told." if ok else "SOMETHING WENT WRONG: see the !! lines."))
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", default="story", choices=["story", "naive", "ledger", "emails"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--run")
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--die-after", default="never", choices=["never", "paid", "intent"])
    parser.add_argument("--memo")
    parser.add_argument("--invoice")
    parser.add_argument("--amount", type=int)
    parser.add_argument("--shard-dsn", action="append", default=[],
                        help="the story through a proxy: --dsn is the proxy's database (durable_ledger_proxy), "
                             "this a shard's ledger database, as a superuser, once per shard")
    parser.add_argument("--reconcile", action="store_true",
                        help="settle an unknown outcome from the bank's record, not by a person")
    args = parser.parse_args()
    if args.role == "naive":
        naive_worker(args.dsn, args.run)
    elif args.role == "emails":
        email_loop_worker(args.dsn, args.run, args.calls)
    elif args.role == "ledger":
        ledger_worker(args.dsn, args.run, args.calls, args.die_after, args.memo, args.reconcile,
                      args.invoice, args.amount)
    else:
        sys.exit(0 if story(args.dsn, args.shard_dsn) else 1)


if __name__ == "__main__":
    main()
