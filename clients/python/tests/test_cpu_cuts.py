"""Tests of what issue 34's cuts of the clients' CPU per call must keep (bench/README,
"The clients' CPU per call"): each fails if its cut breaks what the cut must not change.

- A statement on a pooled connection is sent straight on the connection's libpq handle
  (`_protocol.plain_send`), not through a cursor with autocommit switched on and off: the
  connection goes back idle and exactly as it was lent (its autocommit flag, no notice
  handler left), each statement is a transaction of its own (the intent is committed
  before the effect runs), the rows are read with the connection's own adapters, and a
  refusal is the named exception it was.
- A token attempt's renewal starts when the first renewal is due (ttl / 3): a short
  attempt starts no thread or task, a long one is renewed, nothing of it outlives the
  attempt, and the clock that starts the renewals forgets the attempts that ended.
- A psycopg_pool pool is borrowed from with getconn/putconn straight, not through its
  ``connection()``: a subclass's own ``connection()`` is still used, and a connection is
  given back also after a refusal.
- `AsyncLedger`: a report (already run to its end whatever happens to its caller) awaits
  its statement in the same task: cancelled while it waits for the pool's one
  connection, it still goes out and is recorded.

DURABLE_LEDGER_DSN as for the other tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import unittest
import uuid
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Iterator, List, Optional

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, ConnectionPool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # clients/python, if PYTHONPATH lacks it

from durable_ledger import EffectPaused, Ledger, RunAbandoned  # noqa: E402
from durable_ledger import ledger as ledger_module  # noqa: E402
from durable_ledger.aio import AsyncLedger  # noqa: E402

from target import ADMIN_DSN, DSN  # noqa: E402

PATIENCE = 30.0


def setUpModule() -> None:
    if not DSN:
        raise unittest.SkipTest("DURABLE_LEDGER_DSN is not set")


def renewal_threads(run: str) -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"durable_ledger renewal of {run}"]


def tagged_loads(data: Any) -> Any:
    """A jsonb loader of the connection's own (registered by the pool's configure)."""
    return {"loaded by the connection": json.loads(data)}


class CountingPool(ConnectionPool):
    """A pool whose connection() does more than psycopg_pool's (it counts)."""
    borrowed = 0

    @contextmanager
    def connection(self, timeout: Optional[float] = None) -> Iterator[Any]:
        self.borrowed += 1
        with super().connection(timeout) as conn:
            yield conn


class CountingAsyncPool(AsyncConnectionPool):
    borrowed = 0

    @asynccontextmanager
    async def connection(self, timeout: Optional[float] = None) -> AsyncIterator[Any]:
        self.borrowed += 1
        async with super().connection(timeout) as conn:
            yield conn


