#!/usr/bin/python3
"""make bench: durable_ledger against the floor of what durability costs.

The floor is the same writes done by hand, one round trip each (bench/floor_pair.sql).
Every comparison runs interleaved in one cluster (A B A B ...) and reports the
median of its rounds as a ratio; absolute numbers are context only.  Run by
bench/run.sh against a throwaway cluster.  --only runs some sections:
pairs, registered, unregistered, budgeted, batch, replay, handoff, pooler, access, growth, audit,
console, proxy, gateway, clients, callgrind, fleet.

The proxy section (bench/proxy_scale.py) starts four clusters of its own: three shards
and a proxy (durable_ledger_proxy): begin+complete through the proxy against straight to
a shard (throughput, latency, CPU per effect), and effects per CPU-second with 1, 2 and 3
shards.

The access section measures begin+complete against the minimal floor (an intent
row and its audit row, then the completion and its audit row, a primary key
each: bench/floor_minimal_pair.sql) in this cluster and in a second one running
the library of an earlier commit (--access-before; bench/before-cluster.sh
builds it into a private copy of PostgreSQL), four sides interleaved: the
ratio after over the ratio before is what the change costs the hot path.  Then
the same with the ledger and the floor mixed in one pgbench run per cluster
(the script chosen per transaction), so that both see the same moments of the
disk: each cluster's ratio is the floor's mean latency over the ledger's.

The audit section ("auditing at scale", bench/audit_scale.py) writes ten million effects
through the ledger into a database of its own (--audit-effects; the fill took 16 minutes
on two cores) and times every query of docs/auditing.md's cookbook, unresolved,
history(run) and the metrics scrape, with their plans.  The console section
(bench/console_scale.py) times the operator console's pages over loopback HTTP in
that same database (filled once when both sections run).

The registered section measures begin+complete of a registered tool (divergence
policy pause) in a later attempt of each client's run, where divergence is
checked on every call (bench/ledger_registered_pair.sql), against the same
floor; the unregistered section the same for a tool nobody registered, which
1.3 judges with the policy row's pause.  The budgeted section measures
begin+complete of a registered tool with a budget per run (1.3; never
reached), whose every execution reads and writes its run's counter of the
tool (bench/ledger_budgeted_pair.sql), against the floor of the same rows:
floor_pair.sql's writes and the bump of a counter row per run and tool
(bench/floor_budgeted_pair.sql).

The pooler section starts Debian's PgBouncer (pool_mode = transaction) in front
of the cluster and sends both sides through it: begin+complete under token
leases (bench/ledger_token_pair.sql) against the same floor.  PgBouncer 1.18
does not carry prepared statements across transactions, so that section uses
pgbench -M extended (unnamed statements) for both sides.

The fleet section (bench/fleet_scale.py) starts a PgBouncer of its own (20 server
connections) and client processes running AsyncLedger token attempts of three guarded
calls, runs arriving at stepped rates: p50 and p99 per call at each step, and the
saturation point (the highest rate served with p99 within 50 ms); every rate is stepped
by the fleet's floor too (the same runs and round trips in plain psycopg, writing the
minimal floor's rows), whose saturation says what these cores allow anything.

--before REV (issue 34's before and after from one run): the registered, batch,
clients, callgrind and fleet sections also measure the library of commit REV, in a
second cluster with the same settings (bench/before-cluster.sh).  The registered and
batch sections measure it against its own floor, in rounds among this tree's; the
clients section runs REV's clients by this tree's harness against this cluster,
callgrind counts REV's tree, and the fleet steps REV's library and Python client as a
third side beside this cluster's ledger and floor (absolute figures, no floor of REV's).
"""

import argparse
import contextlib
import datetime
import glob
import itertools
import os
import platform
import pwd
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

import psycopg
from psycopg.types.json import Jsonb

from audit_scale import audit_section, audit_dsn
from console_scale import console_section
from proxy_scale import proxy_section
from gateway_latency import gateway_section
from clients_cpu import clients_section
import fleet_scale
from order import turn_order

HERE = os.path.dirname(os.path.abspath(__file__))


def run_pgbench(args, scripts, clients, seconds, logdir, tag, dsn=None, protocol="prepared", defines=None):
    """Runs pgbench once with scripts (one picked at random per transaction when
    there are several); returns its output and each script's transaction
    latencies in microseconds, from its per-transaction log."""
    prefix = os.path.join(logdir, tag)
    cmd = [args.pgbench, "-n", "-M", protocol, "-c", str(clients),
           "-j", str(min(clients, os.cpu_count() or 2)), "-T", str(seconds),
           "-l", f"--log-prefix={prefix}"]
    for script in scripts:
        cmd += ["-f", os.path.join(HERE, script)]
    for name, value in (defines or {}).items():
        cmd += ["-D", f"{name}={value}"]
    cmd.append(dsn or args.dsn)  # the database: positional (pgbench's -d is --debug)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pgbench failed: {done.stderr.strip()}")
    latencies = [[] for _ in scripts]
    for path in glob.glob(prefix + ".*"):
        with open(path) as f:
            for line in f:  # client transaction latency-us script epoch us
                fields = line.split()
                if fields[2] == "failed":
                    raise SystemExit(f"pgbench: a transaction of {scripts[int(fields[3])]} failed")
                latencies[int(fields[3])].append(int(fields[2]))
        os.remove(path)
    return done.stdout, latencies


def pgbench(args, script, clients, seconds, logdir, tag, dsn=None, protocol="prepared", defines=None):
    """Runs one pgbench round; returns (tps, p50 ms, p99 ms)."""
    out, (latencies,) = run_pgbench(args, [script], clients, seconds, logdir, tag, dsn, protocol, defines)
    tps = next(float(line.split("=")[1].split()[0]) for line in out.splitlines()
               if line.startswith("tps ="))
    latencies.sort()
    q = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))] / 1000.0
    return tps, q(0.50), q(0.99)


def pgbench_mixed(args, scripts, clients, seconds, logdir, tag, dsn=None):
    """One pgbench run that picks one of scripts at random for each transaction
    (equal weights): every script sees the same moments of the machine (the
    disk's flushes, other load).  Returns each script's mean latency in ms."""
    _, latencies = run_pgbench(args, scripts, clients, seconds, logdir, tag, dsn)
    return [statistics.fmean(l) / 1000.0 for l in latencies]


def rotated(rounds, sides):
    """Runs each of sides (a dict of name: function) once a round, rounds times, in
    order.py's balanced order (over each cycle of rounds, each side first, and right after
    each other side, as often); returns each side's list of results."""
    names, results = list(sides), {name: [] for name in sides}
    for r in range(rounds):
        for name in turn_order(names, r):
            results[name].append(sides[name]())
    return results


