"""make bench, section "fleet": the fleet shape's saturation point (issue 34).

Agent runs arrive open-loop (Poisson: a run starts when its time comes, whether or not the
ledger has kept up) at a stepped offered rate.  Each run is what a fleet's worker does:
`AsyncLedger.token_attempt` on a `psycopg_pool.AsyncConnectionPool` through PgBouncer
(transaction pooling, 20 server connections), three guarded calls whose tools do nothing,
each after a model turn of 0.5-1.5 s (uniform, asyncio.sleep: the model is elsewhere), and
the lease released.  A call's latency is the wall time of its `guarded` (begin_effect,
the tool, complete_effect), pool checkout included.

The runs are started by FLEET_PROCS client processes on this machine (one per core), each
its own event loop and pool, so that one Python process (one core at most, and an event
loop whose turns lengthen with its load) is not the ceiling being measured.  Each step
ramps for --fleet-ramp seconds (a run lasts about 3 s: by then the number of runs in flight
is steady), then measures --fleet-seconds: offered = calls begun in the window, achieved =
calls finished in it, p50 / p99 over the calls begun in it; errors over the whole step.
What limits a step is read over its window: the CPU of the client processes, the cluster's
processes, PgBouncer, interrupts and the rest of the machine (/proc), the time tasks
stalled on I/O (/proc/pressure/io), what the server connections are doing (sampled from
pg_stat_activity), and how late the client processes' event loops run.  Stepping stops
after a step whose achieved rate is under 90% of its offered one, or after two steps in a
row with p99 over 50 ms (one such step alone may be a moment of the shared machine: a disk
flush stalled, another session's burst).  The saturation point is the highest achieved
rate of a step with p99 <= 50 ms and no error (not interpolated: a step that met the
bound, not an estimate between two); after the rates, each side's bracket (that step, and
the next one over the bound) is halved --fleet-refine times.

Every rate is stepped by the ledger and by its floor (FLOOR_* below), and with --before
by an earlier commit's library and client in a cluster of its own, in order.py's balanced
order; every side of a step gets the same arrivals and model turns.  Each cluster's fleet
runs in a database of its own made anew (fresh_database).
"""

import asyncio
import collections
import json
import multiprocessing
import os
import random
import resource
import sys
import time

import psycopg

from order import turn_order

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER_CONNECTIONS = 20  # the fleet: PgBouncer's default_pool_size
# One client process per core.  One process alone fell behind at 1,000 calls/s offered (its
# event loop late by 120-170 ms at p99, using 0.7-0.8 of a core); four on two cores did
# worse than two at 750 calls/s (p99 96 and 59 ms against 17 and 16.5 ms, interleaved;
# 0.70 core of client CPU against 0.57): more loops and pools, the same two cores.
FLEET_PROCS = os.cpu_count() or 2
CLIENT_POOL = 40  # connections to PgBouncer per process (PgBouncer takes 200 clients in all)
BOUND_MS = 50.0
TOOLS = (("lookup", lambda i: {"customer": i}),
         ("pay", lambda i: {"invoice": i, "amount": 4200}),
         ("mail", lambda i: {"to": f"c{i}@example.com"}))

# The fleet's floor: the same runs, model turns and round trips (a take, two statements a
# call, a release: eight commits a run of three calls) written the usual way with psycopg on
# the same pool, each a durable write of the minimal floor's rows (bench/floor_minimal.sql:
# an intent with its audit row, then the completion with its audit row, a primary key each)
# and a lease row taken and deleted.  What the same fleet costs with nothing of the ledger.
FLOOR_TABLES = ("minimal_effects", "minimal_audit", "fleet_floor_leases")
FLEET_DATABASE = "durable_ledger_bench_fleet"
FLOOR_LEASES = """CREATE TABLE IF NOT EXISTS fleet_floor_leases (
    run text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz NOT NULL)"""
