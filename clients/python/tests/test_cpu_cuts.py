"""Tests of what issue 34's cuts of the clients' CPU per call must keep (bench/README,
"The clients' CPU per call"): each fails if its cut breaks what the cut must not change.

- A statement on a pooled connection is sent straight on the connection's libpq handle
  (`_protocol.plain_send`), not through a cursor with autocommit switched on and off: the
  connection goes back idle and exactly as it was lent (its autocommit flag, no notice
  handler left), each statement is a transaction of its own (the intent is committed
  before the effect runs), the rows are read with the connection's own adapters, and a
  refusal is the named exception it was.  The connection's encoding is read once a
  statement (`_protocol.Sent`) and its rows and refusals are read in it: a connection in
  LATIN1 reads a run's name, a result and the server's message of a refusal as written.
- A token attempt's renewal starts when the first renewal is due (ttl / 3): a short
  attempt starts no thread or task, a long one is renewed, nothing of it outlives the
  attempt, and the clock that starts the renewals forgets the attempts that ended.
- A psycopg_pool pool is borrowed from with getconn/putconn straight, not through its
  ``connection()``: a subclass's own ``connection()`` is still used, and a connection is
  given back also after a refusal.
- `AsyncLedger`: a report (already run to its end whatever happens to its caller) awaits
  its statement in the same task: cancelled while it waits for the pool's one
  connection, it still goes out and is recorded.
- `AsyncLedger` on a psycopg_pool pool: a statement runs in the caller's task, its
  cancellations held (`aio._Held`) instead of a task and a shield per statement (and
  per report, and per end of an attempt): a token attempt starts no task at all; a
  cancellation while a reply is awaited still awaits it (the connection goes back to
  the pool as it was, not closed half way), cancels an intent on the server and lets a
  report be recorded; an intent cancelled while it waits for the pool's connection is
  not sent; a wait of the pool (getconn when none is idle, a putconn that waits) goes
  on in a task of its own, where a timeout it sets is its own and a cancellation of the
  caller does not cut it short.
- Both clients read a lent connection's state once a statement: one closed while idle in
  the pool is still refused before anything is sent.

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


class WaitingPool(AsyncConnectionPool):
    """psycopg_pool's pool, whose putconn waits a while first (a pool busy with its own
    work) and whose getconn gives up after ``give_up`` seconds with a timeout of its own
    (asyncio.timeout: it cancels the task it was entered in).  Its connection() is
    psycopg_pool's: the ledger borrows with getconn/putconn straight."""
    put_delay = 0.0
    give_up: Optional[float] = None
    putting: Optional[asyncio.Event] = None  # set when a putconn starts its wait

    async def getconn(self, timeout: Optional[float] = None) -> Any:
        if self.give_up is None:
            return await super().getconn(timeout)
        async with asyncio.timeout(self.give_up):  # type: ignore[attr-defined]
            return await super().getconn(timeout)

    async def putconn(self, conn: Any) -> None:
        if self.put_delay:
            if self.putting is not None:
                self.putting.set()
            await asyncio.sleep(self.put_delay)
        await super().putconn(conn)


class DeadlinePool(AsyncConnectionPool):
    """psycopg_pool's pool with deadlines of its own (review of issue 34's cuts): getconn
    checks the connection it hands out, and putconn resets the one given back, each under
    asyncio.timeout (which cancels the task it was entered in), before any wait; a check
    that does not finish in time fails getconn, a reset that does not closes the
    connection.  ``check_delay`` and ``reset_delay`` make them slow.  Its connection() is
    psycopg_pool's: the ledger borrows with getconn/putconn straight."""
    check_delay = 0.0
    reset_delay = 0.0
    deadline = 0.2

    async def getconn(self, timeout: Optional[float] = None) -> Any:
        conn = await super().getconn(timeout)
        try:
            async with asyncio.timeout(self.deadline):  # type: ignore[attr-defined]
                await asyncio.sleep(self.check_delay)
        except BaseException:
            await super().putconn(conn)
            raise
        return conn

    async def putconn(self, conn: Any) -> None:
        try:
            async with asyncio.timeout(self.deadline):  # type: ignore[attr-defined]
                await asyncio.sleep(self.reset_delay)
        except TimeoutError:
            await conn.close()
        await super().putconn(conn)