def interleaved(rounds, a, b):
    """Runs a() and b() alternately (A B, B A, ...), rounds times each; returns the lists
    of results."""
    results = rotated(rounds, {"a": a, "b": b})
    return results["a"], results["b"]


def med(results, i):
    return statistics.median(r[i] for r in results)


def timed(conn, sql, params=None):
    t = time.perf_counter()
    conn.execute(sql, params)
    return time.perf_counter() - t


# The batch's floor of the same rows (issue 34): each of the ledger's tables that a
# first-epoch begin_effect writes, and its copy made LIKE ... INCLUDING ALL in
# bench/floor.sql (every column, default, constraint and index).
BATCH_TABLES = (("durable_ledger.effects", "floor_effects"),
                ("durable_ledger.unsettled", "floor_unsettled"),
                ("durable_ledger.audit_log", "floor_audit"))


def check_floor_tables(conn):
    """Fails unless every index of each ledger table the batch writes is on its
    floor copy (the same definition but for the names) and the two tables have
    the same storage options (effects' fillfactor)."""
    for ledger, floor in BATCH_TABLES:
        def shape(table):
            defs = conn.execute(
                """SELECT regexp_replace(pg_get_indexdef(i.indexrelid), '^CREATE (UNIQUE )?INDEX \\S+ ON \\S+ ', '\\1')
                     FROM pg_index i WHERE i.indrelid = %s::regclass""", (table,)).fetchall()
            opts = conn.execute("SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = %s::regclass",
                                (table,)).fetchone()[0]
            return sorted(d[0] for d in defs), sorted(opts)
        if shape(ledger) != shape(floor):
            raise SystemExit(f"bench: {floor} is not {ledger}'s shape: {shape(floor)} vs {shape(ledger)}")


BATCH_RUNS = itertools.count()


def cpu_bound(conn, rounds, n):
    """n begin_effect of bank.pay (registered, divergence off) in a new run's first
    epoch, in one transaction, against the very rows such a run wrote copied by
    INSERT ... SELECT (one per table: effects, unsettled, audit_log, every column as
    written, the chain hashes too) into floor_effects, floor_unsettled and
    floor_audit, in one transaction.  The floor of round k copies the rows of the
    ledger's run of round k-1 (round 0: of a ledger run made first, untimed): the
    ledger's runs are all alike, and in a round that starts with the floor there
    is no other run before it.  Neither side's tables are truncated: each round adds
    n effects to both (the ledger's hold one run more, the untimed one).  The rows
    are read from an unlogged copy without indexes made after the ledger's commit
    (untimed), so that the floor's read is one sequential scan per table.  Each side
    is timed from its first statement to the end of its last, without the commit."""
    ledger_sql = f"""SELECT count(*) FROM generate_series(1, {n}) g,
        LATERAL durable_ledger.begin_effect(%s, 'bank.pay', jsonb_build_object('invoice', g, 'amount', 4200))"""
    pending = []  # the staged copies of the ledger's runs the floor has not copied yet

    def stage(run, i):
        """Copies what the run's transaction wrote (committed, before the run is
        released) into unlogged tables of its own."""
        src = [f"bench_batch_src_{i}_{t}" for t in ("effects", "unsettled", "audit")]
        conn.execute(f"CREATE UNLOGGED TABLE {src[0]} (LIKE durable_ledger.effects)")
        conn.execute(f"INSERT INTO {src[0]} SELECT * FROM durable_ledger.effects"
                     f" WHERE tool = 'bank.pay' AND run = %s", (run,))
        conn.execute(f"CREATE UNLOGGED TABLE {src[1]} (LIKE durable_ledger.unsettled)")
        conn.execute(f"INSERT INTO {src[1]} SELECT u.* FROM durable_ledger.unsettled u"
                     f" JOIN {src[0]} e ON e.key = u.key AND e.created_at = u.created_at")
        conn.execute(f"CREATE UNLOGGED TABLE {src[2]} (LIKE durable_ledger.audit_log)")
        conn.execute(f"INSERT INTO {src[2]} SELECT * FROM durable_ledger.audit_log WHERE run = %s", (run,))
        counts = [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in src]
        if counts[0] != n or counts[1] != n or counts[2] < n:
            raise SystemExit(f"bench: the batch's run {run} wrote {counts} rows (effects, unsettled, audit)")
        for t in src:
            conn.execute(f"VACUUM (ANALYZE) {t}")
        pending.append((src, counts))

    def ledger_run():
        i = next(BATCH_RUNS)  # a new run every time (the section may call this more than once)
        run = f"bench-batch-{i}"
        # a run nobody used: every call an intent written, none an earlier one replayed
        # (stage() counts rows, which an earlier run of the same name would also pass)
        if conn.execute("SELECT EXISTS (SELECT FROM durable_ledger.effects WHERE run = %s)", (run,)).fetchone()[0]:
            raise SystemExit(f"bench: the batch's run {run} has effects already")
        with conn.transaction():
            t = timed(conn, ledger_sql, (run,))
        stage(run, i)
        conn.execute("SELECT durable_ledger.release_run(%s)", (run,))
        return (t,)

    def floor():
        src, counts = pending.pop(0)
        with conn.transaction():
            t = sum(timed(conn, f"INSERT INTO {dst} SELECT * FROM {s}")
                    for (_, dst), s in zip(BATCH_TABLES, src))
        for s in src:
            conn.execute(f"DROP TABLE {s}")
        return (t, counts[2])

    # The copies keep the ledger's audit ids: none may be taken in floor_audit
    # already (by the floor of earlier sections, from floor_audit_id_seq).  Ids
    # are not dense anyway (a rollback leaves a gap); after the section the floor's
    # sequence moves past the copies.
    conn.execute("""SELECT setval('durable_ledger.audit_log_id_seq',
                                  greatest((SELECT last_value FROM durable_ledger.audit_log_id_seq),
                                           (SELECT coalesce(max(id), 0) FROM floor_audit)) + 1)""")
    ledger_run()  # round 0's floor copies this one
    led, flo = interleaved(rounds, ledger_run, floor)
    for src, _ in pending:
        for s in src:
            conn.execute(f"DROP TABLE {s}")
    conn.execute("""SELECT setval('floor_audit_id_seq',
                                  greatest((SELECT last_value FROM floor_audit_id_seq),
                                           (SELECT coalesce(max(id), 0) FROM floor_audit)) + 1)""")
    return led, flo