class SyncCutsTest(unittest.TestCase):

    def setUp(self) -> None:
        self.run_id = f"pycpu-{uuid.uuid4()}"
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(self.admin.close)

    def pool(self, **kwargs: Any) -> ConnectionPool:
        configure = kwargs.pop("configure", None)
        pool = ConnectionPool(DSN or "", min_size=1, max_size=1, kwargs=kwargs,
                              configure=configure, open=True, timeout=5.0)
        self.addCleanup(pool.close)
        pool.wait(timeout=PATIENCE)
        return pool

    def status(self, run: str) -> List[Any]:
        return [r[0] for r in self.admin.execute(
            "SELECT status::text FROM durable_ledger.effects WHERE run = %s "
            "ORDER BY created_at", (run,)).fetchall()]

    def test_a_pooled_connection_goes_back_idle_and_as_lent(self) -> None:
        for autocommit in (False, True):
            with self.subTest(autocommit=autocommit):
                pool = self.pool(autocommit=autocommit)
                ledger = Ledger(pool)
                run = f"{self.run_id}-{autocommit}"
                seen: List[Any] = []

                def pay(key: str) -> Any:
                    # the intent is committed before the effect runs: another session sees it
                    seen.extend(self.status(run))
                    return {"paid": key}

                with ledger.token_attempt(run, ttl=30):
                    ledger.guarded(run, "bank.pay", {"i": 1}, pay)
                    self.assertEqual(self.status(run), ["completed"])  # committed, not pending
                self.assertEqual(seen, ["started"])
                self.assertIsNotNone(ledger.effect_status(
                    self.admin.execute("SELECT key FROM durable_ledger.effects WHERE run = %s",
                                       (run,)).fetchone()[0]))  # type: ignore[index]
                with pool.connection() as conn:
                    self.assertIs(conn.autocommit, autocommit)
                    self.assertEqual(conn.info.transaction_status, TransactionStatus.IDLE)
                    self.assertEqual(conn._notice_handlers, [])

    def test_rows_are_read_with_the_connections_own_adapters(self) -> None:
        pool = self.pool(configure=lambda conn: set_json_loads(tagged_loads, conn))
        ledger = Ledger(pool)
        with ledger.token_attempt(self.run_id, ttl=30):
            result = ledger.guarded(self.run_id, "bank.pay", {"i": 1}, lambda key: {"ok": 1})
        self.assertEqual(result, {"loaded by the connection": {"ok": 1}})

    def test_a_refusal_on_a_pooled_connection_is_named_and_leaves_it_idle(self) -> None:
        pool = self.pool()
        ledger = Ledger(pool)
        with ledger.token_attempt(self.run_id, ttl=30):  # (the run is in the ledger)
            pass
        self.admin.execute("SELECT durable_ledger.abandon_run(%s, 'ops', 'fraud')", (self.run_id,))
        with self.assertRaises(RunAbandoned):
            with ledger.token_attempt(self.run_id, ttl=30):
                pass
        with pool.connection() as conn:
            self.assertIs(conn.autocommit, False)
            self.assertEqual(conn.info.transaction_status, TransactionStatus.IDLE)

    def test_a_pool_subclass_is_borrowed_from_through_its_own_connection(self) -> None:
        pool = CountingPool(DSN or "", min_size=1, max_size=1, open=True)
        self.addCleanup(pool.close)
        ledger = Ledger(pool)
        with ledger.token_attempt(self.run_id, ttl=30):
            ledger.guarded(self.run_id, "a", {}, lambda key: None)
        self.assertEqual(pool.borrowed, 4)  # take_lease, begin, complete, release_lease

    def test_a_pool_gives_its_one_connection_again_after_refusals(self) -> None:
        pool = self.pool()  # (a connection not given back: PoolTimeout after 5 s, not a hang)
        ledger = Ledger(pool)
        with ledger.token_attempt(self.run_id, ttl=30):
            pass
        self.admin.execute("SELECT durable_ledger.abandon_run(%s, 'ops', 'fraud')", (self.run_id,))
        for _ in range(3):
            with self.assertRaises(RunAbandoned):
                with ledger.token_attempt(self.run_id, ttl=30):
                    pass
        self.assertIsNone(ledger.effect_status("no-such-key"))

    def test_a_short_attempt_starts_no_renewal_and_a_long_one_is_renewed(self) -> None:
        ledger = Ledger(self.pool())
        with ledger.token_attempt(self.run_id, ttl=30) as lease:
            ledger.guarded(self.run_id, "a", {}, lambda key: None)
            self.assertEqual(renewal_threads(self.run_id), [])
        self.assertEqual(lease.renewals, 0)
        long_run = f"{self.run_id}-long"
        with ledger.token_attempt(long_run, ttl=1.5) as lease:  # due every 0.5 s
            time.sleep(1.3)
            ledger.guarded(long_run, "a", {}, lambda key: None)
            self.assertGreaterEqual(lease.renewals, 1)
            self.assertEqual(len(renewal_threads(long_run)), 1)
        self.assertEqual(renewal_threads(long_run), [])  # ended with the attempt
        renewals = lease.renewals
        time.sleep(0.7)
        self.assertEqual(lease.renewals, renewals)  # none after the end

    def test_the_renewal_clock_forgets_the_attempts_that_ended(self) -> None:
        ledger = Ledger(self.pool(autocommit=True))
        clock = ledger_module._CLOCK
        before = len(clock.due)
        for i in range(200):
            with ledger.token_attempt(f"{self.run_id}-{i}", ttl=600):
                pass
        self.assertLess(len(clock.due), before + 140)
        # an ended attempt at the head wakes the clock, which drops it (waited for)
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            with clock.cond:
                if not any(entry[2].ended for entry in clock.due[:1]):
                    break
                clock.cond.wait(0.05)
        with clock.cond:
            self.assertFalse(any(entry[2].ended for entry in clock.due[:1]))

    @unittest.skipUnless(hasattr(os, "fork"), "needs fork()")
    def test_a_forked_child_does_not_renew_its_parents_leases(self) -> None:
        ledger = Ledger(self.pool(autocommit=True))
        with ledger.token_attempt(self.run_id, ttl=600):
            self.assertTrue(ledger_module._CLOCK.due)  # the parent's renewal is scheduled
            child = os.fork()
            if child == 0:  # the child: an empty schedule, no clock thread
                clock = ledger_module._CLOCK
                os._exit(0 if not clock.due and clock.thread is None else 1)
            _, status = os.waitpid(child, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)


