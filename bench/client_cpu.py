#!/usr/bin/python3
"""make bench, section "clients": the Python client's own CPU per guarded call.

RUNS runs (CONCURRENCY at a time), each a token attempt of three guarded calls on a
psycopg_pool pool (take_lease and release_lease included), the tools doing nothing;
prints one JSON line: calls, this process's CPU seconds (user + system, getrusage) and
the wall time.  sync: Ledger on a ConnectionPool, CONCURRENCY threads; async: AsyncLedger
on an AsyncConnectionPool, CONCURRENCY tasks.

    bench/client_cpu.py sync|async DSN RUNS CONCURRENCY
"""

import asyncio
import json
import os
import resource
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))

from durable_ledger import Ledger  # noqa: E402
from durable_ledger.aio import AsyncLedger  # noqa: E402


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def sync_bench(dsn, runs, concurrency, tag):
    from psycopg_pool import ConnectionPool
    with ConnectionPool(dsn, min_size=concurrency, max_size=concurrency, open=True) as pool:
        ledger = Ledger(pool)

        def one(i):
            run = f"bench-py-{tag}-{i}"
            with ledger.token_attempt(run, ttl=60):
                ledger.guarded(run, "lookup", {"customer": i}, lambda key: {"ok": True})
                ledger.guarded(run, "pay", {"invoice": i, "amount": 4200}, lambda key: {"id": key[:8]})
                ledger.guarded(run, "mail", {"to": f"c{i}@example.com"}, lambda key: {"sent": True})

        def drive(first, count):
            lock = threading.Lock()
            state = {"next": first}

            def worker():
                while True:
                    with lock:
                        i = state["next"]
                        if i >= first + count:
                            return
                        state["next"] = i + 1
                    one(i)
            threads = [threading.Thread(target=worker) for _ in range(concurrency)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        drive(0, min(200, runs))
        cpu, wall = cpu_seconds(), time.monotonic()
        drive(1_000_000, runs)
        return cpu_seconds() - cpu, time.monotonic() - wall


async def async_bench(dsn, runs, concurrency, tag):
    from psycopg_pool import AsyncConnectionPool
    async with AsyncConnectionPool(dsn, min_size=concurrency, max_size=concurrency, open=False) as pool:
        ledger = AsyncLedger(pool)

        async def one(i):
            run = f"bench-pya-{tag}-{i}"
            async with ledger.token_attempt(run, ttl=60):
                await ledger.guarded(run, "lookup", {"customer": i}, lambda key: {"ok": True})
                await ledger.guarded(run, "pay", {"invoice": i, "amount": 4200}, lambda key: {"id": key[:8]})
                await ledger.guarded(run, "mail", {"to": f"c{i}@example.com"}, lambda key: {"sent": True})

        async def drive(first, count):
            state = {"next": first}

            async def worker():
                while state["next"] < first + count:
                    i = state["next"]
                    state["next"] += 1
                    await one(i)
            await asyncio.gather(*(worker() for _ in range(concurrency)))

        await drive(0, min(200, runs))
        cpu, wall = cpu_seconds(), time.monotonic()
        await drive(1_000_000, runs)
        return cpu_seconds() - cpu, time.monotonic() - wall


def main():
    kind, dsn, runs, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    tag = f"{os.getpid()}-{int(time.time())}"
    if kind == "sync":
        cpu, wall = sync_bench(dsn, runs, concurrency, tag)
    else:
        cpu, wall = asyncio.run(async_bench(dsn, runs, concurrency, tag))
    print(json.dumps({"client": f"python-{kind}", "calls": runs * 3, "cpu_seconds": cpu, "wall_seconds": wall}))


if __name__ == "__main__":
    main()