class GoodbyeConnection(psycopg.AsyncConnection[Any]):
    """A connection class whose close() says goodbye first under a deadline of its own
    (asyncio.timeout, entered before any wait); ``goodbye`` makes the goodbye slow.
    psycopg_pool's own putconn closes a connection past its max_lifetime."""
    goodbye = 0.0

    async def close(self) -> None:
        try:
            async with asyncio.timeout(0.2):  # type: ignore[attr-defined]
                await asyncio.sleep(self.goodbye)
        except TimeoutError:
            pass
        await super().close()


class WaitingConnection(psycopg.Connection[Any]):
    """A connection class of the application's with its own wait() (counted): the
    statements on it go the cursor's way, which calls it."""
    waits = 0

    def wait(self, gen: Any, timeout: Optional[float] = 0.1) -> Any:
        WaitingConnection.waits += 1
        return super().wait(gen, timeout)


class WaitingAsyncConnection(psycopg.AsyncConnection[Any]):
    """WaitingConnection's async twin."""
    waits = 0

    async def wait(self, gen: Any) -> Any:
        WaitingAsyncConnection.waits += 1
        return await super().wait(gen)


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

    def test_a_connection_class_with_its_own_wait_is_waited_by_it(self) -> None:
        pool = ConnectionPool(DSN or "", min_size=1, max_size=1, open=True,
                              connection_class=WaitingConnection)
        self.addCleanup(pool.close)
        pool.wait(timeout=PATIENCE)
        ledger = Ledger(pool)
        WaitingConnection.waits = 0
        with ledger.token_attempt(self.run_id, ttl=30):
            self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                            lambda key: {"paid": 1}), {"paid": 1})
        self.assertGreaterEqual(WaitingConnection.waits, 4)  # take, begin, report, release

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

    def test_a_connection_in_another_encoding_reads_rows_and_refusals_in_it(self) -> None:
        ledger = Ledger(self.pool(client_encoding="latin1"))
        run = f"{self.run_id}-café"
        # (JSON is read as UTF-8 whatever the encoding: psycopg's jsonb loader, a cursor's too)
        with ledger.token_attempt(run, ttl=30):
            result = ledger.guarded(run, "bank.pay", {"a": 1}, lambda key: {"receipt": "R"})
        self.assertEqual(result, {"receipt": "R"})
        key = self.admin.execute("SELECT key FROM durable_ledger.effects WHERE run = %s",
                                 (run,)).fetchone()[0]  # type: ignore[index]
        self.assertEqual(ledger.effect_status(key)["run"], run)  # type: ignore[index]
        self.admin.execute("SELECT durable_ledger.abandon_run(%s, 'ops', 'fraud')", (run,))
        with self.assertRaises(RunAbandoned) as refused:
            with ledger.token_attempt(run, ttl=30):
                pass
        self.assertIn(f'run "{run}" was abandoned', str(refused.exception))

    def test_a_connection_closed_in_the_pool_takes_nothing(self) -> None:
        # (the lent connection's state is read once: one closed behind the pool's back is
        # still refused before anything is sent, and the attempt goes on)
        pool = self.pool()
        ledger = Ledger(pool)
        with ledger.token_attempt(self.run_id, ttl=30):
            pool._pool[0].close()  # type: ignore[attr-defined]  # idle in the pool
            with self.assertRaises(psycopg.OperationalError) as refused:
                ledger.guarded(self.run_id, "bank.pay", {"i": 1}, lambda key: {"ok": 1})
            self.assertIn("handed out a closed connection", str(refused.exception))
            self.assertEqual(self.status(self.run_id), [])
            self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                            lambda key: {"ok": 1}), {"ok": 1})

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

    def hold_effects(self) -> Any:
        """Another session locks durable_ledger.effects until the returned function is
        called: the ledger's statements wait for it on the server meanwhile."""
        blocker = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE durable_ledger.effects IN ACCESS EXCLUSIVE MODE")

        def let_go() -> None:
            if not blocker.closed:
                blocker.execute("COMMIT")
                blocker.close()
        self.addCleanup(let_go)
        return let_go

    async def until_waiting_for_a_lock(self) -> None:
        deadline = time.monotonic() + PATIENCE
        while not self.admin.execute(
                "SELECT count(*) > 0 FROM pg_locks WHERE NOT granted").fetchone()[0]:  # type: ignore[index]
            self.assertLess(time.monotonic(), deadline, "no statement waited for the lock")
            await asyncio.sleep(0.01)

    async def pooled_pid(self, pool: AsyncConnectionPool) -> int:
        async with pool.connection() as conn:
            return int(conn.info.backend_pid)

    async def test_a_token_attempt_on_a_pool_starts_no_task(self) -> None:
        ledger = AsyncLedger(await self.pool(size=2))
        loop = asyncio.get_running_loop()
        started: List[Any] = []
        default = loop.get_task_factory()

        def factory(loop: Any, coro: Any, **kwargs: Any) -> Any:
            started.append(getattr(coro, "__qualname__", coro))
            if default is not None:
                return default(loop, coro, **kwargs)
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        try:
            async with ledger.token_attempt(self.run_id, ttl=30):
                await ledger.guarded(self.run_id, "bank.pay", {"i": 1}, lambda key: {"ok": 1})
                with self.assertRaises(Exception):  # a refusal on the way: no task either
                    await ledger.guarded(self.run_id, "bank.pay", {"i": 2}, lambda key: {"ok": 2},
                                         business_key="")
                await ledger.guarded(self.run_id, "mail.send", {"to": "x"}, lambda key: None)
        finally:
            loop.set_task_factory(default)
        self.assertEqual(started, [])  # take, begin, complete, release: in this task
        self.assertEqual(self.effects(self.run_id), [("bank.pay", "completed"),
                                                     ("mail.send", "completed")])

    async def test_an_intent_cancelled_while_its_reply_is_awaited(self) -> None:
        # the intent waits for a lock on the server; its caller is cancelled: the intent
        # is cancelled on the server and its reply awaited in the caller's task, the
        # connection goes back to the pool as it was (the same backend, not closed with a
        # reply unread), and the attempt stops (a second try would be occurrence 2)
        pool = await self.pool(size=1)
        ledger = AsyncLedger(pool)
        pid = await self.pooled_pid(pool)
        performed: List[str] = []
        async with ledger.token_attempt(self.run_id, ttl=30):
            let_go = self.hold_effects()
            call = asyncio.create_task(ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                                      lambda key: performed.append(key)))
            await self.until_waiting_for_a_lock()
            call.cancel()
            try:  # (cancelled on the server: it ends while the lock is still held)
                with self.assertRaises(asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(call), 10.0)
            finally:
                let_go()
            with self.assertRaises(EffectPaused):
                await ledger.guarded(self.run_id, "bank.pay", {"i": 1}, lambda key: None)
        self.assertEqual(performed, [])
        self.assertEqual(self.effects(self.run_id), [])  # cancelled on the server
        self.assertEqual(await self.pooled_pid(pool), pid)

    async def test_a_report_cancelled_while_its_reply_is_awaited_is_recorded(self) -> None:
        pool = await self.pool(size=1)
        ledger = AsyncLedger(pool)
        pid = await self.pooled_pid(pool)
        let_go: List[Any] = []

        def pay(key: str) -> Any:
            let_go.append(self.hold_effects())  # the report will wait for the lock
            return {"receipt": "R-7"}

        async with ledger.token_attempt(self.run_id, ttl=30):
            call = asyncio.create_task(ledger.guarded(self.run_id, "bank.pay", {"i": 7}, pay))
            await self.until_waiting_for_a_lock()
            call.cancel()
            await asyncio.sleep(0.2)
            self.assertFalse(call.done())  # the report is awaited to its end
            let_go[0]()
            with self.assertRaises(asyncio.CancelledError):
                await call
            with self.assertRaises(EffectPaused):  # its caller never saw the answer
                await ledger.guarded(self.run_id, "bank.pay", {"i": 7}, pay)
        self.assertEqual(self.effects(self.run_id), [("bank.pay", "completed")])
        self.assertEqual(await self.pooled_pid(pool), pid)
        async with ledger.token_attempt(self.run_id, ttl=30):  # the retry replays it
            self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"i": 7}, pay),
                             {"receipt": "R-7"})

    async def test_an_intent_cancelled_while_waiting_for_the_pools_connection_is_not_sent(self) -> None:
        # the pool's one connection is busy; the call is cancelled while its intent waits
        # for it: the intent is not sent when the connection comes, nothing is recorded,
        # and the attempt goes on (the same call is still occurrence 1)
        pool = await self.pool(size=1)
        ledger = AsyncLedger(pool)
        held, let_go = asyncio.Event(), asyncio.Event()

        async def busy() -> None:
            async with pool.connection():
                held.set()
                await let_go.wait()

        async with ledger.token_attempt(self.run_id, ttl=30):
            holding = asyncio.create_task(busy())
            await held.wait()
            call = asyncio.create_task(ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                                      lambda key: {"paid": 1}))
            await asyncio.sleep(0.2)  # the intent waits for the connection
            call.cancel()
            let_go.set()
            with self.assertRaises(asyncio.CancelledError):
                await call
            await holding
            self.assertEqual(self.effects(self.run_id), [])
            self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                                  lambda key: {"paid": 2}), {"paid": 2})
        self.assertEqual(self.effects(self.run_id), [("bank.pay", "completed")])

    async def test_a_wait_of_the_pool_is_not_cut_short_by_a_cancellation(self) -> None:
        # the pool's putconn waits (in a task of its own) while the caller is cancelled:
        # the connection is still given back (the pool's one connection serves the next
        # call), the intent's answer is known, and the attempt stops as after any intent
        # recorded and not performed
        pool = WaitingPool(DSN or "", min_size=1, max_size=1, open=False, timeout=5.0)
        await pool.open()
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=PATIENCE)
        ledger = AsyncLedger(pool)
        performed: List[str] = []
        async with ledger.token_attempt(self.run_id, ttl=30):
            pool.put_delay, pool.putting = 0.5, asyncio.Event()
            call = asyncio.create_task(ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                                      lambda key: performed.append(key)))
            # the intent is in; its connection is being given back
            await asyncio.wait_for(pool.putting.wait(), PATIENCE)
            await asyncio.sleep(0.05)
            call.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await call
            pool.put_delay = 0.0
            with self.assertRaises(EffectPaused) as stopped:
                await ledger.guarded(self.run_id, "bank.pay", {"i": 1}, lambda key: None)
            self.assertIn("cancelled after its intent", str(stopped.exception))
        self.assertEqual(performed, [])
        self.assertEqual(self.effects(self.run_id), [("bank.pay", "started")])
        async with pool.connection(timeout=2.0):  # given back, not lost
            pass

    async def test_a_wait_taken_over_by_a_task_gets_what_it_waited_for(self) -> None:
        # _Held.step: a coroutine that waits goes on in a task of its own, which passes it
        # what it waited for (here an error it handles), and the caller's cancellation
        # meanwhile is held, not passed in
        from durable_ledger.aio import _Held
        loop = asyncio.get_running_loop()

        async def work() -> str:
            failing = loop.create_future()
            loop.call_later(0.05, failing.set_exception, ValueError("no"))
            try:
                await failing
            except ValueError:
                pass
            await asyncio.sleep(0.2)
            return "done"

        held = _Held()
        self.assertEqual(await held.step(work()), "done")
        self.assertFalse(held.cancelled)
        held = _Held()
        call = asyncio.create_task(held.step(work()))
        await asyncio.sleep(0.1)
        call.cancel()
        self.assertEqual(await call, "done")
        self.assertTrue(held.cancelled)

    async def test_a_getconn_that_waits_keeps_its_own_timeout(self) -> None:
        # no connection idle: getconn waits in a task of its own, so a timeout it sets
        # (asyncio.timeout cancels the task it was entered in) ends its own wait and
        # comes out as its TimeoutError; nothing was sent, the run is not held
        pool = WaitingPool(DSN or "", min_size=1, max_size=1, open=False, timeout=5.0)
        await pool.open()
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=PATIENCE)
        pool.give_up = 0.3
        ledger = AsyncLedger(pool)
        async with pool.connection():  # the pool's one connection is taken
            started = time.monotonic()
            with self.assertRaises(TimeoutError):
                async with ledger.token_attempt(self.run_id, ttl=30):
                    self.fail("the attempt began without a connection")
            self.assertLess(time.monotonic() - started, 3.0)
        self.assertEqual(self.admin.execute(
            "SELECT count(*) FROM durable_ledger.leases WHERE run = %s",
            (self.run_id,)).fetchone()[0], 0)  # type: ignore[index]

    async def test_a_subclass_getconn_keeps_its_deadline_its_own(self) -> None:
        # a connection idle, but the subclass's getconn times its own check: the
        # deadline ends the check and comes out as its TimeoutError; the caller, whom
        # nobody cancelled, is not cancelled, and nothing was sent
        pool = DeadlinePool(DSN or "", min_size=1, max_size=1, open=False, timeout=5.0)
        await pool.open()
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=PATIENCE)
        ledger = AsyncLedger(pool)
        pool.check_delay = 2.0

        async def attempt() -> None:
            async with ledger.token_attempt(self.run_id, ttl=30):
                self.fail("the attempt began without a connection")

        task = asyncio.ensure_future(attempt())
        with self.assertRaises(TimeoutError):
            await task
        self.assertFalse(task.cancelled())
        self.assertEqual(self.admin.execute(
            "SELECT count(*) FROM durable_ledger.leases WHERE run = %s",
            (self.run_id,)).fetchone()[0], 0)  # type: ignore[index]

    async def test_a_subclass_putconn_keeps_its_deadline_its_own(self) -> None:
        # the subclass's putconn times its reset and closes a connection that misses the
        # deadline: the caller's calls go on as if the pool were quick (performed once,
        # recorded), and the caller is not cancelled
        pool = DeadlinePool(DSN or "", min_size=1, max_size=1, open=False, timeout=5.0)
        await pool.open()
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=PATIENCE)
        ledger = AsyncLedger(pool)
        pool.reset_delay = 1.0
        performed: List[str] = []

        async def attempt() -> Any:
            async with ledger.token_attempt(self.run_id, ttl=30):
                return await ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                            lambda key: performed.append(key) or {"paid": 1})

        task = asyncio.ensure_future(attempt())
        self.assertEqual(await task, {"paid": 1})
        self.assertFalse(task.cancelled())
        self.assertEqual(len(performed), 1)
        self.assertEqual(self.effects(self.run_id), [("bank.pay", "completed")])

    async def test_a_connection_class_close_keeps_its_deadline_its_own(self) -> None:
        # psycopg_pool's own pool, but its connections' close() has a deadline of its
        # own, and every connection is past its max_lifetime when it comes back, so
        # putconn closes it: the caller's calls go on as if closing were quick
        pool = AsyncConnectionPool(DSN or "", min_size=1, max_size=1, open=False, timeout=5.0,
                                   max_lifetime=0.0, connection_class=GoodbyeConnection)
        await pool.open()
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=PATIENCE)
        self.addCleanup(setattr, GoodbyeConnection, "goodbye", 0.0)
        GoodbyeConnection.goodbye = 1.0
        ledger = AsyncLedger(pool)
        performed: List[str] = []

        async def attempt() -> Any:
            async with ledger.token_attempt(self.run_id, ttl=30):
                return await ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                            lambda key: performed.append(key) or {"paid": 1})

        task = asyncio.ensure_future(attempt())
        self.assertEqual(await task, {"paid": 1})
        self.assertFalse(task.cancelled())
        self.assertEqual(len(performed), 1)
        self.assertEqual(self.effects(self.run_id), [("bank.pay", "completed")])

    async def test_a_connection_class_with_its_own_wait_is_waited_by_it(self) -> None:
        pool = AsyncConnectionPool(DSN or "", min_size=1, max_size=1, open=False,
                                   connection_class=WaitingAsyncConnection)
        await pool.open()
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=PATIENCE)
        ledger = AsyncLedger(pool)
        WaitingAsyncConnection.waits = 0
        async with ledger.token_attempt(self.run_id, ttl=30):
            self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                                  lambda key: {"paid": 1}), {"paid": 1})
        self.assertGreaterEqual(WaitingAsyncConnection.waits, 4)  # take, begin, report, release

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

    async def test_a_connection_in_another_encoding_reads_rows_and_refusals_in_it(self) -> None:
        ledger = AsyncLedger(await self.pool(client_encoding="latin1"))
        run = f"{self.run_id}-café"
        async with ledger.token_attempt(run, ttl=30):
            result = await ledger.guarded(run, "bank.pay", {"a": 1}, lambda key: {"receipt": "R"})
        self.assertEqual(result, {"receipt": "R"})
        key = self.admin.execute("SELECT key FROM durable_ledger.effects WHERE run = %s",
                                 (run,)).fetchone()[0]  # type: ignore[index]
        self.assertEqual((await ledger.effect_status(key))["run"], run)  # type: ignore[index]
        self.admin.execute("SELECT durable_ledger.abandon_run(%s, 'ops', 'fraud')", (run,))
        with self.assertRaises(RunAbandoned) as refused:
            async with ledger.token_attempt(run, ttl=30):
                pass
        self.assertIn(f'run "{run}" was abandoned', str(refused.exception))

    async def test_a_connection_closed_in_the_pool_takes_nothing(self) -> None:
        pool = await self.pool()
        ledger = AsyncLedger(pool)
        async with ledger.token_attempt(self.run_id, ttl=30):
            await pool._pool[0].close()  # type: ignore[attr-defined]  # idle in the pool
            with self.assertRaises(psycopg.OperationalError) as refused:
                await ledger.guarded(self.run_id, "bank.pay", {"i": 1}, lambda key: {"ok": 1})
            self.assertIn("handed out a closed connection", str(refused.exception))
            self.assertEqual(self.effects(self.run_id), [])
            self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                                  lambda key: {"ok": 1}), {"ok": 1})

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
