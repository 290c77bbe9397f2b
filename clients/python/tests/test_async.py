"""Tests of the asyncio client (``durable_ledger.AsyncLedger``) against a real server: on an
``AsyncConnection`` (session and token leases) and on ``psycopg_pool.AsyncConnectionPool``s,
directly and through PgBouncer in transaction mode; several tasks of one attempt at once on
one pool (a model's parallel tool calls) and their replay in another order; the renewal
while a tool is awaited; a cancelled tool; a lease broken while a call is awaited; a task
that outlives its attempt; the README's async example, run as a new user would.

DURABLE_LEDGER_DSN must be a superuser connection string of a database with the
extension; DURABLE_LEDGER_PGBOUNCER_DSN one of the same database through PgBouncer with
``pool_mode = transaction`` (test/apps/030_python_client.pl starts one).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # clients/python, if PYTHONPATH lacks it

from durable_ledger import (  # noqa: E402
    AsyncLedger,
    AttemptStopped,
    AsyncTokenLease,
    AwaitingApproval,
    BudgetExhausted,
    BusinessKeyConflict,
    EffectDidNotHappen,
    EffectFailed,
    EffectPaused,
    InvalidArgument,
    LeaseLost,
    LedgerUsageError,
    RunAbandoned,
    RunBusy,
)

from target import ADMIN_DSN, DSN, ERROR_ENDS_SESSION_LEASE  # noqa: E402  (where the connections go)
BOUNCER_DSN = os.environ.get("DURABLE_LEDGER_PGBOUNCER_DSN")
README = os.path.join(os.path.dirname(HERE), "README.md")
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "async_agent.py")
#: How long a test waits for something before it gives up.
PATIENCE = 30.0


def setUpModule() -> None:
    if not DSN:
        raise unittest.SkipTest("DURABLE_LEDGER_DSN is not set")


class Downstream:
    """Side-effecting tools whose downstream systems record every call they receive and
    deduplicate nothing; ``delay`` makes a call await a while (in random order)."""

    def __init__(self, ledger: AsyncLedger, delay: float = 0.0) -> None:
        self.sent: Dict[str, List[Tuple[Any, str]]] = {"bank.pay": [], "mail.send": []}
        self.delay = delay

        def make(name: str) -> Any:
            @ledger.tool(name)
            async def tool(args: Any, idempotency_key: str) -> Any:
                if self.delay:
                    await asyncio.sleep(random.random() * self.delay)
                if args.get("declined"):
                    raise EffectDidNotHappen({"code": "declined"})
                self.sent[name].append((args, idempotency_key))
                return {"tool": name, "args": args, "n": len(self.sent[name])}
            return tool

        self.pay = make("bank.pay")
        self.mail = make("mail.send")

    def count(self) -> int:
        return sum(len(v) for v in self.sent.values())


class AsyncLedgerTest(unittest.IsolatedAsyncioTestCase):

    def setUp(self) -> None:
        self.run_id = f"pyasync-{uuid.uuid4()}"
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(self.admin.close)

    # -------------------------------------------------------------- helpers

    async def pool(self, dsn: Optional[str] = None, size: int = 3,
                   **kwargs: Any) -> AsyncConnectionPool:
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("application_name", "durable-ledger-pytest-async")
        pool = AsyncConnectionPool(dsn or DSN, min_size=size, max_size=size, kwargs=kwargs)
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=PATIENCE)
        return pool

    async def connect(self, dsn: Optional[str] = None) -> "psycopg.AsyncConnection[Any]":
        conn = await psycopg.AsyncConnection.connect(dsn or DSN, autocommit=True)  # type: ignore[arg-type]
        self.addAsyncCleanup(conn.close)
        return conn

    def audit(self, run: str, *events: str) -> List[Tuple[Any, ...]]:
        """(event, backend_pid, lease_epoch) of the run's audit rows, in order."""
        return self.admin.execute(
            "SELECT event::text, backend_pid, lease_epoch FROM durable_ledger.audit_log"
            " WHERE run = %s AND (cardinality(%s::text[]) = 0 OR event::text = ANY(%s))"
            " ORDER BY id", (run, list(events), list(events))).fetchall()

    def effects(self, run: str) -> List[Tuple[Any, ...]]:
        """(tool, occurrence, status, lease_epoch) of the run, in order."""
        return self.admin.execute(
            "SELECT tool, occurrence, status::text, lease_epoch FROM durable_ledger.effects"
            " WHERE run = %s ORDER BY created_at, occurrence", (run,)).fetchall()

    def take_elsewhere(self, run: str) -> bool:
        """Whether another worker could take the run right now (and then it has it)."""
        return bool(self.admin.execute(
            "SELECT (durable_ledger.take_lease(%s, '1 minute')).token IS NOT NULL",
            (run,)).fetchone()[0])  # type: ignore[index]

    # ----------------------------------------- a model's parallel tool calls

    async def test_a_pool_connection_is_given_back_as_it_was_lent(self) -> None:
        # As the synchronous Ledger's (test_token_leases): a statement on a pool's connection
        # not in autocommit mode is sent alone in autocommit, and the connection given back
        # idle and not in autocommit mode, after a call and after a refused statement.
        pool = await self.pool(size=1, autocommit=False)
        ledger = AsyncLedger(pool)

        async def as_lent() -> None:
            async with pool.connection() as conn:
                self.assertFalse(conn.autocommit)
                self.assertEqual(conn.info.transaction_status, TransactionStatus.IDLE)
                await conn.execute("SELECT 1")
                self.assertEqual(conn.info.transaction_status, TransactionStatus.INTRANS)

        async with ledger.token_attempt(self.run_id, ttl=30):
            self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"invoice": "INV-1"},
                                                  lambda key: {"paid": True}), {"paid": True})
        await as_lent()
        with self.assertRaises(InvalidArgument):
            async with ledger.token_attempt(self.run_id, ttl=30):
                await ledger.guarded(self.run_id, "", {}, lambda key: None)
        await as_lent()

    async def test_parallel_calls_of_one_attempt_on_a_pool_replay_in_another_order(self) -> None:
        # A model asks for five tool calls at once; the agent runs them as tasks of one
        # attempt on one pool.  The worker restarts, the model asks again in another order:
        # every call replays (a key is the tool and the canonical args, or a business key,
        # never a position) and nothing is paid twice.
        ledger = AsyncLedger(await self.pool(size=3))
        d = Downstream(ledger, delay=0.05)
        calls = [(d.pay, {"invoice": "INV-1", "amount": 10}, None),
                 (d.pay, {"invoice": "INV-2", "amount": 20}, None),
                 (d.mail, {"to": "a@example.com"}, None),
                 (d.pay, {"invoice": "INV-4", "amount": 5}, f"{self.run_id}-INV-4-a"),
                 (d.pay, {"invoice": "INV-4", "amount": 5}, f"{self.run_id}-INV-4-b")]
        async with ledger.token_attempt(self.run_id, ttl=30) as lease:
            self.assertIsInstance(lease, AsyncTokenLease)
            first = await asyncio.gather(*(tool(self.run_id, args, business_key=bk)
                                           for tool, args, bk in calls))
        self.assertEqual(d.count(), 5)
        intents = self.audit(self.run_id, "intent")
        self.assertEqual(len(intents), 5)
        self.assertGreater(len({pid for _, pid, _ in intents}), 1,
                           f"the parallel calls all ran on one backend: {intents}")
        self.assertEqual(len(self.audit(self.run_id, "lease_released")), 1)

        order = [4, 2, 0, 3, 1]
        async with ledger.token_attempt(self.run_id, ttl=30) as lease:
            self.assertEqual(lease.epoch, 2)
            again = await asyncio.gather(*(calls[i][0](self.run_id, calls[i][1],
                                                       business_key=calls[i][2])
                                           for i in order))
        self.assertEqual(d.count(), 5, "the replay performed something again")
        self.assertEqual(again, [first[i] for i in order])
        self.assertEqual(len(self.audit(self.run_id, "replay")), 5)
        self.assertEqual({status for _, _, status, _ in self.effects(self.run_id)}, {"completed"})

    async def test_parallel_calls_one_of_which_waits_for_an_approver(self) -> None:
        # Parallel tool calls of one step on a pool, in a token attempt: the refund over
        # the limit waits for an approver (AwaitingApproval), nothing of it is performed;
        # approved by another login, the next attempt performs it once and replays the rest.
        tool = f"t.refund.{uuid.uuid4().hex[:12]}"
        self.admin.execute("SELECT durable_ledger.register_tool(%s, 'test')", (tool,))
        self.admin.execute("SELECT durable_ledger.set_approval(%s, 'strict $.amount > 100', 'test')", (tool,))
        ledger = AsyncLedger(await self.pool(size=3))
        sent: List[Any] = []

        @ledger.tool(tool)
        async def refund(args: Any, idempotency_key: str) -> Any:
            sent.append(args["order"])
            return {"refunded": args["order"]}

        orders = [{"order": 1, "amount": 20}, {"order": 2, "amount": 500}, {"order": 3, "amount": 30}]
        with self.assertRaises(AwaitingApproval) as caught:
            async with ledger.token_attempt(self.run_id, ttl=30):
                outcomes = await asyncio.gather(*(refund(self.run_id, o) for o in orders),
                                                return_exceptions=True)
                for outcome in outcomes:
                    if isinstance(outcome, BaseException):
                        raise outcome
        self.assertIsInstance(caught.exception, EffectPaused)
        self.assertNotIn(2, sent)
        waiting = caught.exception.key

        role = f"dl_pytest_ap_{uuid.uuid4().hex[:12]}"
        self.admin.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE durable_ledger_approver')
        self.addCleanup(self.admin.execute, f'DROP ROLE "{role}"')
        approver = await self.connect(psycopg.conninfo.make_conninfo(DSN or "", user=role))
        await approver.execute("SELECT durable_ledger.approve_effect(%s, 'Ana')", (waiting,))

        for _ in range(2):
            async with ledger.token_attempt(self.run_id, ttl=30):
                again = await asyncio.gather(*(refund(self.run_id, o) for o in reversed(orders)))
            self.assertEqual(again, [{"refunded": o["order"]} for o in reversed(orders)])
        self.assertEqual(sorted(sent), [1, 2, 3])

    async def test_parallel_calls_past_a_budget_and_the_model_of_each_attempt(self) -> None:
        # Five parallel emails of one step on a pool, in a token attempt, against a budget
        # of two per run: two are sent, the others stop at the budget (BudgetExhausted);
        # every call carries the attempt's model, and a session attempt of the run under
        # another model is audited once as model_changed.
        tool = f"t.email.{uuid.uuid4().hex[:12]}"
        self.admin.execute("SELECT durable_ledger.register_tool(%s, 'test')", (tool,))
        self.admin.execute("SELECT durable_ledger.set_budget(%s, 2, 'test')", (tool,))
        sent: List[Any] = []

        def email_tool(ledger: AsyncLedger) -> Any:
            @ledger.tool(tool)
            async def email(args: Any, idempotency_key: str) -> Any:
                sent.append(args["n"])
                return {"sent": args["n"]}
            return email

        ledger = AsyncLedger(await self.pool(size=3))
        email = email_tool(ledger)
        async with ledger.token_attempt(self.run_id, ttl=30, model="model-a"):
            outcomes = await asyncio.gather(*(email(self.run_id, {"n": n}) for n in range(5)),
                                            return_exceptions=True)
        self.assertEqual(len(sent), 2)
        self.assertTrue(any(isinstance(o, BudgetExhausted) for o in outcomes), outcomes)
        self.assertEqual({r[0] for r in self.admin.execute(
            "SELECT meta ->> 'model' FROM durable_ledger.effects WHERE run = %s",
            (self.run_id,))}, {"model-a"})
        session = AsyncLedger(await self.connect())
        email_in_session = email_tool(session)
        async with session.attempt(self.run_id, model="model-b"):
            for n in sorted(sent):
                await email_in_session(self.run_id, {"n": n})   # replays: no budget is used
        self.assertEqual(len(sent), 2)
        self.assertEqual(len(self.audit(self.run_id, "model_changed")), 1)

    async def test_tasks_on_one_pool_through_pgbouncer_with_the_lease_renewed(self) -> None:
        if not BOUNCER_DSN:
            self.skipTest("DURABLE_LEDGER_PGBOUNCER_DSN is not set")
        # An AsyncConnectionPool of PgBouncer connections (transaction mode), 8 tasks at
        # once, ttl 2 s and tools awaited up to 3 s: the renewal task keeps the lease.
        await self.warm_bouncer(3)
        pool = await self.pool(BOUNCER_DSN, size=4, prepare_threshold=None)
        ledger = AsyncLedger(pool)
        d = Downstream(ledger, delay=0.2)

        async def slow_pay(i: int) -> Any:
            async def perform(key: str) -> Any:
                await asyncio.sleep(3)
                d.sent["bank.pay"].append(({"slow": i}, key))
                return {"slow": i}
            return await ledger.guarded(self.run_id, "bank.pay", {"slow": i}, perform)

        async with ledger.token_attempt(self.run_id, ttl=2) as lease:
            results = await asyncio.gather(
                *(d.mail(self.run_id, {"to": f"u{i}@example.com"}) for i in range(6)),
                slow_pay(1), slow_pay(2))
            self.assertGreaterEqual(lease.renewals, 2)
            self.assertFalse(self.take_elsewhere(self.run_id), "the lease was not kept")
        self.assertIsNone(lease.lost)
        self.assertEqual(d.count(), 8)
        pids = {pid for _, pid, _ in self.audit(self.run_id, "intent")}
        self.assertGreater(len(pids), 1, "PgBouncer sent every call to one backend")
        self.assertEqual(len(self.effects(self.run_id)), 8)

        again = AsyncLedger(await self.pool(BOUNCER_DSN, size=2, prepare_threshold=None))
        d2 = Downstream(again)
        async with again.token_attempt(self.run_id, ttl=30):
            replayed = await asyncio.gather(
                *(d2.mail(self.run_id, {"to": f"u{i}@example.com"}) for i in reversed(range(6))))
        self.assertEqual(replayed, list(reversed(results[:6])))
        self.assertEqual(d2.count(), 0)

    async def warm_bouncer(self, n: int) -> None:
        """Makes PgBouncer open n server connections (n transactions at once): it opens
        them lazily, and would otherwise serve short transactions from one."""
        conns = [await self.connect(BOUNCER_DSN) for _ in range(n)]
        for conn in conns:
            await conn.execute("BEGIN")
            await conn.execute("SELECT 1")
        pids = {(await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]  # type: ignore[index]
                for conn in conns}
        for conn in conns:
            await conn.execute("COMMIT")
        self.assertEqual(len(pids), n, f"PgBouncer did not open {n} server connections")

    async def test_the_lease_is_renewed_while_a_tool_is_awaited(self) -> None:
        conn = await self.connect()
        ledger = AsyncLedger(conn)  # one connection: calls and renewals share it
        seen: Dict[str, Any] = {}

        async def slow(key: str) -> Any:
            await asyncio.sleep(3.5)
            seen["taken_elsewhere"] = self.take_elsewhere(self.run_id)
            await asyncio.sleep(1)
            return {"payment_id": "p1"}

        async with ledger.token_attempt(self.run_id, ttl=2) as lease:
            taken_at = lease.expires_at
            self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"amount": 5}, slow),
                             {"payment_id": "p1"})
            self.assertFalse(seen["taken_elsewhere"], "another worker took the run mid-payment")
            self.assertGreaterEqual(lease.renewals, 4)
            self.assertGreater(lease.expires_at, taken_at)
        self.assertIsNone(lease.lost)
        renewals = lease.renewals
        await asyncio.sleep(1)
        self.assertEqual(lease.renewals, renewals, "the renewal outlived the attempt")
        self.assertEqual([e for e, _, _ in self.audit(self.run_id)],
                         ["lease_acquired", "intent", "completed", "lease_released"])

    # ------------------------------------------------------- session leases

    async def test_session_attempts_on_an_async_connection(self) -> None:
        conn = await self.connect()
        ledger = AsyncLedger(conn)
        d = Downstream(ledger, delay=0.02)
        async with ledger.attempt(self.run_id):
            # Tasks of one session attempt: statements go one at a time on the connection.
            first = await asyncio.gather(d.pay(self.run_id, {"invoice": "A"}),
                                         d.mail(self.run_id, {"to": "a@example.com"}),
                                         d.pay(self.run_id, {"invoice": "B"}))
            other = AsyncLedger(await self.connect())
            with self.assertRaises(RunBusy):
                async with other.attempt(self.run_id, wait=False):
                    pass
            with self.assertRaises(EffectFailed) as failed:
                await d.pay(self.run_id, {"invoice": "C", "declined": True})
            self.assertFalse(failed.exception.replayed)
        self.assertEqual(d.count(), 3)
        # A waiting acquire does not block the loop: another task runs meanwhile.
        holder = AsyncLedger(await self.connect())
        await holder.acquire_run(self.run_id)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.create_task(tick())
        waiting = asyncio.create_task(ledger.acquire_run(self.run_id))
        await asyncio.sleep(0.5)
        self.assertFalse(waiting.done())
        self.assertGreater(ticks, 3, "a waiting acquire_run blocked the event loop")
        await holder.release_run(self.run_id)
        self.assertTrue(await asyncio.wait_for(waiting, PATIENCE))
        ticker.cancel()
        again = await asyncio.gather(d.pay(self.run_id, {"invoice": "A"}),
                                     d.mail(self.run_id, {"to": "a@example.com"}),
                                     d.pay(self.run_id, {"invoice": "B"}))
        with self.assertRaises(EffectFailed) as failed:
            await d.pay(self.run_id, {"invoice": "C", "declined": True})
        self.assertTrue(failed.exception.replayed)
        await ledger.release_run(self.run_id)
        self.assertEqual(again, first)
        self.assertEqual(d.count(), 3, "the second attempt performed something again")

    async def test_a_clean_refusal_of_begin_effect_does_not_stop_the_attempt(self) -> None:
        # helper-26: a named refusal (23505) fell into the cancellation path and stopped
        # the attempt.  Nothing was written: the attempt goes on, in both kinds of lease.
        invoice = f"INV-{uuid.uuid4()}"

        async def pay(key: str) -> Any:
            return {"ok": key}

        setup = AsyncLedger(await self.connect())
        async with setup.attempt(f"{self.run_id}-setup"):
            await setup.guarded(f"{self.run_id}-setup", "bank.pay", {"amount": 1}, pay,
                                business_key=invoice)
        session = AsyncLedger(await self.connect())
        pooled = AsyncLedger(await self.pool(size=2))
        for ledger, attempt in ((session, session.attempt), (pooled, pooled.token_attempt)):
            run = f"{self.run_id}-{uuid.uuid4().hex[:6]}"
            async with attempt(run):
                with self.assertRaises(BusinessKeyConflict):
                    await ledger.guarded(run, "bank.pay", {"amount": 2}, pay, business_key=invoice)
                if ERROR_ENDS_SESSION_LEASE and ledger is session:
                    # through a proxy the shard's error ended the session lease: the attempt
                    # stops at its next call, and a new one goes on
                    with self.assertRaises(LeaseLost):
                        await ledger.guarded(run, "mail.send", {"to": "ap"}, pay)
                    continue
                sent = await ledger.guarded(run, "mail.send", {"to": "ap"}, pay)
                self.assertIn("ok", sent)

    async def test_a_begin_inside_a_tasks_transaction_is_not_sent(self) -> None:
        # AsyncLedger(conn) shared with a task that runs a transaction on it: its BEGIN
        # lands right after the ledger checked that the connection is idle.  begin_effect
        # is not sent, so the task's COMMIT commits no intent that nothing would complete.
        conn = await self.connect()
        ledger = AsyncLedger(conn)
        checked = ledger._check_writable
        state = {"begin": False}

        def idle_then_begin() -> None:
            checked()
            if state["begin"]:
                state["begin"] = False
                conn.pgconn.exec_(b"BEGIN")  # the task's transaction starts

        ledger._check_writable = idle_then_begin  # type: ignore[method-assign]
        performed = []

        async def send(key: str) -> Any:
            performed.append(key)
            return {"message_id": "m1"}

        with self.assertRaises(LedgerUsageError) as caught:
            async with ledger.token_attempt(self.run_id, ttl=30):
                state["begin"] = True
                try:
                    await ledger.guarded(self.run_id, "mail.send", {"to": "a"}, send)
                finally:
                    await conn.execute("COMMIT")  # the task's transaction commits
        self.assertIn("was not sent", str(caught.exception))
        self.assertEqual(performed, [])
        self.assertEqual(self.effects(self.run_id), [], "an intent went with the COMMIT")

    async def test_a_factory_of_connections_and_what_is_refused(self) -> None:
        ledger = AsyncLedger(lambda: psycopg.AsyncConnection.connect(DSN, autocommit=True))  # type: ignore[arg-type]
        d = Downstream(ledger)
        async with ledger.token_attempt(self.run_id, ttl=30):
            await d.pay(self.run_id, {"invoice": "F"})
        self.assertEqual(self.effects(self.run_id), [("bank.pay", 1, "completed", 1)])
        with self.assertRaises(LedgerUsageError):  # a factory serves token leases only
            async with ledger.attempt(self.run_id):
                pass
        with self.assertRaises(TypeError):
            AsyncLedger(self.admin)  # a synchronous connection: that is Ledger's
        not_autocommit = await psycopg.AsyncConnection.connect(DSN)  # type: ignore[arg-type]
        self.addAsyncCleanup(not_autocommit.close)
        with self.assertRaises(LedgerUsageError):
            AsyncLedger(not_autocommit)
        with self.assertRaises(RunBusy):
            self.assertTrue(self.take_elsewhere(self.run_id))
            async with ledger.token_attempt(self.run_id, ttl=30):
                pass

    async def test_a_report_whose_connection_could_not_be_had_is_sent_on_the_next(self) -> None:
        # the factory cannot connect once, just when the completion needs a connection (a
        # pool's PoolTimeout is the same): nothing was sent, so it is sent on the next one
        refuse = []

        def factory() -> Any:
            if refuse:
                refuse.pop()
                raise psycopg.OperationalError("connection refused (test)")
            return psycopg.AsyncConnection.connect(DSN, autocommit=True)

        ledger = AsyncLedger(factory)

        async def pay(key: str) -> Any:
            refuse.append(True)
            return {"payment_id": "p1"}

        with self.assertLogs("durable_ledger", "WARNING") as logs:
            async with ledger.token_attempt(self.run_id, ttl=30):
                self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"n": 1}, pay),
                                 {"payment_id": "p1"})
        self.assertEqual(refuse, [])
        self.assertEqual(self.effects(self.run_id), [("bank.pay", 1, "completed", 1)])
        self.assertTrue([line for line in logs.output
                         if "complete_effect" in line and "once more" in line], logs.output)

    # -------------------------------------------------- unknown and lost

    async def test_a_cancelled_tool_leaves_its_outcome_unknown_and_stops_the_attempt(self) -> None:
        ledger = AsyncLedger(await self.pool(size=2))
        started = asyncio.Event()
        performed: List[str] = []

        async def hangs(key: str) -> Any:
            performed.append(key)
            started.set()
            await asyncio.sleep(60)

        async with ledger.token_attempt(self.run_id, ttl=30):
            call = asyncio.create_task(ledger.guarded(self.run_id, "bank.pay", {"i": 1}, hangs))
            await asyncio.wait_for(started.wait(), PATIENCE)
            call.cancel()  # a timeout around the tool, the agent shutting down, ...
            with self.assertRaises(asyncio.CancelledError):
                await call
            # The same call again in this attempt would be occurrence 2: a second payment.
            with self.assertRaises(EffectPaused):
                await ledger.guarded(self.run_id, "bank.pay", {"i": 1}, hangs)
        self.assertEqual(len(performed), 1)
        self.assertEqual(self.effects(self.run_id), [("bank.pay", 1, "started", 1)])
        async with ledger.token_attempt(self.run_id, ttl=30):
            with self.assertRaises(EffectPaused) as paused:
                await ledger.guarded(self.run_id, "bank.pay", {"i": 1}, hangs)
        self.assertEqual(paused.exception.key, performed[0])
        self.assertEqual(len(performed), 1)

    async def test_a_recorded_model_call_cancelled_is_made_again_by_the_next_attempt(self) -> None:
        # The same as above with ledger.record: a model call, harmless to make again.  Its
        # cancellation records nothing and stops the attempt (a retry in it would act on an
        # answer the replay does not see); the next attempt makes the lost call again
        # (attempt 2) instead of pausing, and replays the answered one.
        ledger = AsyncLedger(await self.pool(size=2))
        started = asyncio.Event()
        asked: List[str] = []

        async def model(answer: str) -> Any:
            asked.append(answer)
            if answer == "hangs":
                started.set()
                await asyncio.sleep(60)
            return {"content": answer}

        async with ledger.token_attempt(self.run_id, ttl=30):
            call = asyncio.create_task(
                ledger.record(self.run_id, "model", {"turn": 1}, lambda: model("hangs")))
            await asyncio.wait_for(started.wait(), PATIENCE)
            call.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await call
            with self.assertRaises(AttemptStopped):  # the attempt stopped; no person needed
                await ledger.record(self.run_id, "model", {"turn": 1}, lambda: model("NOT CALLED"))
        async with ledger.token_attempt(self.run_id, ttl=30):
            again = await ledger.record(self.run_id, "model", {"turn": 1}, lambda: model("again"))
        self.assertEqual(again, {"content": "again"})
        self.assertEqual(asked, ["hangs", "again"])
        self.assertEqual(self.admin.execute(
            "SELECT occurrence, attempt, status::text FROM durable_ledger.effects WHERE run = %s"
            " ORDER BY occurrence", (self.run_id,)).fetchall(),
            [(1, 2, "completed")])

    async def test_a_recorded_call_cancelled_while_its_intent_is_out_needs_no_person(self) -> None:
        # begin_recorded waits (the ledger's table is locked by someone else) and the caller
        # gives up: the attempt stops with AttemptStopped, which says no person is needed,
        # and the next attempt makes the call.
        ledger = AsyncLedger(await self.connect())
        blocker = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(blocker.close)
        async with ledger.attempt(self.run_id):
            blocker.execute("BEGIN")
            blocker.execute("LOCK TABLE durable_ledger.effects IN SHARE MODE")
            with self.assertRaises(TimeoutError):
                await asyncio.wait_for(
                    ledger.record(self.run_id, "model", {"turn": 1}, lambda: {"content": "x"}),
                    0.5)
            blocker.execute("ROLLBACK")
            with self.assertRaises(AttemptStopped) as stopped:
                await ledger.record(self.run_id, "model", {"turn": 1}, lambda: {"content": "x"})
            self.assertNotIsInstance(stopped.exception, EffectPaused)
            self.assertIn("no person is needed", str(stopped.exception))
        async with ledger.attempt(self.run_id):
            self.assertEqual(
                await ledger.record(self.run_id, "model", {"turn": 1}, lambda: {"content": "y"}),
                {"content": "y"})
        self.assertEqual(self.admin.execute(
            "SELECT count(*) FROM durable_ledger.unresolved WHERE run = %s",
            (self.run_id,)).fetchone()[0], 0)  # type: ignore[index]

    async def test_a_call_cancelled_while_its_intent_is_out_stops_the_attempt(self) -> None:
        # The intent is sent and the task is cancelled before the reply (a timeout around
        # the whole call): whether it committed is unknown, and the same call again in this
        # attempt would be occurrence 2 with a new key -- a second payment if the first
        # intent did commit.  The attempt stops instead.
        ledger = AsyncLedger(await self.pool(size=2))
        performed: List[str] = []

        async def pay(key: str) -> Any:
            performed.append(key)
            return {"paid": True}

        blocker = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(blocker.close)
        async with ledger.token_attempt(self.run_id, ttl=30):
            with blocker.transaction():
                blocker.execute("LOCK TABLE durable_ledger.effects IN ACCESS EXCLUSIVE MODE")
                call = asyncio.create_task(ledger.guarded(self.run_id, "bank.pay", {"i": 1}, pay))
                waited = 0.0
                while waited < PATIENCE and not self.admin.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query LIKE '%%begin_effect%%'").fetchone()[0]:  # type: ignore[index]
                    await asyncio.sleep(0.05)
                    waited += 0.05
                call.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await call
            # the lock is gone: the intent may commit now, unseen
            with self.assertRaises(EffectPaused):
                await ledger.guarded(self.run_id, "bank.pay", {"i": 1}, pay)
        self.assertEqual(performed, [])
        self.assertLessEqual(len(self.effects(self.run_id)), 1)

    async def test_a_lease_broken_while_a_call_is_awaited(self) -> None:
        ledger = AsyncLedger(await self.pool(size=2))
        d = Downstream(ledger)

        async def broken_meanwhile(key: str) -> Any:
            self.admin.execute("SELECT durable_ledger.break_lease(%s, 'oncall', 'hung?')",
                               (self.run_id,))
            return {"paid": True}

        with self.assertRaises(LeaseLost):
            async with ledger.token_attempt(self.run_id, ttl=30) as lease:
                # The call in flight is reported (a report needs no lease) ...
                self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"i": 1},
                                                      broken_meanwhile), {"paid": True})
                # ... and the next one is refused by the ledger: nothing performed.
                with self.assertRaises(LeaseLost):
                    await d.mail(self.run_id, {"to": "x@example.com"})
                self.assertIsNotNone(lease.lost)
                with self.assertRaises(LeaseLost):  # known now: not asked again
                    await d.mail(self.run_id, {"to": "y@example.com"})
        self.assertEqual(d.count(), 0)
        self.assertEqual(self.effects(self.run_id), [("bank.pay", 1, "completed", 1)])

    async def test_a_task_that_outlives_its_attempt_never_acts(self) -> None:
        ledger = AsyncLedger(await self.pool(size=2))
        d = Downstream(ledger)
        go = asyncio.Event()

        async def late() -> Any:
            await go.wait()  # the model answered after the attempt was left
            return await d.pay(self.run_id, {"invoice": "late"})

        async with ledger.token_attempt(self.run_id, ttl=30):
            leftover = asyncio.create_task(late())
        async with ledger.token_attempt(self.run_id, ttl=30):
            go.set()
            with self.assertRaises(LeaseLost):
                await leftover
            # and a task started outside any attempt is refused while one is open
            outsider = asyncio.create_task(d.pay(self.run_id, {"invoice": "x"}),
                                           context=contextvars.Context())
            with self.assertRaises(LedgerUsageError):
                await outsider
        self.assertEqual(d.count(), 0)
        self.assertEqual(self.effects(self.run_id), [])

    async def test_the_end_of_an_attempt_awaits_its_calls_in_flight(self) -> None:
        ledger = AsyncLedger(await self.pool(size=2))
        entered = asyncio.Event()
        finished: List[str] = []

        async def slow(key: str) -> Any:
            entered.set()
            await asyncio.sleep(1)
            finished.append(key)
            return {"ok": True}

        async with ledger.token_attempt(self.run_id, ttl=30):
            task = asyncio.create_task(ledger.guarded(self.run_id, "bank.pay", {"i": 1}, slow))
            await asyncio.wait_for(entered.wait(), PATIENCE)
        # the block was left with the call in flight: its exit waited for it
        self.assertEqual(len(finished), 1)
        self.assertTrue(task.done())
        self.assertEqual(task.result(), {"ok": True})
        self.assertEqual([e for e, _, _ in self.audit(self.run_id)],
                         ["lease_acquired", "intent", "completed", "lease_released"])

    # ------------------------------------- cancellations and leftover tasks

    def hold_effects(self) -> Callable[[], None]:
        """Another session holds durable_ledger.effects until the returned function is
        called: the ledger's statements wait for it meanwhile."""
        blocker = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE durable_ledger.effects IN ACCESS EXCLUSIVE MODE")

        def let_go() -> None:
            if not blocker.closed:
                blocker.execute("COMMIT")
                blocker.close()
        self.addCleanup(let_go)
        return let_go

    async def until_a_statement_waits_for_a_lock(self) -> None:
        """Until a ledger statement waits for a lock (hold_effects), polled."""
        deadline = time.monotonic() + PATIENCE
        while not self.admin.execute(
                "SELECT count(*) > 0 FROM pg_locks WHERE NOT granted").fetchone()[0]:  # type: ignore[index]
            self.assertLess(time.monotonic(), deadline, "no statement waited for the lock")
            await asyncio.sleep(0.01)

    async def test_a_task_that_outlives_a_session_attempt_never_acts(self) -> None:
        # gather() raises at the first failing branch and the block is left while the
        # other branch still waits for its model; the worker then retries the run.  The
        # leftover branch must not send its email in the retry (it would take occurrence 1
        # there, and the retry's own email would be a second one).
        ledger = AsyncLedger(await self.connect())
        d = Downstream(ledger)

        async def email_branch() -> Any:
            await asyncio.sleep(0.3)
            return await d.mail(self.run_id, {"to": "ap@example.com"})

        async def failing_branch() -> None:
            await asyncio.sleep(0.1)
            raise ValueError("the model call failed")

        leftover: List["asyncio.Task[Any]"] = []
        with self.assertRaises(ValueError):
            async with ledger.attempt(self.run_id):
                leftover.append(asyncio.create_task(email_branch()))
                await asyncio.gather(leftover[0], failing_branch())
        async with ledger.attempt(self.run_id):
            with self.assertRaises(LeaseLost):
                await leftover[0]
            await email_branch()
        self.assertEqual(d.count(), 1, "the email was sent twice")
        self.assertEqual(self.effects(self.run_id), [("mail.send", 1, "completed", 2)])
        # and no call takes a session lease implicitly
        with self.assertRaises(LedgerUsageError):
            await d.mail(self.run_id, {"to": "ap@example.com"})
        self.assertEqual(self.admin.execute(
            "SELECT count(*) FROM durable_ledger.leases WHERE run = %s",
            (self.run_id,)).fetchone()[0], 0)  # type: ignore[index]

    async def test_one_run_twice_at_once_on_one_async_ledger_is_refused(self) -> None:
        # A queue delivers the job twice to one process: both would hold the run through
        # the one connection's lock, and both would pay.
        ledger = AsyncLedger(await self.connect())
        d = Downstream(ledger)
        started = asyncio.Event()

        async def job() -> Any:
            async with ledger.attempt(self.run_id, wait=False):
                started.set()
                await asyncio.sleep(0.3)
                return await d.pay(self.run_id, {"invoice": "INV-1"})

        first = asyncio.create_task(job())
        await started.wait()
        with self.assertRaises(LedgerUsageError):
            await job()
        with self.assertRaises(LedgerUsageError):
            await ledger.acquire_run(self.run_id)
        await first
        self.assertEqual(d.count(), 1)

    async def test_a_timeout_in_the_exit_of_a_token_attempt_still_ends_it(self) -> None:
        ledger = AsyncLedger(await self.pool(size=2))

        async def slow(key: str) -> Any:
            await asyncio.sleep(1.0)
            return {"ok": 1}

        async def worker() -> None:
            async with ledger.token_attempt(self.run_id, ttl=3):
                asyncio.create_task(ledger.guarded(self.run_id, "bank.pay", {"i": 1}, slow))
                await asyncio.sleep(0.2)  # the exit waits for the call in flight

        with self.assertRaises(asyncio.TimeoutError):
            await asyncio.wait_for(worker(), 0.5)
        # the exit was finished all the same: the call recorded, the renewal stopped, the
        # lease released (not left renewed forever), and the run can be taken again
        self.assertEqual(self.effects(self.run_id), [("bank.pay", 1, "completed", 1)])
        self.assertEqual([t for t in asyncio.all_tasks() if "renewal" in t.get_name()], [])
        self.assertEqual(self.admin.execute(
            "SELECT count(*) FROM durable_ledger.leases WHERE run = %s",
            (self.run_id,)).fetchone()[0], 0)  # type: ignore[index]
        async with ledger.token_attempt(self.run_id, ttl=3) as lease:
            self.assertEqual(lease.epoch, 2)

    async def test_a_cancellation_during_the_report_records_it_and_stops_the_attempt(self) -> None:
        # The timeout fires after the bank paid, while the report waits for the single
        # connection (another call of the attempt holds it, waiting for a lock): the report
        # is still made, the caller gets its timeout, and the attempt stops (the caller
        # never saw the answer; calling again would be occurrence 2, a second payment).
        ledger = AsyncLedger(await self.connect())
        paid: List[str] = []
        at_the_bank = asyncio.Event()
        bank_answers = asyncio.Event()

        async def pay(key: str) -> Any:
            at_the_bank.set()
            await bank_answers.wait()
            paid.append(key)
            return {"receipt": "R-1"}

        async with ledger.token_attempt(self.run_id, ttl=30):
            a = asyncio.create_task(asyncio.wait_for(
                ledger.guarded(self.run_id, "bank.pay", {"invoice": 9}, pay), PATIENCE))
            # (the intent is in once the bank is called: not a guess of how long it takes)
            await asyncio.wait_for(at_the_bank.wait(), PATIENCE)
            let_go = self.hold_effects()
            b = asyncio.create_task(ledger.guarded(self.run_id, "mail.send", {"to": "x"},
                                                   lambda key: {"sent": True}))
            await self.until_a_statement_waits_for_a_lock()  # b holds the one connection
            bank_answers.set()
            while not paid:  # the bank answered: the report now waits for the connection
                await asyncio.sleep(0.01)
            a.cancel()
            let_go()
            with self.assertRaises(asyncio.CancelledError):
                await a
            self.assertEqual(await b, {"sent": True})
            with self.assertRaises(EffectPaused):
                await ledger.guarded(self.run_id, "bank.pay", {"invoice": 9}, pay)
        self.assertEqual(len(paid), 1)
        self.assertEqual(sorted(self.effects(self.run_id)),
                         [("bank.pay", 1, "completed", 1), ("mail.send", 1, "completed", 1)])
        async with ledger.token_attempt(self.run_id, ttl=30):  # the retry replays it
            self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"invoice": 9}, pay),
                             {"receipt": "R-1"})
        self.assertEqual(len(paid), 1)

    async def test_a_cancelled_statement_leaves_the_connection_usable(self) -> None:
        conn = await self.connect()
        ledger = AsyncLedger(conn)
        d = Downstream(ledger)
        async with ledger.attempt(self.run_id):
            let_go = self.hold_effects()
            with self.assertRaises(asyncio.TimeoutError):  # the intent waits for the lock
                await asyncio.wait_for(d.pay(self.run_id, {"i": 1}), 0.3)
            let_go()
            self.assertEqual(conn.info.transaction_status.name, "IDLE")
            with self.assertRaises(EffectPaused):  # the attempt is stopped
                await d.pay(self.run_id, {"i": 1})
        self.assertEqual(d.count(), 0)
        self.assertEqual(self.effects(self.run_id), [])  # cancelled on the server
        # a wait for a run that another worker holds, given up: the run is not taken later
        other = AsyncLedger(await self.connect())
        await other.acquire_run(self.run_id)
        with self.assertRaises(asyncio.TimeoutError):
            await asyncio.wait_for(ledger.acquire_run(self.run_id), 0.5)
        await other.release_run(self.run_id)
        await asyncio.sleep(0.3)
        self.assertFalse(self.admin.execute(
            "SELECT count(*) > 0 FROM durable_ledger.leases WHERE run = %s",
            (self.run_id,)).fetchone()[0])  # type: ignore[index]
        async with ledger.attempt(self.run_id):  # and the connection serves the next attempt
            await d.pay(self.run_id, {"i": 2})
        self.assertEqual(d.count(), 1)

    async def job_waiting_for_a_held_run(self, ledger: AsyncLedger) -> "asyncio.Task[None]":
        """Another job on ledger's one connection, waiting 2 s for a run another worker
        holds: the connection is busy meanwhile, and the next statement waits its turn."""
        holder = psycopg.connect(DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(holder.close)
        other = f"{self.run_id}-other"
        holder.execute("SELECT durable_ledger.acquire_run(%s)", (other,))

        async def another_job() -> None:
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(ledger.acquire_run(other), 2.0)

        job = asyncio.create_task(another_job())
        await asyncio.sleep(0.1)
        return job

    async def test_a_call_cancelled_before_its_intent_went_out_sends_nothing(self) -> None:
        # On one connection, the intent waits for its turn behind another job's wait for
        # a run somebody else holds; the call times out meanwhile.  Its intent must not go
        # out later on its own (it would be recorded and never performed, and the next
        # attempt would pause for a person): nothing is written, nothing stops.
        ledger = AsyncLedger(await self.connect())
        d = Downstream(ledger)
        epoch = 1
        async with ledger.attempt(self.run_id):
            job = await self.job_waiting_for_a_held_run(ledger)
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(d.pay(self.run_id, {"inv": 1}), 1.0)
            await job
            self.assertEqual(self.effects(self.run_id), [])
            # not stopped: the same call goes on in this attempt, as occurrence 1 -- but
            # through a proxy the other job's cancelled wait is an error of the shard, which
            # ends the session's lease there (target.py): then nothing was performed and a
            # new attempt makes the call
            try:
                await d.pay(self.run_id, {"inv": 1})
            except LeaseLost:
                if not ERROR_ENDS_SESSION_LEASE:
                    raise
                epoch = 2
        if epoch == 2:
            self.assertEqual(self.effects(self.run_id), [])
            async with ledger.attempt(self.run_id):
                await d.pay(self.run_id, {"inv": 1})
        self.assertEqual(self.effects(self.run_id), [("bank.pay", 1, "completed", epoch)])
        self.assertEqual(d.count(), 1)

    async def test_a_token_attempt_cancelled_while_taking_its_lease_lets_it_go(self) -> None:
        pool = await self.pool(size=1)
        ledger = AsyncLedger(pool)

        async def busy() -> None:  # another call of this worker holds the one connection
            async with pool.connection():
                await asyncio.sleep(1.5)

        holding = asyncio.create_task(busy())
        await asyncio.sleep(0.05)
        with self.assertRaises(asyncio.TimeoutError):
            async with asyncio.timeout(0.5):
                async with ledger.token_attempt(self.run_id, ttl=120):
                    self.fail("the attempt began after its caller gave up")
        await holding
        self.assertEqual(self.admin.execute(
            "SELECT count(*) FROM durable_ledger.leases WHERE run = %s",
            (self.run_id,)).fetchone()[0], 0)  # type: ignore[index]
        async with ledger.token_attempt(self.run_id, ttl=120):  # not held until its ttl
            pass

    async def test_a_refusal_that_comes_back_after_a_cancellation_still_stops_as_it_says(self) -> None:
        ledger = AsyncLedger(await self.connect())
        d = Downstream(ledger)
        async with ledger.attempt(self.run_id):
            job = await self.job_waiting_for_a_held_run(ledger)
            self.admin.execute("SELECT durable_ledger.abandon_run(%s, 'ops', 'fraud')", (self.run_id,))
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(d.pay(self.run_id, {"inv": 1}), 1.0)
            await job
            # (through a proxy the cancel may have ended the session lease: LeaseLost first)
            with self.assertRaises((LeaseLost, RunAbandoned) if ERROR_ENDS_SESSION_LEASE
                                   else RunAbandoned) as stopped:  # do not retry: not merely "paused"
                await d.pay(self.run_id, {"inv": 2})
        if isinstance(stopped.exception, LeaseLost):  # the next attempt is told: do not retry
            with self.assertRaises(RunAbandoned):
                async with ledger.attempt(self.run_id):
                    await d.pay(self.run_id, {"inv": 2})
        self.assertEqual(d.count(), 0)

    async def test_an_explicit_hold_of_a_run_is_not_taken_twice(self) -> None:
        ledger = AsyncLedger(await self.connect())
        d = Downstream(ledger, delay=0.2)

        async def delivery() -> Any:
            if not await ledger.acquire_run(self.run_id, wait=False):
                return "busy"
            try:
                return await d.pay(self.run_id, {"to": "acme", "amount": 50})
            finally:
                await ledger.release_run(self.run_id)

        results = await asyncio.gather(delivery(), delivery(), return_exceptions=True)
        self.assertEqual(sorted(type(r).__name__ for r in results), ["LedgerUsageError", "dict"])
        self.assertEqual(d.count(), 1)

    async def test_a_silent_pooled_connection_does_not_stop_the_event_loop(self) -> None:
        # One pooled connection died while idle and the other's server is silent for 3 s
        # (SIGSTOP): finding a working connection must not block the other tasks (the
        # renewals of other attempts among them).
        pool = await self.pool(size=2)
        ledger = AsyncLedger(pool)
        c1, c2 = await pool.getconn(), await pool.getconn()
        p1, p2 = c1.info.backend_pid, c2.info.backend_pid
        await pool.putconn(c1)
        await pool.putconn(c2)
        self.admin.execute("SELECT pg_terminate_backend(%s)", (p1,))
        try:
            os.kill(p2, signal.SIGSTOP)
        except PermissionError:
            self.fail("run the tests as the server's OS user (they stop a backend for 3 s)")
        threading.Timer(3.0, lambda: os.kill(p2, signal.SIGCONT)).start()
        gaps: List[float] = []

        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.05)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0.2)
        async with ledger.token_attempt(self.run_id, ttl=30):
            pass
        ticking.cancel()
        self.assertLess(max(gaps), 1.0, "the event loop stood still while a connection was probed")

    # ------------------------------------------------------------ examples

    def run_example(self, dsn: str) -> None:
        proc = subprocess.run(["/usr/bin/python3", EXAMPLE, "--dsn", dsn, "--run", self.run_id],
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("ok - the first worker was killed mid-run", proc.stdout)
        self.assertIn("killed before turn 3", proc.stdout)
        # the ledger's view: three payments (one refused) and three emails, each once, the
        # payments replayed by the second worker's attempt
        self.assertEqual(sorted((tool, status, epoch) for tool, _, status, epoch
                                in self.effects(self.run_id)),
                         [("bank.pay", "completed", 1), ("bank.pay", "completed", 1),
                          ("bank.pay", "failed", 1), ("mail.send", "completed", 2),
                          ("mail.send", "completed", 2), ("mail.send", "completed", 2)])
        self.assertEqual(len(self.audit(self.run_id, "replay")), 3)

    def test_the_async_agent_example_killed_and_rerun(self) -> None:
        self.run_example(DSN)  # type: ignore[arg-type]

    def test_the_async_agent_example_through_pgbouncer(self) -> None:
        if not BOUNCER_DSN:
            self.skipTest("DURABLE_LEDGER_PGBOUNCER_DSN is not set")
        self.run_example(BOUNCER_DSN)


    def test_the_readmes_async_example_runs_as_written(self) -> None:
        # Copied as a new user copies it: the block after "## Async" in the client's
        # README, with only its DSN and a stand-in bank provided, run twice as a program.
        with open(README, encoding="utf-8") as f:
            text = f.read()
        section = text[text.index("\n## Async"):]
        code = re.search(r"```python\n(.*?)```", section, re.S)
        assert code is not None, "no python block in the README's async section"
        example = code.group(1)
        lines = [line for line in example.splitlines() if line.strip()]
        self.assertLessEqual(len(lines), 11, "not a ten-line example (and its asyncio.run)")
        self.assertIn("AsyncLedger", example)
        program = (
            "import asyncio, json, os, sys\n"
            "class bank:\n"
            "    @staticmethod\n"
            "    async def pay(invoice, amount, idempotency_key):\n"
            "        with open(os.environ['BANK_LOG'], 'a') as f:\n"
            "            f.write(json.dumps([invoice, amount, idempotency_key]) + '\\n')\n"
            "        return {'payment_id': 'pay-' + idempotency_key[:8]}\n"
            f"dsn = {DSN!r}\n"
            f"run_id = {self.run_id!r}\n"
            + example)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "agent.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(program)
            env = dict(os.environ, BANK_LOG=os.path.join(tmp, "bank.log"),
                       PYTHONPATH=os.path.dirname(HERE))
            for _ in range(2):  # the program, then its rerun after a crash or redelivery
                done = subprocess.run(["/usr/bin/python3", "-W", "default", path], env=env,
                                      capture_output=True, text=True, timeout=120)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                self.assertIn("pay-", done.stdout)
                self.assertEqual(done.stderr, "", "the example warns (a connection left open?)")
            with open(env["BANK_LOG"], encoding="utf-8") as f:
                payments = f.read().splitlines()
        self.assertEqual(len(payments), 1, f"the rerun paid again: {payments}")
        self.assertEqual([status for _, _, status, _ in self.effects(self.run_id)], ["completed"])
        self.assertEqual(len(self.audit(self.run_id, "replay")), 1)


if __name__ == "__main__":
    unittest.main()