def cpu_bound_hand_made(conn, rounds, n):
    """The batch's earlier floor (before issue 34): n begin_effect in one transaction
    against hand-made rows (not the ledger's: random keys, no chain hashes, fewer
    columns) written by one statement into the same floor tables."""
    ledger_sql = f"""SELECT count(*) FROM generate_series(1, {n}) g,
        LATERAL durable_ledger.begin_effect(%s, 'bank.pay', jsonb_build_object('invoice', g, 'amount', 4200))"""
    floor_sql = f"""WITH i AS (
        INSERT INTO floor_effects (key, run, tool, args, business_key, occurrence, attempt,
                                   status, lease_epoch, holder_pid, created_at)
        SELECT encode(sha256(convert_to(%s || '|' || g || '|' || random(), 'UTF8')), 'hex'), %s, 'bank.pay',
               jsonb_build_object('invoice', g, 'amount', 4200), false, 1, 1, 'started', 1,
               pg_backend_pid(), clock_timestamp()
          FROM generate_series(1, {n}) g
        RETURNING key, run, created_at),
      o AS (INSERT INTO floor_unsettled (created_at, key) SELECT created_at, key FROM i)
      INSERT INTO floor_audit (logged_at, run, key, event, role_name, session_user_name,
                               application_name, client_addr, backend_pid, lease_epoch)
      SELECT clock_timestamp(), run, key, 'intent', current_user, session_user,
             current_setting('application_name'), inet_client_addr(), pg_backend_pid(), 1 FROM i"""
    counter = iter(range(10 ** 6))

    def ledger():
        run = f"bench-cpu-hand-{next(counter)}"
        with conn.transaction():
            t = timed(conn, ledger_sql, (run,))
        conn.execute("SELECT durable_ledger.release_run(%s)", (run,))
        return (t,)

    def floor():
        run = f"bench-cpu-floor-{next(counter)}"
        with conn.transaction():
            return (timed(conn, floor_sql, (run, run)),)

    return interleaved(rounds, ledger, floor)


def replay(conn, rounds, n):
    """begin_effect of completed effects in a new lease epoch, against a plain
    primary-key SELECT of the same rows; n calls in one transaction each."""
    run = "bench-replay"
    conn.execute(f"""SELECT durable_ledger.complete_effect(d.key, '{{"payment_id": "p"}}')
                       FROM generate_series(1, {n}) g,
                            LATERAL durable_ledger.begin_effect('{run}', 'bank.pay', jsonb_build_object('invoice', g)) d""")
    keys = [r[0] for r in conn.execute(
        "SELECT key FROM durable_ledger.effects WHERE run = %s ORDER BY occurrence, key", (run,))]
    args = [Jsonb({"invoice": g}) for g in range(1, n + 1)]

    def ledger():
        conn.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        t = time.perf_counter()
        with conn.transaction():
            for a in args:
                conn.execute("SELECT decision FROM durable_ledger.begin_effect(%s, 'bank.pay', %s)",
                             (run, a), prepare=True)
        return (n / (time.perf_counter() - t),)

    def select():
        t = time.perf_counter()
        with conn.transaction():
            for k in keys:
                conn.execute("SELECT * FROM durable_ledger.effects WHERE key = %s", (k,), prepare=True)
        return (n / (time.perf_counter() - t),)

    return interleaved(rounds, ledger, select)


def settle(conn, floor=("floor_effects", "floor_audit")):
    """Starts a section from the same state for both sides: the tables the
    previous section wrote vacuumed (so that autovacuum does not wake up in the
    middle of a measurement) and a checkpoint behind us.  A ledger table the cluster's
    version does not have (an earlier commit's, --access-before: run_budgets is 1.3's) is
    passed over; the floor's tables are the section's own and must be there."""
    ledger = ("durable_ledger.effects", "durable_ledger.audit_log", "durable_ledger.runs",
              "durable_ledger.token_leases", "durable_ledger.token_lease_calls",
              "durable_ledger.run_budgets")
    present = conn.execute("SELECT t FROM unnest(%s::text[]) t WHERE to_regclass(t) IS NOT NULL",
                           (list(ledger),)).fetchall()
    for table in [t for (t,) in present] + list(floor):
        conn.execute(f"VACUUM (ANALYZE) {table}")
    conn.execute("CHECKPOINT")