FLOOR_TAKE = "INSERT INTO fleet_floor_leases (run, holder, expires_at) VALUES (%s::text, %s::text, now() + interval '60 seconds')"
FLOOR_RELEASE = "DELETE FROM fleet_floor_leases WHERE run = %s::text"
FLOOR_INTENT = """WITH i AS (
    INSERT INTO minimal_effects (key, run, tool, args, business_key, occurrence, attempt,
                                 status, lease_epoch, holder_pid, created_at)
    VALUES (encode(sha256(convert_to(%(run)s::text || '|' || %(tool)s::text || '|' || %(args)s::text, 'UTF8')), 'hex'),
            %(run)s::text, %(tool)s::text, %(args)s::text::jsonb, false, 1, 1, 'started', 1, pg_backend_pid(), clock_timestamp())
    RETURNING key, run)
INSERT INTO minimal_audit (logged_at, run, key, event, role_name, session_user_name,
                           application_name, client_addr, backend_pid, lease_epoch)
SELECT clock_timestamp(), run, key, 'intent', current_user, session_user,
       current_setting('application_name'), inet_client_addr(), pg_backend_pid(), 1
  FROM i
RETURNING key"""
FLOOR_REPORT = """WITH u AS (
    UPDATE minimal_effects SET status = 'completed', result = %s::text::jsonb, completed_at = clock_timestamp()
     WHERE key = %s::text
    RETURNING key, run)
INSERT INTO minimal_audit (logged_at, run, key, event, role_name, session_user_name,
                           application_name, client_addr, backend_pid, lease_epoch)
SELECT clock_timestamp(), run, key, 'completed', current_user, session_user,
       current_setting('application_name'), inet_client_addr(), pg_backend_pid(), 1
  FROM u"""


def worker(pipe, dsn, index, client=os.path.join(HERE, "..", "clients", "python")):
    """A client process: steps (rate in runs/s, ramp, seconds, tag, side) come in on pipe,
    results go back.  client: the folder of the Python client it runs (an earlier commit's,
    for --before)."""
    sys.path.insert(0, client)
    asyncio.run(serve(pipe, dsn, index))


async def serve(pipe, dsn, index):
    from psycopg_pool import AsyncConnectionPool
    from durable_ledger.aio import AsyncLedger

    # autocommit, and no prepared statements: PgBouncer's transaction mode (clients/python/README)
    async with AsyncConnectionPool(dsn, min_size=CLIENT_POOL, max_size=CLIENT_POOL, open=False, kwargs={
            "autocommit": True, "prepare_threshold": None, "application_name": f"fleet-{index}"}) as pool:
        await pool.wait(timeout=60)  # every connection open before any step: no connect in a call's time
        ledger = AsyncLedger(pool)
        pipe.send("ready")
        while (command := pipe.recv()) is not None:  # between steps nothing runs on this loop
            pipe.send(await step(ledger, pool, index, *command))


async def step(ledger, pool, index, rate, ramp, seconds, tag, side="ledger"):
    loop = asyncio.get_running_loop()
    # The same arrivals and model turns for every side of a step: the arrivals drawn from
    # a generator of their own, each run's turns from its own (one generator for both
    # would hand out turns in the order the runs' calls happen to finish)
    arrivals = random.Random(f"{tag}-{index}")
    t0 = loop.time()
    start, end = t0 + ramp, t0 + ramp + seconds
    latencies, begun, finished, errors = [], 0, 0, collections.Counter()
    cpu = []
    for at in (start, end):
        loop.call_at(at, lambda: cpu.append(sum(resource.getrusage(resource.RUSAGE_SELF)[:2])))

    async def floor_take(name):
        async with pool.connection() as conn:
            await conn.execute(FLOOR_TAKE, (name, f"fleet-{index}"))

    async def floor_release(name):
        async with pool.connection() as conn:
            await conn.execute(FLOOR_RELEASE, (name,))

    async def floor_call(name, tool, args):
        """The floor's guarded call: the intent committed, the tool (nothing), the completion committed."""
        async with pool.connection() as conn:
            cur = await conn.execute(FLOOR_INTENT, {"run": name, "tool": tool, "args": json.dumps(args)})
            key = (await cur.fetchone())[0]
        result = {"ok": True}
        async with pool.connection() as conn:
            await conn.execute(FLOOR_REPORT, (json.dumps(result), key))

    async def calls(name, i, call):
        nonlocal begun, finished
        turns = random.Random(f"{tag}-{index}-{i}")
        for tool, args in TOOLS:
            await asyncio.sleep(turns.uniform(0.5, 1.5))  # the model's turn
            began = loop.time()
            if began >= end:
                break  # past the window: the run stops here, its lease released
            begun += start <= began
            await call(name, tool, args(i))
            done = loop.time()
            if start <= began:
                latencies.append(done - began)
            if start <= done < end:
                finished += 1

    async def run(i):
        name = f"fleet-{side}-{tag}-{index}-{i}"
        try:
            if side == "floor":
                await floor_take(name)
                try:
                    await calls(name, i, floor_call)
                finally:
                    await floor_release(name)
            else:
                async with ledger.token_attempt(name, ttl=60):
                    await calls(name, i, lambda name, tool, args: ledger.guarded(
                        name, tool, args, lambda key: {"ok": True}))
        except Exception as exc:  # counted, not raised: the step goes on
            errors[type(exc).__name__] += 1

    async def lag():
        """How late the loop wakes a sleeper in the window: the client's own share of a tail."""
        while (now := loop.time()) < end:
            await asyncio.sleep(0.02)
            if now >= start:
                lags.append(loop.time() - now - 0.02)

    lags = []
    ticker = loop.create_task(lag())
    runs, at, i = set(), t0, 0
    while (at := at + arrivals.expovariate(rate)) < end:
        await asyncio.sleep(at - loop.time())
        task = loop.create_task(run(i))
        runs.add(task)
        task.add_done_callback(runs.discard)
        i += 1
    if runs:
        _, late = await asyncio.wait(set(runs), timeout=60)
        for task in late:  # a saturated step: what is still waiting is given up
            task.cancel()
            errors["not finished in 60 s"] += 1
        if late:
            await asyncio.wait(late)
    await ticker
    return {"lags": lags, "latencies": latencies, "begun": begun, "finished": finished, "errors": dict(errors),
            "cpu": cpu[1] - cpu[0] if len(cpu) == 2 else 0.0}


