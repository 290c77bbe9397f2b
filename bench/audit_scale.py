"""make bench, section "audit": auditing at scale.

Fills the ledger with --audit-effects effects (ten million by default) through the ledger's
own functions -- begin_effect and complete_effect (or fail_effect) in runs of 100 effects,
each run acquired and released, one transaction per run, a few runs retried (their second
attempt replays every effect) -- and states how long the fill took.  Then it writes a
small story on top (the one test/apps/041_cookbook.pl tells: an invoice paid, an email
whose outcome is unknown, resolved by a person; a lease broken; effects waiting for a
person), and times every query of docs/auditing.md's cookbook, `SELECT * FROM unresolved`,
`history(run)` and the metrics scrape, each with its plan.

The field the cookbook asks by (args ->> 'invoice') gets the expression index that
docs/auditing.md tells an operator to create; it exists during the fill, so the fill pays
for it.
"""

import re
import statistics
import threading
import time

import psycopg

#: One run: acquire it, 100 effects through the ledger, release it; every retry_every-th
#: run is retried (a new attempt replays all of it); every fail_every-th effect is refused
#: by its downstream (fail_effect).  One transaction per run.
FILL_PROCEDURE = """
CREATE OR REPLACE PROCEDURE bench_audit_fill(first_run bigint, last_run bigint,
                                             retry_every int, fail_every int)
LANGUAGE plpgsql AS $$
DECLARE
    r bigint; n bigint; run text; k text; tool text; args jsonb;
BEGIN
    FOR r IN first_run .. last_run LOOP
        run := 'audit-' || r;
        FOR attempt IN 1 .. CASE WHEN r % retry_every = 0 THEN 2 ELSE 1 END LOOP
            PERFORM durable_ledger.acquire_run(run);
            FOR j IN 0 .. 99 LOOP
                n := r * 100 + j;
                IF j % 3 = 0 THEN
                    tool := 'bank.pay';
                    args := jsonb_build_object('invoice', 'INV-' || n, 'amount', 100 + n % 9000,
                                               'currency', 'EUR');
                ELSIF j % 3 = 1 THEN
                    tool := 'mail.send';
                    args := jsonb_build_object('to', 'vendor-' || n % 50000 || '@example.com',
                                               'invoice', 'INV-' || (n - 1));
                ELSE
                    tool := 'crm.note';
                    args := jsonb_build_object('account', 'ACC-' || n % 200000, 'note', 'paid');
                END IF;
                SELECT key INTO k FROM durable_ledger.begin_effect(run, tool, args)
                 WHERE decision = 'execute';
                IF k IS NOT NULL THEN
                    IF n % fail_every = 0 THEN
                        PERFORM durable_ledger.fail_effect(k, '{"code": "declined"}', 1);
                    ELSE
                        PERFORM durable_ledger.complete_effect(k, jsonb_build_object('id', 'x-' || n), 1);
                    END IF;
                END IF;
            END LOOP;
            PERFORM durable_ledger.release_run(run);
        END LOOP;
        COMMIT;
    END LOOP;
END $$;
"""

#: The story of test/apps/041_cookbook.pl, so that the cookbook's queries (which name
#: INV-9, ap-run-42, ...) answer with a handful of rows.
STORY = [
    """SELECT durable_ledger.complete_effect(key, '{"payment_id": "pay_81"}')
         FROM durable_ledger.begin_effect('ap-run-42', 'bank.pay', '{"invoice": "INV-9", "amount": 4200}',
                                          meta => '{"model": "agent-v3", "approved_by": "po-1177"}')""",
    """SELECT decision FROM durable_ledger.begin_effect('ap-run-42', 'mail.send',
                                                       '{"invoice": "INV-9", "to": "ap@acme.example"}')""",
    "SELECT durable_ledger.release_run('ap-run-42')",
    """SELECT decision FROM durable_ledger.begin_effect('ap-run-42', 'bank.pay', '{"invoice": "INV-9", "amount": 4200}')""",
    """SELECT decision FROM durable_ledger.begin_effect('ap-run-42', 'mail.send',
                                                       '{"invoice": "INV-9", "to": "ap@acme.example"}')""",
    "SELECT durable_ledger.release_run('ap-run-42')",
    """SELECT durable_ledger.begin_effect('other-run-' || g, 'ticket.open', jsonb_build_object('title', 'late ' || g))
         FROM generate_series(1, 4) g""",
    "SELECT durable_ledger.release_run('other-run-' || g) FROM generate_series(1, 4) g",
    """SELECT durable_ledger.resolve_effect(durable_ledger.effect_key('ap-run-42', 'mail.send',
             '{"invoice": "INV-9", "to": "ap@acme.example"}', 1),
           'completed', NULL, 'maria.lopez', 'the mail server log shows it was sent')""",
    "SELECT durable_ledger.take_lease('hung-run', '1 hour', 'worker-9')",
    "SELECT durable_ledger.break_lease('hung-run', 'oncall.sam', 'stuck for 20 minutes')",
    "SELECT durable_ledger.take_lease('busy-run', '1 hour', 'worker-7')",
]


#: What each query of the cookbook asks, in the order of docs/auditing.md.
COOKBOOK_NAMES = ["the history of invoice INV-9", "everything in one run", "what waits for a person",
                  "every human decision", "live leases", "replays per tool over the last day"]