class PgBouncer:
    """Debian's PgBouncer in transaction pooling mode in front of the bench
    cluster (reached over its Unix socket), listening on 127.0.0.1 at a free
    port; run as the postgres OS user when bench.py runs as root (PgBouncer
    refuses root).  A context manager: stopped (SIGTERM) and its folder removed
    on exit."""

    def __init__(self, args):
        info = psycopg.conninfo.conninfo_to_dict(args.dsn)
        self.pool_size = args.pool_size
        self.binary = args.pgbouncer or shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        self.dir = tempfile.mkdtemp(prefix="durable_ledger_bench_pgbouncer.")
        with socket.socket() as s:  # a free port
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        user = info.get("user") or pwd.getpwuid(os.getuid()).pw_name
        with open(os.path.join(self.dir, "userlist.txt"), "w") as f:
            f.write(f'"{user}" ""\n')
        with open(os.path.join(self.dir, "pgbouncer.ini"), "w") as f:
            f.write(f"[databases]\n* = host={info.get('host', '/tmp')} port={info.get('port', 5432)}\n\n"
                    f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
                    f"auth_type = trust\nauth_file = {self.dir}/userlist.txt\npool_mode = transaction\n"
                    f"default_pool_size = {self.pool_size}\nreserve_pool_size = 0\nmax_client_conn = 200\n"
                    f"ignore_startup_parameters = extra_float_digits\n")
        self.dsn = psycopg.conninfo.make_conninfo(
            "", host="127.0.0.1", port=self.port, dbname=info.get("dbname", "postgres"), user=user)
        self.as_user = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            for name in os.listdir(self.dir):
                os.chown(os.path.join(self.dir, name), pw.pw_uid, pw.pw_gid)
            self.as_user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def __enter__(self):
        self.log = open(os.path.join(self.dir, "pgbouncer.log"), "w")
        self.proc = subprocess.Popen([self.binary, os.path.join(self.dir, "pgbouncer.ini")],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     **self.as_user)
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.dsn, autocommit=True, prepare_threshold=None) as c:
                    c.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise SystemExit("pgbouncer did not start: "
                                     + open(os.path.join(self.dir, "pgbouncer.log")).read()[-2000:])
                time.sleep(0.1)

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def pooler(args, conn, logdir, clients):
    """begin+complete under token leases through PgBouncer against the floor
    through the same PgBouncer; yields a row per number of clients."""
    rounds = iter(range(10 ** 6))

    def ledger(dsn, c, seconds=None):
        result = pgbench(args, "ledger_token_pair.sql", c, seconds or args.seconds, logdir, f"pl{c}", dsn=dsn,
                         protocol="extended", defines={"have_lease": 0, "round": next(rounds)})
        # the round's leases outlive its clients: end them, as a supervisor would
        conn.execute("SELECT count(durable_ledger.break_lease(run, 'bench', 'end of a pgbench round'))"
                     "  FROM durable_ledger.leases WHERE kind = 'token'")
        return result

    with PgBouncer(args) as bouncer:
        for c in clients:
            # Not measured: a round of each side first, so that the pooler has
            # opened its server connections and the token leases' tables are not
            # empty when settle() analyzes them.  The server connections live
            # across rounds, and so do the plans they cached: a lookup planned
            # on an empty table (a sequential scan) would stay until autovacuum
            # analyzes it again, getting slower with every call (see README).
            ledger(bouncer.dsn, c, max(2, args.seconds // 4))
            pgbench(args, "floor_pair.sql", c, max(2, args.seconds // 4), logdir, f"pw{c}",
                    dsn=bouncer.dsn, protocol="extended")
            settle(conn)
            led, flo = interleaved(args.rounds,
                                   lambda: ledger(bouncer.dsn, c),
                                   lambda: pgbench(args, "floor_pair.sql", c, args.seconds, logdir, f"pf{c}",
                                                   dsn=bouncer.dsn, protocol="extended"))
            yield (f"begin+complete, token leases through PgBouncer, {c} client{'s' if c > 1 else ''}",
                   med(led, 0) / med(flo, 0), "≥ 0.95",
                   f"ledger {med(led, 0):.0f} tps (p50 {med(led, 1):.2f} ms, p99 {med(led, 2):.2f} ms); "
                   f"floor {med(flo, 0):.0f} tps (p50 {med(flo, 1):.2f} ms, p99 {med(flo, 2):.2f} ms); "
                   f"transaction pooling, {bouncer.pool_size} server connections, -M extended")


# The last commit before issue 15's access paths (unsettled and the audit log's
# BRIN, decisions and replays indexes): what the access section compares with.
ACCESS_BEFORE = "5a28b21"
# the sections --before measures in a second cluster (issue 34's measures)
BEFORE_SECTIONS = ("registered", "batch", "clients", "callgrind", "fleet")


def register_bench_tool(conn):
    """The workloads make new calls of bank.pay in every attempt of their runs,
    on purpose: measured without divergence checks (1.2 judged no tool nobody
    registered; 1.3 pauses such a call, and answers no key to complete), which
    the registered and unregistered sections measure.  A library that has no
    divergence policy per tool (before 1.2) judges nothing to switch off."""
    if conn.execute("""SELECT EXISTS (SELECT FROM pg_proc
                                      WHERE pronamespace = 'durable_ledger'::regnamespace
                                        AND proname = 'register_tool'
                                        AND 'divergence' = ANY (proargnames))""").fetchone()[0]:
        conn.execute("""SELECT durable_ledger.register_tool('bank.pay', 'bench', divergence => 'off',
                                                         note => 'make bench: new calls in every attempt')
                         WHERE NOT EXISTS (SELECT FROM durable_ledger.tools WHERE tool = 'bank.pay')""")


class BeforeCluster:
    """bench/before-cluster.sh: a second cluster, with the same settings,
    running the library as it was at commit rev.  A context manager: the
    script removes the cluster when its standard input closes."""

    def __init__(self, rev, port):
        self.rev, self.port = rev, port

    def __enter__(self):
        self.proc = subprocess.Popen([os.path.join(HERE, "before-cluster.sh"), self.rev, str(self.port)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("dsn="):
            self.proc.wait()
            raise SystemExit(f"the cluster of {self.rev} did not start (exit {self.proc.returncode})")
        self.dsn = line[len("dsn="):].strip()
        self.src = self.proc.stdout.readline()[len("src="):].strip()  # REV's tree
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.proc.wait()


def what_before(args):
    """What the access section's earlier commit stands for."""
    return "the access paths" if args.access_before == ACCESS_BEFORE else args.access_before


def access(args, conn, logdir, clients):
    """begin+complete against the minimal floor (bench/floor_minimal_pair.sql) in
    this cluster and in a cluster running the library of args.access_before,
    four sides interleaved round by round (rotated(): order.py's balanced order); yields a row
    per number of clients: the median over the rounds of each round's ratio
    after divided by its ratio before."""
    minimal = open(os.path.join(HERE, "floor_minimal.sql")).read()
    conn.execute(minimal)
    with BeforeCluster(args.access_before, args.port + 1) as before, \
            psycopg.connect(before.dsn, autocommit=True) as bconn:
        bconn.execute(minimal)
        register_bench_tool(bconn)
        sides = {
            "ledger after": lambda c: pgbench(args, "ledger_pair.sql", c, args.seconds, logdir, f"al{c}"),
            "floor after": lambda c: pgbench(args, "floor_minimal_pair.sql", c, args.seconds, logdir, f"af{c}"),
            "ledger before": lambda c: pgbench(args, "ledger_pair.sql", c, args.seconds, logdir, f"bl{c}",
                                               dsn=before.dsn),
            "floor before": lambda c: pgbench(args, "floor_minimal_pair.sql", c, args.seconds, logdir, f"bf{c}",
                                              dsn=before.dsn),
        }
        names = list(sides)
        for c in clients:
            settle(conn, floor=("minimal_effects", "minimal_audit"))
            settle(bconn, floor=("minimal_effects", "minimal_audit"))
            results = rotated(args.rounds, {name: (lambda run=run: run(c)) for name, run in sides.items()})
            # Each round's four sides ran within a minute of each other: the
            # round's own ratio of ratios cancels what drifts between rounds
            # (the machine's other load, the disk's flush times), and the
            # median of the rounds' is the figure.
            per_round = [(results["ledger after"][r][0] / results["floor after"][r][0])
                         / (results["ledger before"][r][0] / results["floor before"][r][0])
                         for r in range(args.rounds)]
            m = {name: med(results[name], 0) for name in names}
            after, before_ratio = m["ledger after"] / m["floor after"], m["ledger before"] / m["floor before"]
            yield (f"begin+complete vs the minimal floor, {c} client{'s' if c > 1 else ''}: "
                   f"after / before {what_before(args)}", statistics.median(per_round), "≥ 0.95",
                   f"rounds {min(per_round):.2f}x to {max(per_round):.2f}x; "
                   f"after {after:.2f}x (ledger {m['ledger after']:.0f} tps, floor {m['floor after']:.0f} tps); "
                   f"before ({args.access_before}) {before_ratio:.2f}x (ledger {m['ledger before']:.0f} tps, "
                   f"floor {m['floor before']:.0f} tps)")
            # The same comparison with the ledger and the floor mixed in one
            # pgbench run per cluster, script chosen per transaction: the two
            # see the same flushes, so each cluster's ratio (floor's mean
            # latency / ledger's: about what the ledger keeps of the floor's
            # throughput; the floor absorbs a fifth of a difference,
            # bench/README.md) no longer moves with the disk between runs;
            # the clusters alternate round by round.
            scripts = ["ledger_pair.sql", "floor_minimal_pair.sql"]
            kept = {"after": [], "before": []}
            for r in range(args.rounds):
                for side in (("after", "before") if r % 2 == 0 else ("before", "after")):
                    ledger_ms, floor_ms = pgbench_mixed(args, scripts, c, args.seconds, logdir,
                                                        f"m{side[0]}{c}",
                                                        dsn=before.dsn if side == "before" else None)
                    kept[side].append(floor_ms / ledger_ms)
            mixed = [a / b for a, b in zip(kept["after"], kept["before"])]
            yield (f"the same, ledger and floor mixed per transaction, {c} client{'s' if c > 1 else ''}",
                   statistics.median(mixed), "≥ 0.95",
                   f"rounds {min(mixed):.2f}x to {max(mixed):.2f}x; "
                   f"after {statistics.median(kept['after']):.2f}x, "
                   f"before ({args.access_before}) {statistics.median(kept['before']):.2f}x of the floor")


def ledger_bytes(conn):
    return conn.execute("""
        SELECT sum(pg_total_relation_size(c)) FROM unnest(ARRAY[
            'durable_ledger.effects', 'durable_ledger.audit_log', 'durable_ledger.runs']::regclass[]) c""").fetchone()[0]


def populate(conn, target):
    """Grows the ledger to about target effects with rows shaped like real ones
    (completed, an intent and a completion in the audit log), written in bulk."""
    have = conn.execute("SELECT count(*) FROM durable_ledger.effects").fetchone()[0]
    batch = 200000
    while have < target:
        n = min(batch, target - have)
        conn.execute(f"""
            WITH e AS (
              INSERT INTO durable_ledger.effects (key, run, tool, args, business_key, occurrence, attempt,
                  status, result, lease_epoch, holder_pid, created_at, completed_at)
              SELECT encode(sha256(convert_to('fill|' || {have} + g, 'UTF8')), 'hex'),
                     'fill-' || (({have} + g) / 100), 'bank.pay',
                     jsonb_build_object('invoice', {have} + g, 'amount', 4200, 'currency', 'USD'),
                     false, 1, 1, 'completed', '{{"payment_id": "pay_1"}}', 1, 0,
                     clock_timestamp(), clock_timestamp()
                FROM generate_series(1, {n}) g
              RETURNING key, run)
            INSERT INTO durable_ledger.audit_log (logged_at, run, key, event, role_name, session_user_name,
                  application_name, backend_pid, lease_epoch)
            SELECT clock_timestamp(), run, key, ev, 'bench', 'bench', 'bench', 0, 1
              FROM e, unnest(ARRAY['intent', 'completed']) ev""")
        have += n
    conn.execute("VACUUM ANALYZE durable_ledger.effects")
    conn.execute("VACUUM ANALYZE durable_ledger.audit_log")
    conn.execute("CHECKPOINT")


SECTIONS = ("pairs", "registered", "unregistered", "budgeted", "local", "batch", "replay", "handoff", "pooler", "access", "growth",
            "audit", "console", "proxy", "gateway", "clients", "callgrind", "fleet")


def bench_settings():
    """The postgresql.conf lines of bench/settings.sh, for the clusters a section starts."""
    with open(os.path.join(HERE, "settings.sh")) as f:
        text = f.read()
    return re.findall(r'^\s*"(.*)"\s*$', text.split("bench_settings=(", 1)[1].split(")\n", 1)[0], re.M)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--pgbench", default="pgbench")
    p.add_argument("--pgbouncer", help="the pgbouncer binary (default: on PATH, else /usr/sbin/pgbouncer)")
    p.add_argument("--seconds", type=int, default=8, help="length of one pgbench round")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each side, interleaved")
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--pool-size", type=int, default=8,
                   help="PgBouncer's default_pool_size (server connections) in the pooler section")
    p.add_argument("--big", type=int, default=2000000, help="effects in the ledger for the growth test")
    p.add_argument("--audit-effects", type=int, default=10000000,
                   help="effects written through the ledger for the audit section")
    p.add_argument("--access-before", default=ACCESS_BEFORE,
                   help="the commit the access section compares with (default: the last one before "
                        "the access paths of issue 15)")
    p.add_argument("--access-clients", default="1,8", help="the access section's numbers of clients")
    p.add_argument("--port", type=int, default=5434,
                   help="the bench cluster's port; the access section's second cluster uses the next one")
    p.add_argument("--fleet-rates", type=lambda v: [int(x) for x in v.split(",")],
                   default=[250, 500, 750, 1000, 1250, 1500, 2000, 2500, 3000],
                   help="the fleet section's offered rates (calls/s), stepped up until p99 passes 50 ms")
    p.add_argument("--fleet-seconds", type=int, default=15, help="the fleet section's window per step")
    p.add_argument("--fleet-ramp", type=int, default=5, help="the fleet section's ramp before each window")
    p.add_argument("--fleet-refine", type=int, default=1,
                   help="the fleet section's steps halving each side's bracket (its last step within 50 ms, "
                        "its first over it) after the rates")
    p.add_argument("--fleet-procs", type=int, default=fleet_scale.FLEET_PROCS,
                   help="the fleet section's client processes")
    p.add_argument("--before", default=None,
                   help="a commit: the " + ", ".join(BEFORE_SECTIONS) + " sections also measure its library "
                        "(in a second cluster, on the port after the access section's) and its clients, "
                        "in the same run (the registered and batch sections each against its own floor)")
    p.add_argument("--only", default=",".join(SECTIONS),
                   help="the sections to run, comma-separated: " + ", ".join(SECTIONS))
    args = p.parse_args()
    only = set(args.only.split(","))
    if not only <= set(SECTIONS):
        p.error(f"--only: unknown section {', '.join(sorted(only - set(SECTIONS)))}")
    clients = [int(x) for x in args.clients.split(",")]

    conn = psycopg.connect(args.dsn, autocommit=True)
    conn.execute(open(os.path.join(HERE, "floor.sql")).read())
    register_bench_tool(conn)
    logdir = tempfile.mkdtemp(prefix="durable_ledger_bench_logs.")
    rows = []
    say = lambda *a: print(*a, flush=True)
    # --before: one cluster of that commit's library for every section that measures it
    # (removed when this process ends: before-cluster.sh waits for its standard input)
    stack = contextlib.ExitStack()
    before = bconn = None
    if args.before and only & set(BEFORE_SECTIONS):
        say(f"a second cluster with the library of {args.before} (--before) ...")
        before = stack.enter_context(BeforeCluster(args.before, args.port + 2))
        bconn = stack.enter_context(psycopg.connect(before.dsn, autocommit=True))
        bconn.execute(open(os.path.join(HERE, "floor.sql")).read())
        register_bench_tool(bconn)
    was = f"before ({args.before})"

    if "pairs" in only:
        say("begin+complete against the floor ...")
        for c in clients:
            settle(conn)
            led, flo = interleaved(args.rounds,
                                   lambda: pgbench(args, "ledger_pair.sql", c, args.seconds, logdir, f"l{c}"),
                                   lambda: pgbench(args, "floor_pair.sql", c, args.seconds, logdir, f"f{c}"))
            rows.append((f"begin+complete, {c} client{'s' if c > 1 else ''}",
                         med(led, 0) / med(flo, 0), "≥ 0.97",
                         f"ledger {med(led, 0):.0f} tps (p50 {med(led, 1):.2f} ms, p99 {med(led, 2):.2f} ms); "
                         f"floor {med(flo, 0):.0f} tps (p50 {med(flo, 1):.2f} ms, p99 {med(flo, 2):.2f} ms)"))
            say("  ", rows[-1])

    # a tool judged for divergence in a later attempt: registered, and (1.3's
    # default) one nobody registered, whose policy is read from the policy row
    judged = (("registered", "bench.pay", "a registered tool", "r"),
              ("unregistered", "bench.unregistered", "an unregistered tool", "u"))
    rounds = iter(range(10**6))
    for section, tool, what, tag in judged:
        if section not in only:
            continue
        say(f"begin+complete of {what}, divergence checked on every call, against the floor ...")
        if section == "registered":
            conn.execute("""SELECT durable_ledger.register_tool('bench.pay', 'bench', note => 'make bench')
                             WHERE NOT EXISTS (SELECT FROM durable_ledger.tools WHERE tool = 'bench.pay')""")
        if section == "registered" and before:
            bconn.execute("""SELECT durable_ledger.register_tool('bench.pay', 'bench', note => 'make bench')
                              WHERE NOT EXISTS (SELECT FROM durable_ledger.tools WHERE tool = 'bench.pay')""")
        judged_before = before if section in BEFORE_SECTIONS else None
        for c in clients:
            settle(conn)
            dsns = {"": None}
            if judged_before:
                settle(bconn)
                dsns[" before"] = before.dsn
            sides = {}
            for side, dsn in dsns.items():
                sides["ledger" + side] = (lambda dsn=dsn, side=side: pgbench(
                    args, "ledger_registered_pair.sql", c, args.seconds, logdir, f"{tag}{side.strip()}{c}", dsn=dsn,
                    defines={"started": 0, "round": next(rounds), "tool": tool}))
                sides["floor" + side] = (lambda dsn=dsn, side=side: pgbench(
                    args, "floor_pair.sql", c, args.seconds, logdir, f"{tag}f{side.strip()}{c}", dsn=dsn))
            results = rotated(args.rounds, sides)
            for side in dsns:
                led, flo = results["ledger" + side], results["floor" + side]
                rows.append((f"begin+complete, {what.split(' ', 1)[1]}, divergence checked, {c} client{'s' if c > 1 else ''}"
                             + (f", {was}" if side else ""),
                             med(led, 0) / med(flo, 0), "≥ 0.95" if not side else "(before)",
                             f"ledger {med(led, 0):.0f} tps (p50 {med(led, 1):.2f} ms, p99 {med(led, 2):.2f} ms); "
                             f"floor {med(flo, 0):.0f} tps (p50 {med(flo, 1):.2f} ms, p99 {med(flo, 2):.2f} ms)"
                             + ("; the four sides interleaved with the rows before" if judged_before else "")))
                say("  ", rows[-1])

    if "budgeted" in only:
        # a tool with a budget per run (1.3): every execution reads and writes the run's
        # counter of the tool; the budget is never reached
        say("begin+complete of a tool with a budget, against the floor of the same rows ...")
        conn.execute("""SELECT durable_ledger.register_tool('bench.mail', 'bench', note => 'make bench')
                         WHERE NOT EXISTS (SELECT FROM durable_ledger.tools WHERE tool = 'bench.mail')""")
        conn.execute("SELECT durable_ledger.set_budget('bench.mail', 2000000000, 'bench', 'never reached')")
        for c in clients:
            settle(conn, floor=("floor_effects", "floor_audit", "floor_run_budgets"))
            led, flo = interleaved(args.rounds,
                                   lambda: pgbench(args, "ledger_budgeted_pair.sql", c, args.seconds, logdir,
                                                   f"b{c}", defines={"round": next(rounds)}),
                                   lambda: pgbench(args, "floor_budgeted_pair.sql", c, args.seconds, logdir,
                                                   f"bf{c}"))
            rows.append((f"begin+complete, a tool with a budget, {c} client{'s' if c > 1 else ''}",
                         med(led, 0) / med(flo, 0), "≥ 0.95",
                         f"ledger {med(led, 0):.0f} tps (p50 {med(led, 1):.2f} ms, p99 {med(led, 2):.2f} ms); "
                         f"floor {med(flo, 0):.0f} tps (p50 {med(flo, 1):.2f} ms, p99 {med(flo, 2):.2f} ms)"))
            say("  ", rows[-1])

    if "local" in only:
        # what the ledger adds to a write in its own database: the intent, the outcome and
        # their audit rows in the write's transaction (one commit either way)
        say("local effects (begin_local, the write, complete_effect) against the write alone ...")
        conn.execute("CREATE TABLE IF NOT EXISTS bench_orders (id bigserial PRIMARY KEY, run text, "
                     "item bigint, ledger_key text)")
        # new calls in every attempt, as bank.pay's (register_bench_tool)
        conn.execute("""SELECT durable_ledger.register_tool('shop.order', 'bench', divergence => 'off',
                                                         note => 'make bench: new calls in every attempt')
                         WHERE NOT EXISTS (SELECT FROM durable_ledger.tools WHERE tool = 'shop.order')""")
        for c in clients:
            settle(conn, floor=("floor_effects", "floor_audit", "bench_orders"))
            led, flo = interleaved(args.rounds,
                                   lambda: pgbench(args, "local_pair.sql", c, args.seconds, logdir, f"lo{c}"),
                                   lambda: pgbench(args, "local_floor.sql", c, args.seconds, logdir, f"lof{c}"))
            rows.append((f"local effect vs its write alone, {c} client{'s' if c > 1 else ''}",
                         med(led, 0) / med(flo, 0), "(context)",
                         f"ledger {med(led, 0):.0f} tps (p50 {med(led, 1):.2f} ms, p99 {med(led, 2):.2f} ms); "
                         f"write alone {med(flo, 0):.0f} tps (p50 {med(flo, 1):.2f} ms, p99 {med(flo, 2):.2f} ms)"))
            say("  ", rows[-1])

    # the single-transaction measures take well under a second a round: more rounds
    short_rounds = max(args.rounds, 11)
    if "batch" in only:
        say("20,000 intents in one transaction against INSERT ... SELECT of the same rows ...")
        check_floor_tables(conn)
        batch_tables = ("floor_effects", "floor_audit", "floor_unsettled", "durable_ledger.unsettled")
        # with --before: after and before alternated, a third of the rounds at a time, each
        # cluster's ledger against its own floor
        passes = [("", conn)] + ([(f", {was}", bconn)] * bool(before))
        figures = {side: ([], []) for side, _ in passes}
        for part in range(3 if before else 1):
            for side, c in (passes if part % 2 == 0 else passes[::-1]):
                if side:
                    check_floor_tables(c)
                settle(c, floor=batch_tables)
                led, flo = cpu_bound(c, short_rounds if not before else max(4, short_rounds // 3 + 1), 20000)
                figures[side][0].extend(led)
                figures[side][1].extend(flo)
        for side, _ in passes:
            led, flo = figures[side]
            rows.append(("20,000 begin_effect vs INSERT … SELECT of the same rows (time)" + side,
                         med(led, 0) / med(flo, 0), "≤ 1.6" if not side else "(before)",
                         f"ledger {med(led, 0) * 1000:.0f} ms; floor {med(flo, 0) * 1000:.0f} ms (the ledger's run of "
                         f"the round before: 20,000 effects, 20,000 unsettled rows, {med(flo, 1):.0f} audit rows with "
                         f"their chain hashes, one INSERT … SELECT per table into LIKE … INCLUDING ALL copies, one "
                         f"transaction; statements timed, commits not; {len(led)} rounds)"))
            say("  ", rows[-1])
        # the earlier floor (hand-made rows, one statement), kept for comparison with earlier runs
        settle(conn, floor=batch_tables)
        led, flo = cpu_bound_hand_made(conn, short_rounds, 20000)
        rows.append(("20,000 begin_effect vs hand-made rows (the earlier floor; time)",
                     med(led, 0) / med(flo, 0), "≤ 1.3",
                     f"ledger {med(led, 0) * 1000:.0f} ms; floor {med(flo, 0) * 1000:.0f} ms (keys, effects, "
                     f"unsettled and intent audit rows made by one statement: fewer columns, no chain)"))
        say("  ", rows[-1])

    if "replay" in only:
        say("replay against a primary-key SELECT ...")
        settle(conn)
        led, sel = replay(conn, short_rounds, 5000)
        rows.append(("replay in a new epoch vs PK SELECT (throughput)", med(led, 0) / med(sel, 0), "≥ 0.8",
                     f"ledger {med(led, 0):.0f}/s; SELECT {med(sel, 0):.0f}/s (5,000 calls per transaction)"))
        say("  ", rows[-1])

    if "handoff" in only:
        say("contention: 8 workers on 1 run ...")
        hand = [pgbench(args, "handoff.sql", 8, args.seconds, logdir, "h8") for _ in range(args.rounds)]
        one = [pgbench(args, "handoff.sql", 1, args.seconds, logdir, "h1") for _ in range(args.rounds)]
        rows.append(("8 workers on 1 run: handoffs/s vs 1 worker", med(hand, 0) / med(one, 0), "(context)",
                     f"{med(hand, 0):.0f} handoffs/s with 8 workers; {med(one, 0):.0f}/s with 1 "
                     f"(p99 {med(hand, 2):.2f} ms)"))
        say("  ", rows[-1])

    if "pooler" in only:
        say("begin+complete under token leases through PgBouncer (transaction pooling) against the floor ...")
        for row in pooler(args, conn, logdir, clients):
            rows.append(row)
            say("  ", rows[-1])

    if "access" in only:
        say(f"begin+complete against the minimal floor, before ({args.access_before}) and after the access paths ...")
        for row in access(args, conn, logdir, [int(x) for x in args.access_clients.split(",")]):
            rows.append(row)
            say("  ", rows[-1])

    if "growth" in only:
        say("growth: 10,000 vs %d effects ..." % args.big)
        populate(conn, 10000)
        before_bytes = ledger_bytes(conn)
        before_n = conn.execute("SELECT count(*) FROM durable_ledger.effects").fetchone()[0]
        small = [pgbench(args, "ledger_pair.sql", 8, args.seconds, logdir, "g_small") for _ in range(args.rounds)]
        n_small = conn.execute("SELECT count(*) FROM durable_ledger.effects").fetchone()[0]
        bytes_small = ledger_bytes(conn)
        populate(conn, args.big)
        big = [pgbench(args, "ledger_pair.sql", 8, args.seconds, logdir, "g_big") for _ in range(args.rounds)]
        rows.append((f"p99 at {args.big:,} effects vs at 10,000", med(big, 2) / med(small, 2), "≤ 1.2",
                     f"p99 {med(big, 2):.2f} ms vs {med(small, 2):.2f} ms (8 clients); "
                     f"p50 {med(big, 1):.2f} vs {med(small, 1):.2f} ms"))
        say("  ", rows[-1])
        scrapes = []
        for _ in range(max(args.rounds, 5)):
            t0 = time.perf_counter()
            conn.execute("SELECT * FROM durable_ledger.metrics").fetchall()
            conn.execute("SELECT * FROM durable_ledger.metrics_events()").fetchall()
            scrapes.append((time.perf_counter() - t0) * 1000)
        plan = conn.execute("EXPLAIN (COSTS OFF) SELECT * FROM durable_ledger.metrics").fetchall()
        scans = sorted({line[0].strip().split(" on ")[0].lstrip("-> ").strip() + " on " + line[0].split(" on ")[1].split()[0]
                        for line in plan if " on " in line[0] and "Scan" in line[0]})
        rows.append((f"metrics scrape at {args.big:,} effects (ms)", statistics.median(scrapes), "< 50",
                     "durable_ledger.metrics + metrics_events(); plan: " + "; ".join(scans)))
        say("  ", rows[-1])
        per_effect = (bytes_small - before_bytes) / max(1, n_small - before_n)
        rows.append(("bytes per effect (effects + audit log + runs, with indexes)", per_effect, "(context)",
                     "measured over the effects written by real begin/complete pairs"))

    if "audit" in only:
        # after growth (if both run): the audit section's database is its own
        rows.extend(audit_section(args, audit_dsn(conn, args.dsn), os.path.join(HERE, "..", "docs", "auditing.md"), say))
    if "console" in only:
        # the audit section's database (filled once when both run)
        rows.extend(console_section(args, audit_dsn(conn, args.dsn), say))

    if "proxy" in only:
        say("begin+complete through the proxy (durable_ledger_proxy) against direct, and with 1, 2, 3 shards ...")
        for row in proxy_section(args, os.path.dirname(args.pgbench), bench_settings(), logdir):
            rows.append(row)
            say("  ", row)

    if "gateway" in only:
        # the MCP gateway (adapters/mcp-gateway): what it adds to a tool call's latency
        rows.extend(gateway_section(args, args.dsn, say))

    if "clients" in only:
        # the clients' own CPU per guarded call (issue 34)
        rows.extend(clients_section(args, args.dsn, say, before and before.src, was))

    if "callgrind" in only:
        # instructions per begin+complete pair, counted, not timed (issue 34)
        if shutil.which("valgrind") is None:
            say("callgrind: valgrind is not installed (apt-get install valgrind); section skipped")
        else:
            say("instructions per begin+complete pair (callgrind, single-user backends) ...")
            trees = [("", None, "/tmp/dl-callgrind")] + ([(f", {was}", before.src, "/tmp/dl-callgrind-before")]
                                                         * bool(before))
            # the pair under the session's lease; a fleet's workers call under a token lease,
            # and take one for each run of calls and release it (CG_LEASE=take: a new run's each)
            for lease, kind in (("session", ""), ("token", " under a token lease"),
                                ("take", " (a new run's take_lease and release_lease)")):
                for side, src, work in trees:
                    done = subprocess.run(["bash", os.path.join(HERE, "callgrind", "run.sh")] + ([src] if src else []),
                                          capture_output=True, text=True,
                                          env={**os.environ, "CG_WORK": work, "CG_LEASE": lease})
                    if done.returncode:
                        raise SystemExit(f"bench: bench/callgrind/run.sh failed: {done.stderr.strip()}")
                    found = re.search(r"instructions per (?:pair|take\+release): (\d+)", done.stdout)
                    what = "take+release" if lease == "take" else "begin+complete pair"
                    rows.append((f"instructions per {what}{kind}{side} (count)", float(found.group(1)),
                                 ("≤ 420,000" if lease == "session" else "") if not side else "(before)",
                                 "callgrind, 2,500 minus 500 pairs, bench/callgrind/run.sh"
                                 + (f" (CG_LEASE={lease})" if lease != "session" else "")
                                 + (f" on {args.before}'s tree" if side else "")))
                    say("  ", rows[-1])

    if "fleet" in only:
        # the fleet shape (issue 34): its own PgBouncer, with the 20 server connections
        # (and in each cluster a database of its own, made anew: fleet_scale.fresh_database)
        fleet_args = argparse.Namespace(**{**vars(args), "pool_size": fleet_scale.SERVER_CONNECTIONS})
        with contextlib.ExitStack() as fleet:
            # the bench databases left as every section leaves them: vacuumed, so that
            # autovacuum does not wake up for what the sections before wrote during a step
            settle(conn)
            if before:
                settle(bconn)
            fleet_dsn, fconn = fleet_scale.fresh_database(args.dsn)
            fleet.enter_context(fconn)
            bouncer = fleet.enter_context(PgBouncer(argparse.Namespace(**{**vars(fleet_args), "dsn": fleet_dsn})))
            earlier = None
            if before:
                before_dsn, bfconn = fleet_scale.fresh_database(before.dsn)
                fleet.enter_context(bfconn)
                bouncer_before = fleet.enter_context(PgBouncer(argparse.Namespace(**{**vars(fleet_args),
                                                                                   "dsn": before_dsn})))
                earlier = fleet_scale.Before(args.before, bfconn, bouncer_before, before.src,
                                             lambda: settle(bfconn, floor=fleet_scale.FLOOR_TABLES))
            rows.extend(fleet_scale.fleet_section(args, fconn, bouncer,
                                                  lambda: settle(fconn, floor=fleet_scale.FLOOR_TABLES), say, earlier))

    cores = os.cpu_count()
    print()
    print(f"durable_ledger bench, {datetime.date.today()}, {cores} cores, PostgreSQL "
          + conn.execute("SHOW server_version").fetchone()[0] + f", {platform.machine()}; "
          f"median of {args.rounds} interleaved rounds of {args.seconds} s"
          + (f" ({short_rounds} rounds for the single-transaction measures)" if only & {"batch", "replay"} else "")
          + (f"; PgBouncer {args.pool_size} server connections, transaction pooling" if "pooler" in only else ""))
    print()
    print("| measure | ratio | target | context |")
    print("| --- | --- | --- | --- |")
    for name, ratio, target, ctx in rows:
        value = (f"{ratio:.0f}" if name.startswith("bytes") or name.endswith("(count)") else
                 f"{ratio:.2f} ms" if name.endswith("(ms)") and ratio < 10 else
                 f"{ratio:.1f} ms" if name.endswith("(ms)") else
                 f"{ratio:,.0f} calls/s" if name.endswith("(calls/s)") else
                 f"{ratio:.0f} s" if name.endswith("(s)") else f"{ratio:.2f}x")
        print(f"| {name} | {value} | {target} | {ctx} |")
    shutil.rmtree(logdir, ignore_errors=True)
    stack.close()


if __name__ == "__main__":
    main()