def proc_cpu(pid, children=False):
    """CPU seconds of a process from /proc/pid/stat; with children, also those of the
    children it has waited for (cutime, cstime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def cluster_cpu(postmaster):
    """The cluster's CPU seconds: the postmaster, its live children, and those that exited
    (a backend's or an autovacuum worker's time moves to the postmaster's cutime when it is
    reaped)."""
    total = proc_cpu(postmaster, children=True)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == postmaster:
                        total += proc_cpu(entry)
            except (OSError, ValueError):
                pass  # gone meanwhile
    return total


def machine_cpu():
    """(busy, interrupts, all) CPU seconds of the whole machine, from /proc/stat; the
    interrupts' (loopback TCP's softirq mostly) is charged to no process."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / hz, (ticks[5] + ticks[6]) / hz, sum(ticks) / hz


def io_stalled():
    """Seconds some task stalled on I/O (/proc/pressure/io), None without PSI."""
    try:
        with open("/proc/pressure/io") as f:
            return int(f.readline().rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return None


def server_waits(conn, seconds):
    """Samples, every 0.1 s for seconds, what the cluster's client backends (PgBouncer's
    server connections) are doing: idle, on CPU (active, no wait event) or waiting (its
    event: IO:WALSync is a commit's flush, LWLock:WALWrite one waiting for another's).
    Returns the mean number of backends in each, the most waiting on WAL in one sample, and
    the share of samples with every server connection busy (calls queue in PgBouncer)."""
    waits, samples, wal_most, all_busy = collections.Counter(), 0, 0, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = collections.Counter()
        for state, wait in conn.execute(
                """SELECT state, coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity
                    WHERE backend_type = 'client backend' AND datname = current_database()
                      AND pid <> pg_backend_pid()"""):
            now[wait if state == "active" else state] += 1
        waits.update(now)
        wal_most = max(wal_most, now["IO:WALSync"] + now["LWLock:WALWrite"] + now["IO:WALWrite"])
        all_busy += sum(now.values()) - now["idle"] >= SERVER_CONNECTIONS
        samples += 1
        time.sleep(0.1)
    return ({k: v / samples for k, v in waits.most_common()}, wal_most, all_busy / samples)


def fresh_database(dsn):
    """The fleet's own database in dsn's cluster, made anew (FLEET_DATABASE, dropped first
    if a run before left it): the extension and the floor's tables, nothing else, so that
    every cluster's fleet starts from the same empty tables whatever the sections before it
    wrote into their databases.  Returns its dsn and a connection to it (autocommit)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {FLEET_DATABASE} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {FLEET_DATABASE}")
    fleet_dsn = psycopg.conninfo.make_conninfo(dsn, dbname=FLEET_DATABASE)
    conn = psycopg.connect(fleet_dsn, autocommit=True)
    conn.execute("CREATE EXTENSION durable_ledger")
    conn.execute(open(os.path.join(HERE, "floor_minimal.sql")).read())
    conn.execute(FLOOR_LEASES)
    return fleet_dsn, conn


class Before:
    """--before: the cluster of an earlier commit's library (bench.py's BeforeCluster),
    its own PgBouncer (the same settings), and that commit's Python client (src: its
    tree), measured as a third side of every step."""

    def __init__(self, rev, conn, bouncer, src, settle):
        self.rev, self.conn, self.bouncer, self.src, self.settle = rev, conn, bouncer, src, settle


class Clients:
    """FLEET_PROCS client processes through one PgBouncer in front of one cluster."""

    def __init__(self, procs, conn, bouncer, client=None):
        self.procs, self.conn, self.bouncer = procs, conn, bouncer
        self.postmaster = int(open(os.path.join(conn.execute("SHOW data_directory").fetchone()[0],
                                                "postmaster.pid")).readline())
        mp = multiprocessing.get_context("spawn")  # a fork would share the driver's libpq sockets
        self.pipes, self.workers = [], []
        for index in range(procs):
            mine, theirs = mp.Pipe()
            w = mp.Process(target=worker, args=(theirs, bouncer.dsn, index) + ((client,) if client else ()),
                           daemon=True)
            w.start()
            self.pipes.append(mine)
            self.workers.append(w)

    def ready(self):
        for p in self.pipes:
            if p.recv() != "ready":
                raise SystemExit("fleet: a client process did not start")

    def stop(self):
        for p in self.pipes:
            try:
                p.send(None)
            except OSError:
                pass
        for w in self.workers:
            w.join(timeout=30)
            if w.is_alive():
                w.terminate()


def fleet_section(args, conn, bouncer, settle, say, before=None):
    """The steps of args.fleet_rates (calls/s offered) through bouncer (bench.py's PgBouncer,
    SERVER_CONNECTIONS server connections, in front of conn's database: fresh_database),
    each rate stepped by the ledger and by its floor, and with before (a `Before`) by the
    earlier commit's ledger too; settle() before each.  Returns bench.py's rows."""
    procs = args.fleet_procs
    here = Clients(procs, conn, bouncer)
    clusters = {"ledger": here, "floor": here}
    settles = {"ledger": settle, "floor": settle}
    if before:
        clusters["before"] = Clients(procs, before.conn, before.bouncer,
                                     os.path.join(before.src, "clients", "python"))
        settles["before"] = before.settle
    sides = list(clusters)
    steps = {side: [] for side in sides}
    try:
        for c in set(clusters.values()):
            c.ready()

        def run_step(calls_per_s, ramp, seconds, tag, side):
            c = clusters[side]
            for p in c.pipes:
                p.send((calls_per_s / 3 / procs, ramp, seconds, tag, "floor" if side == "floor" else "ledger"))
            time.sleep(ramp)
            first = (cluster_cpu(c.postmaster), proc_cpu(c.bouncer.proc.pid), machine_cpu(), io_stalled())
            waits, wal_most, all_busy = server_waits(c.conn, seconds)
            last = (cluster_cpu(c.postmaster), proc_cpu(c.bouncer.proc.pid), machine_cpu(), io_stalled())
            load = os.getloadavg()
            results = [p.recv() for p in c.pipes]
            latencies = sorted(x for r in results for x in r["latencies"])
            q = lambda f: latencies[min(len(latencies) - 1, int(f * len(latencies)))] * 1000 if latencies else 0.0
            lags = sorted(x for r in results for x in r["lags"])
            errors = collections.Counter()
            for r in results:
                errors.update(r["errors"])
            clients = sum(r["cpu"] for r in results) / seconds
            server, pooler = (last[0] - first[0]) / seconds, (last[1] - first[1]) / seconds
            busy, irq, whole = [(a - b) / seconds for a, b in zip(last[2], first[2])]
            achieved = sum(r["finished"] for r in results) / seconds
            return {"nominal": calls_per_s, "offered": sum(r["begun"] for r in results) / seconds,
                    "achieved": achieved,
                    "p50": q(0.50), "p99": q(0.99), "errors": dict(errors),
                    "lag": lags[min(len(lags) - 1, int(0.99 * len(lags)))] * 1000 if lags else 0.0,
                    "cpu": f"clients {clients:.2f}, postgres {server:.2f}, pgbouncer {pooler:.2f}, "
                           f"interrupts {irq:.2f}, other processes {max(0.0, busy - irq - clients - server - pooler):.2f}, "
                           f"idle {whole - busy:.2f} of {whole:.0f} cores"
                           + (f"; I/O stalls {(last[3] - first[3]) / seconds:.0%} of the time"
                              if first[3] is not None else ""),
                    "per_call": f"clients {clients / achieved * 1000:.2f}, postgres {server / achieved * 1000:.2f}, "
                                f"pgbouncer {pooler / achieved * 1000:.2f} ms" if achieved else "-",
                    "server": ", ".join(f"{k} {v:.1f}" for k, v in waits.items() if v >= 0.05)
                              + f" (at most {wal_most} waiting on WAL at once; all {SERVER_CONNECTIONS} busy in "
                                f"{all_busy:.0%} of the samples)",
                    "load": "/".join(f"{x:.1f}" for x in load)}

        say(f"fleet: runs through PgBouncer ({SERVER_CONNECTIONS} server connections), {procs} client process"
            f"{'es' if procs > 1 else ''} a cluster, each rate stepped by: {', '.join(sides)} ...")
        for c in set(clusters.values()):
            # PgBouncer opens server connections as demand grows: all of them now (a
            # transaction held on each), or a backend's start would fall in a step
            held = [psycopg.connect(c.bouncer.dsn, prepare_threshold=None) for _ in range(SERVER_CONNECTIONS)]
            for h in held:
                h.execute("SELECT 1")
            for h in held:
                h.rollback()  # a client gone in a transaction would take its server connection with it
                h.close()

        def measured_step(rate, tag, side):
            settles[side]()  # the floor's tables too, before the checkpoint
            s = run_step(rate, args.fleet_ramp, args.fleet_seconds, tag, side)
            steps[side].append(s)
            say(f"   {side}: offered {s['offered']:.0f} calls/s (nominal {rate}): achieved {s['achieved']:.0f}, "
                f"p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms, errors {s['errors'] or 0}; "
                f"client event loops' lag p99 {s['lag']:.1f} ms; "
                f"CPU {s['cpu']}; per call {s['per_call']}; server connections (mean): {s['server']}; load {s['load']}")
            return s

        # Not measured: rows in the tables before settle() analyzes them, else the server
        # connections' plans are made on empty token-lease tables (bench.py's pooler)
        for side in sides:
            run_step(min(args.fleet_rates), args.fleet_ramp, 3, "warm", side)
        # each rate stepped by every side (the same minutes of the shared machine for all),
        # in order.py's balanced order; each side stops on its own rule
        stepping = {side: 0 for side in sides}  # a side's steps in a row over the bound
        for n, rate in enumerate(args.fleet_rates):
            for side in [x for x in turn_order(sides, n) if x in stepping]:
                s = measured_step(rate, f"s{n}", side)
                stepping[side] = stepping[side] + 1 if s["p99"] > BOUND_MS else 0
                if s["achieved"] < 0.9 * s["offered"] or stepping[side] == 2:
                    del stepping[side]
            if not stepping:
                break
        # the grid's steps are far apart (250 calls/s): each side's bracket (its last step
        # within the bound, its first over it) halved --fleet-refine times, at the midpoint
        # of the two steps' nominal rates
        for r in range(args.fleet_refine):
            for side in turn_order(sides, r):
                within, over = bracket(steps[side])
                if within and over and over["nominal"] - within["nominal"] >= 50:
                    measured_step(round((within["nominal"] + over["nominal"]) / 2), f"r{r}", side)
    finally:
        for c in set(clusters.values()):
            c.stop()

    figures = {side: saturation(steps[side]) for side in sides}
    ledger, floor = figures["ledger"], figures["floor"]
    brackets = (bracket(steps["ledger"]), bracket(steps["floor"]))
    how = (f"{procs} client process{'es' if procs > 1 else ''} (a psycopg_pool pool of {CLIENT_POOL} each), PgBouncer "
           f"{SERVER_CONNECTIONS} server connections, runs of 3 calls after model turns of 0.5-1.5 s, "
           f"Poisson starts; steps of {args.fleet_ramp} + {args.fleet_seconds} s, each rate stepped by "
           f"{', '.join(sides)}")
    rows = [("fleet shape: saturation, p99 ≤ 50 ms, token leases through PgBouncer (calls/s)", ledger[0],
             "≥ 2,000 calls/s", f"AsyncLedger token attempts; {how}; {ledger[1]}"),
            ("fleet shape: the same fleet's floor, plain psycopg, minimal rows (calls/s)", floor[0],
             "(floor)", f"a lease row, the minimal floor's two statements a call (bench/floor_minimal.sql's "
                        f"tables) on the same pool; {floor[1]}"),
            ("fleet shape: the ledger's saturation against its floor's", ledger[0] / floor[0] if floor[0] else 0.0,
             f"(context: {ratio_parts(*brackets)[1]})",
             f"the ledger's row and the floor's, the same run; a ratio of steps: {ratio_range(*brackets)}")]
    if before:
        earlier = figures["before"]
        rows[1:1] = [(f"fleet shape: saturation, before ({before.rev}): its library and its Python client (calls/s)",
                      earlier[0], "(before)", f"its own cluster and PgBouncer, the same settings; {earlier[1]}")]
    for row in rows:
        say("  ", row)
    return rows


def met(s):
    return s["p99"] <= BOUND_MS and not s["errors"]


def bracket(steps):
    """(the step with the highest achieved rate within the bound, the step over the bound
    at the lowest rate above that one's): where the saturation point lies, between the
    first's achieved rate and ceiling(the second) (an overloaded step's achieved rate
    falls: what it shows is that the rate offered to it was not carried).  Either is None:
    no step within the bound, or none over it at a higher rate."""
    best = max((s for s in steps if met(s)), key=lambda s: s["achieved"], default=None)
    over = min((s for s in steps if not met(s) and s["nominal"] > best["nominal"]),
               key=lambda s: s["nominal"], default=None) if best else None
    return best, over


def ceiling(best, over):
    """The rate over's step was offered, as the bracket's upper end: the arrival process's
    (nominal) rate, or the calls begun if more (Poisson).  Not the calls begun alone: an
    overloaded step begins fewer, a run's next call waiting for its last, and never less
    than what the best step carried."""
    return max(over["nominal"], over["offered"], best["achieved"])


def ratio_range(ledger, floor):
    """What two brackets say of the ratio of the saturation points, in a sentence."""
    return "; ".join(part for part in ratio_parts(ledger, floor) if part)


def ratio_parts(ledger, floor):
    """(the two brackets, the ratio's range): the ratio lies between the ledger's lowest
    over its floor's highest, and the other way round."""
    (l_lo, l_hi), (f_lo, f_hi) = ledger, floor
    if not (l_lo and f_lo):
        return "", "no ratio: a side had no step within 50 ms"
    l_top = ceiling(l_lo, l_hi) if l_hi else None
    f_top = ceiling(f_lo, f_hi) if f_hi else None
    low = f"{l_lo['achieved'] / f_top:.2f}" if f_top else "unknown (the floor's top step was within 50 ms)"
    high = f"{l_top / f_lo['achieved']:.2f}" if l_top else "unknown (the ledger's top step was within 50 ms)"
    return ((f"each saturation point lies between what a side's best step within the bound achieved and the rate "
             f"its next step over the bound (p99 over 50 ms, or errors) was offered: the ledger's between "
             f"{l_lo['achieved']:.0f} and " + (f"{l_top:.0f}" if l_top else "more")
             + f" calls/s, the floor's between {f_lo['achieved']:.0f} and " + (f"{f_top:.0f}" if f_top else "more")
             + " calls/s"),
            f"the ratio between {low} and {high}")


def saturation(steps):
    """(the saturation point, what the steps measured): the highest achieved rate of a step
    with p99 within the bound and no error, and each step's figures in a sentence."""
    best, crossed = bracket(steps)
    point = best["achieved"] if best else 0.0
    steps = sorted(steps, key=lambda s: (s["nominal"], s["offered"]))
    top = steps[-1]
    return point, ("offered → achieved calls/s (p50 / p99 ms): "
                   + "; ".join(f"{s['offered']:.0f} → {s['achieved']:.0f} ({s['p50']:.1f} / {s['p99']:.1f})"
                               + (f" errors {s['errors']}" if s["errors"] else "") for s in steps)
                   + (f"; p99 passed 50 ms (or errors came) between {point:.0f} calls/s achieved and "
                      f"{ceiling(best, crossed):.0f} offered" if crossed
                      else "; no step above it passed 50 ms" if best else "; p99 over 50 ms (or errors) at every step")
                   + f"; at the top step, CPU (cores): {top['cpu']}; CPU per call: {top['per_call']}; "
                     f"server connections (mean): {top['server']}; load {top['load']}")