class AsyncCutsTest(unittest.IsolatedAsyncioTestCase):

    def setUp(self) -> None:
        self.run_id = f"pycpu-async-{uuid.uuid4()}"
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(self.admin.close)

    async def pool(self, size: int = 1, **kwargs: Any) -> AsyncConnectionPool:
        configure = kwargs.pop("configure", None)
        pool = AsyncConnectionPool(DSN or "", min_size=size, max_size=size, kwargs=kwargs,
                                   configure=configure, open=False, timeout=5.0)
        await pool.open()
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=PATIENCE)
        return pool

    def effects(self, run: str) -> List[Any]:
        return self.admin.execute(
            "SELECT tool, status::text FROM durable_ledger.effects WHERE run = %s "
            "ORDER BY created_at", (run,)).fetchall()

    async def test_a_pooled_connection_goes_back_idle_and_as_lent(self) -> None:
        pool = await self.pool()
        ledger = AsyncLedger(pool)
        seen: List[Any] = []

        def pay(key: str) -> Any:
            seen.extend(self.effects(self.run_id))
            return {"paid": key}

        async with ledger.token_attempt(self.run_id, ttl=30):
            await ledger.guarded(self.run_id, "bank.pay", {"i": 1}, pay)
        self.assertEqual(seen, [("bank.pay", "started")])
        self.assertEqual(self.effects(self.run_id), [("bank.pay", "completed")])
        async with pool.connection() as conn:
            self.assertIs(conn.autocommit, False)
            self.assertEqual(conn.info.transaction_status, TransactionStatus.IDLE)
            self.assertEqual(conn._notice_handlers, [])

    async def test_rows_are_read_with_the_connections_own_adapters(self) -> None:
        async def configure(conn: Any) -> None:
            set_json_loads(tagged_loads, conn)

        ledger = AsyncLedger(await self.pool(configure=configure))
        async with ledger.token_attempt(self.run_id, ttl=30):
            result = await ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                          lambda key: {"ok": 1})
        self.assertEqual(result, {"loaded by the connection": {"ok": 1}})

    async def test_a_report_cancelled_while_waiting_for_the_pools_connection_goes_out(self) -> None:
        pool = await self.pool(size=1)
        ledger = AsyncLedger(pool)
        grab, held, let_go = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def holder() -> None:  # takes the pool's one connection while the bank pays
            await grab.wait()
            async with pool.connection():
                held.set()
                await let_go.wait()

        async def pay(key: str) -> Any:
            grab.set()
            await held.wait()
            return {"receipt": "R-1"}

        hold = asyncio.create_task(holder())
        async with ledger.token_attempt(self.run_id, ttl=30):
            call = asyncio.create_task(ledger.guarded(self.run_id, "bank.pay", {"i": 9}, pay))
            await asyncio.wait_for(held.wait(), PATIENCE)
            await asyncio.sleep(0.2)  # the report now waits for the connection
            call.cancel()
            let_go.set()
            with self.assertRaises(asyncio.CancelledError):
                await call
            with self.assertRaises(EffectPaused):  # the attempt stops: its caller never saw it
                await ledger.guarded(self.run_id, "bank.pay", {"i": 9}, pay)
        await hold
        self.assertEqual(self.effects(self.run_id), [("bank.pay", "completed")])
        async with ledger.token_attempt(self.run_id, ttl=30):  # the retry replays it
            self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"i": 9}, pay),
                             {"receipt": "R-1"})

    async def test_a_pool_subclass_is_borrowed_from_through_its_own_connection(self) -> None:
        pool = CountingAsyncPool(DSN or "", min_size=1, max_size=1, open=False)
        await pool.open()
        self.addAsyncCleanup(pool.close)
        ledger = AsyncLedger(pool)
        async with ledger.token_attempt(self.run_id, ttl=30):
            await ledger.guarded(self.run_id, "a", {}, lambda key: None)
        self.assertEqual(pool.borrowed, 4)  # take_lease, begin, complete, release_lease

    async def test_a_short_attempt_starts_no_renewal_and_a_long_one_is_renewed(self) -> None:
        ledger = AsyncLedger(await self.pool())

        def renewals(run: str) -> List[Any]:
            return [t for t in asyncio.all_tasks()
                    if t.get_name() == f"durable_ledger renewal of {run}"]

        async with ledger.token_attempt(self.run_id, ttl=30) as lease:
            await ledger.guarded(self.run_id, "a", {}, lambda key: None)
            self.assertEqual(renewals(self.run_id), [])
        self.assertEqual(lease.renewals, 0)
        long_run = f"{self.run_id}-long"
        async with ledger.token_attempt(long_run, ttl=1.5) as lease:  # due every 0.5 s
            await asyncio.sleep(1.3)
            await ledger.guarded(long_run, "a", {}, lambda key: None)
            self.assertGreaterEqual(lease.renewals, 1)
            self.assertEqual(len(renewals(long_run)), 1)
        self.assertEqual(renewals(long_run), [])
        count = lease.renewals
        await asyncio.sleep(0.7)
        self.assertEqual(lease.renewals, count)


if __name__ == "__main__":
    unittest.main()