def cookbook(path):
    """The SQL blocks of docs/auditing.md's cookbook, named."""
    page = open(path, encoding="utf-8").read()
    section = re.search(r"^## The auditor's cookbook\n(.*?)(?=^## |\Z)", page, re.M | re.S).group(1)
    queries = re.findall(r"```sql\n(.*?)```", section, re.S)
    if len(queries) != len(COOKBOOK_NAMES):
        raise SystemExit(f"docs/auditing.md's cookbook has {len(queries)} queries; bench/audit_scale.py "
                         f"names {len(COOKBOOK_NAMES)}")
    return list(zip(COOKBOOK_NAMES, queries))


def plan_summary(conn, sql):
    """The scans of the query's plan (EXPLAIN ANALYZE), as 'Index Scan using x on t; ...'."""
    lines = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql)]
    scans = []
    for line in lines:
        m = re.search(r"((?:Parallel )?(?:Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan|"
                      r"Bitmap Index Scan|Function Scan|CTE Scan)(?: Backward)?(?: using \S+)? on \S+)", line)
        if m:
            rows = re.search(r"rows=(\d+)", line)
            scans.append(m.group(1) + (f" ({rows.group(1)} rows)" if rows else ""))
    return scans


def timed_ms(conn, sql, rounds=7):
    conn.execute(sql).fetchall()  # warm
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        conn.execute(sql).fetchall()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def fill(dsn, target, workers, say):
    """Grows the ledger to target effects through the ledger; returns (effects, seconds)."""
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(FILL_PROCEDURE)
    conn.execute("CREATE INDEX IF NOT EXISTS effects_invoice_idx ON durable_ledger.effects ((args ->> 'invoice'))")
    have_runs = conn.execute("SELECT count(*) FROM durable_ledger.runs WHERE run LIKE 'audit-%'").fetchone()[0]
    runs = target // 100
    chunk = 500  # runs per CALL: progress shows between calls
    todo = [(a, min(a + chunk - 1, runs - 1)) for a in range(have_runs, runs, chunk)]
    lock = threading.Lock()
    errors = []
    t0 = time.perf_counter()

    def work():
        c = psycopg.connect(dsn, autocommit=True)
        while True:
            with lock:
                if not todo or errors:
                    return
                first, last = todo.pop(0)
            try:
                c.execute("CALL bench_audit_fill(%s, %s, 1000, 97)", (first, last))
            except Exception as exc:  # noqa: BLE001 -- reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(30)
        n = conn.execute("SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'durable_ledger.effects'::regclass").fetchone()[0]
        say(f"     fill: about {n:,} effects after {time.perf_counter() - t0:.0f} s")
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    seconds = time.perf_counter() - t0
    conn.execute("VACUUM ANALYZE durable_ledger.effects")
    conn.execute("VACUUM ANALYZE durable_ledger.audit_log")
    conn.execute("VACUUM ANALYZE durable_ledger.unsettled")
    n = conn.execute("SELECT count(*) FROM durable_ledger.effects").fetchone()[0]
    return n, seconds


def audit_section(args, dsn, docs, say):
    """Rows for the bench's table: the fill, then every query's time and plan."""
    rows = []
    say(f"auditing at scale: filling the ledger to {args.audit_effects:,} effects through the ledger ...")
    n, seconds = fill(dsn, args.audit_effects, 2, say)
    conn = psycopg.connect(dsn, autocommit=True)
    audit_rows = conn.execute("SELECT count(*) FROM durable_ledger.audit_log").fetchone()[0]
    rows.append((f"fill: {n:,} effects through the ledger (s)", seconds, "(context)",
                 f"{n / seconds:,.0f} effects/s with 2 workers (begin+complete, one transaction per run of "
                 f"100); {audit_rows:,} audit rows; ledger {ledger_size(conn)}"))
    say("  ", rows[-1])
    for statement in STORY:
        conn.execute(statement)
    conn.execute("ANALYZE durable_ledger.unsettled")
    queries = cookbook(docs) + [
        ("SELECT * FROM unresolved", "SELECT * FROM durable_ledger.unresolved"),
        ("history('ap-run-42')", "SELECT * FROM durable_ledger.history('ap-run-42')"),
        ("metrics scrape", "SELECT * FROM durable_ledger.metrics"),
    ]
    for name, sql in queries:
        ms = timed_ms(conn, sql)
        returned = len(conn.execute(sql).fetchall())
        scans = plan_summary(conn, sql)
        rows.append((f"{name} at {n:,} effects (ms)", ms, "< 50",
                     f"{returned} rows; " + "; ".join(scans)))
        say("  ", rows[-1])
    return rows


def audit_dsn(conn, dsn):
    """A database of the section's own (durable_ledger_audit), created with the extension:
    the other sections' rows stay out of it, and a second run goes on filling it."""
    if not conn.execute("SELECT FROM pg_database WHERE datname = 'durable_ledger_audit'").fetchone():
        conn.execute("CREATE DATABASE durable_ledger_audit")
    target = psycopg.conninfo.make_conninfo(dsn, dbname="durable_ledger_audit")
    with psycopg.connect(target, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS durable_ledger")
    return target


def ledger_size(conn):
    return conn.execute("""
        SELECT pg_size_pretty(sum(pg_total_relation_size(c))) FROM unnest(ARRAY[
            'durable_ledger.effects', 'durable_ledger.audit_log', 'durable_ledger.runs',
            'durable_ledger.unsettled']::regclass[]) c""").fetchone()[0]
