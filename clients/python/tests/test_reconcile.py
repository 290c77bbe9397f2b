"""Tests of reconcilers in the Python client (``reconcile=`` of `Ledger.tool`,
`Ledger.guarded` and their async forms) against a real server: a worker lost mid-payment
leaves the outcome unknown; the next attempt asks the provider by the lost attempt's
downstream key, records what it said, and goes on without a person -- a completion
replays, "no such payment" pays again under a new provider key, anything else pauses.

    DURABLE_LEDGER_DSN="dbname=postgres" /usr/bin/python3 -m unittest -v clients/python/tests/test_reconcile.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import unittest
import uuid
from typing import Any, Dict, List, Optional

import psycopg
from psycopg_pool import AsyncConnectionPool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # clients/python, if PYTHONPATH lacks it

from durable_ledger import (  # noqa: E402
    AsyncLedger,
    EffectPaused,
    Finding,
    Happened,
    Ledger,
    NotHappened,
)

from target import ADMIN_DSN, DSN  # noqa: E402  (where the connections go)
PATIENCE = 60


def setUpModule() -> None:
    if not DSN:
        raise unittest.SkipTest("DURABLE_LEDGER_DSN is not set")


class Bank:
    """A provider that pays under an idempotency key and answers lookups by it; it
    deduplicates nothing, so a second payment of one invoice is visible."""

    def __init__(self) -> None:
        self.payments: Dict[str, Dict[str, Any]] = {}
        self.lookups: List[str] = []
        self.lose_next = False  # the worker dies after the bank paid, before it answered

    def pay(self, args: Any, key: str) -> Dict[str, Any]:
        payment = {"payment_id": f"pay-{len(self.payments) + 1}", "amount": args["amount"]}
        self.payments[key] = payment
        if self.lose_next:
            self.lose_next = False
            raise TimeoutError("the worker was lost before the bank's answer arrived")
        return payment

    def lookup(self, key: str, args: Any) -> Optional[Finding]:
        self.lookups.append(key)
        if key in self.payments:
            return Happened(self.payments[key])
        return NotHappened({"lookup": "no payment with that key", "key": key})


class Base:
    admin: "psycopg.Connection[Any]"

    def tool(self, grace: Optional[str] = "0") -> str:
        """A tool of this test's own, registered, reconcilable after ``grace``."""
        name = f"bank.pay.{uuid.uuid4()}"
        self.admin.execute("SELECT durable_ledger.register_tool(%s, 'pytest')", (name,))
        if grace is not None:
            self.admin.execute("SELECT durable_ledger.set_reconcile(%s, %s, 'pytest')",
                               (name, grace))
        return name

    def effect(self, run: str) -> Dict[str, Any]:
        with self.admin.cursor(row_factory=psycopg.rows.dict_row) as cur:
            cur.execute("SELECT * FROM durable_ledger.effects WHERE run = %s", (run,))
            rows = cur.fetchall()
        assert len(rows) == 1, rows
        return rows[0]

    def events(self, key: str) -> List[str]:
        return [r[0] for r in self.admin.execute(
            "SELECT event::text FROM durable_ledger.audit_log WHERE key = %s"
            " AND event::text NOT IN ('lease_acquired', 'lease_released') ORDER BY id",
            (key,)).fetchall()]

    def wait_gone(self, pid: int) -> None:
        deadline = time.monotonic() + PATIENCE
        while self.admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                 (pid,)).fetchone():
            if time.monotonic() > deadline:
                raise AssertionError(f"backend {pid} did not end")
            time.sleep(0.01)


class ReconcileTest(Base, unittest.TestCase):

    def setUp(self) -> None:
        self.run_id = f"pyrec-{uuid.uuid4()}"
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(self.admin.close)

    def worker(self) -> Ledger:
        conn = psycopg.connect(DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(conn.close)
        return Ledger(conn)

    def lost_mid_payment(self, tool: str, bank: Bank, args: Any, *, paid: bool) -> str:
        """A worker calls the bank and is lost (its connection closes) before it records
        the answer: the bank paid (``paid``) or never got the request.  Returns the key."""
        ledger = self.worker()
        keys: List[str] = []

        def pay(a: Any, key: str) -> Any:
            keys.append(key)
            if not paid:
                raise TimeoutError("the request never reached the bank")
            bank.lose_next = True
            return bank.pay(a, key)

        with self.assertRaises(TimeoutError):
            with ledger.attempt(self.run_id):
                ledger.tool(tool)(pay)(self.run_id, args)
        pid = ledger.conn.info.backend_pid
        ledger.conn.close()
        self.wait_gone(pid)
        return keys[0]

    def test_the_bank_paid_the_next_attempt_replays_its_record(self) -> None:
        tool, bank = self.tool(), Bank()
        key = self.lost_mid_payment(tool, bank, {"amount": 10}, paid=True)
        ledger = self.worker()
        pay = ledger.tool(tool, reconcile=bank.lookup)(bank.pay)
        with ledger.attempt(self.run_id):
            result = pay(self.run_id, {"amount": 10})
        self.assertEqual(result, {"payment_id": "pay-1", "amount": 10})
        self.assertEqual(len(bank.payments), 1, "paid twice")
        self.assertEqual(bank.lookups, [key])  # the lost attempt's provider key
        row = self.effect(self.run_id)
        self.assertEqual((row["status"], row["attempt"], row["resolved_by"]),
                         ("completed", 1, None))
        self.assertEqual(self.events(key), ["intent", "pause", "reconciled", "replay"])
        # and for good: the next attempt replays without asking the bank
        with ledger.attempt(self.run_id):
            self.assertEqual(pay(self.run_id, {"amount": 10})["payment_id"], "pay-1")
        self.assertEqual(len(bank.lookups), 1)

    def test_the_bank_has_no_record_the_payment_is_made_under_a_new_key(self) -> None:
        tool, bank = self.tool(), Bank()
        key = self.lost_mid_payment(tool, bank, {"amount": 20}, paid=False)
        ledger = self.worker()
        pay = ledger.tool(tool, reconcile=bank.lookup)(bank.pay)
        with ledger.attempt(self.run_id):
            result = pay(self.run_id, {"amount": 20})
        self.assertEqual(result["amount"], 20)
        self.assertEqual(list(bank.payments), [key + "#2"])  # never under the old key
        row = self.effect(self.run_id)
        self.assertEqual((row["status"], row["attempt"]), ("completed", 2))
        self.assertEqual(self.events(key), ["intent", "pause", "reconciled", "intent",
                                            "completed"])

    def test_a_provider_that_cannot_tell_leaves_the_pause_for_a_person(self) -> None:
        tool, bank = self.tool(), Bank()
        key = self.lost_mid_payment(tool, bank, {"amount": 30}, paid=True)
        ledger = self.worker()

        def cannot_tell(k: str, args: Any) -> Optional[Finding]:
            bank.lookups.append(k)
            return None

        def broken(k: str, args: Any) -> Optional[Finding]:
            bank.lookups.append(k)
            raise ConnectionError("the lookup API is down")

        for reconcile in (cannot_tell, broken):
            with ledger.attempt(self.run_id):
                with self.assertRaises(EffectPaused) as paused:
                    ledger.tool(tool, reconcile=reconcile)(bank.pay)(self.run_id, {"amount": 30})
            self.assertEqual(paused.exception.key, key)
        self.assertEqual(bank.lookups, [key, key])
        self.assertEqual(len(bank.payments), 1)
        self.assertEqual(self.effect(self.run_id)["status"], "unknown")
        self.assertNotIn("reconciled", self.events(key))

    def test_before_the_grace_or_for_a_tool_nobody_made_reconcilable_it_pauses(self) -> None:
        bank = Bank()
        for tool in (self.tool(grace="1 hour"), self.tool(grace=None)):
            self.run_id = f"pyrec-{uuid.uuid4()}"
            key = self.lost_mid_payment(tool, bank, {"amount": 40}, paid=False)
            ledger = self.worker()
            with ledger.attempt(self.run_id):
                with self.assertRaises(EffectPaused):
                    ledger.tool(tool, reconcile=bank.lookup)(bank.pay)(self.run_id, {"amount": 40})
            self.assertEqual(self.effect(self.run_id)["status"], "unknown")
            self.assertNotIn(key + "#2", bank.payments)
            self.assertNotIn("reconciled", self.events(key))
        # the provider is not even asked: a lookup before the grace may miss a request
        # still in flight
        self.assertEqual(bank.lookups, [])

    def test_a_finding_the_ledger_cannot_record_stops_the_attempt(self) -> None:
        # reconcile_effect fails (here: evidence PostgreSQL cannot store, 22P05; a lost
        # connection is the same): the pause stands, and the attempt goes no further
        tool, bank = self.tool(), Bank()
        key = self.lost_mid_payment(tool, bank, {"amount": 60}, paid=True)
        ledger = self.worker()
        mails: List[str] = []

        def unstorable(k: str, args: Any) -> Optional[Finding]:
            return Happened({"memo": "paid\u0000"})

        with ledger.attempt(self.run_id):
            with self.assertRaises(psycopg.Error):
                ledger.guarded(self.run_id, tool, {"amount": 60}, bank.pay, reconcile=unstorable)
            with self.assertRaises(EffectPaused) as stopped:
                ledger.guarded(self.run_id, "mail.send", {"to": "customer"}, mails.append)
        self.assertEqual(stopped.exception.key, key)
        self.assertEqual(mails, [])
        self.assertEqual(self.effect(self.run_id)["status"], "unknown")

    def test_a_token_attempt_reconciles_on_a_pool(self) -> None:
        from psycopg_pool import ConnectionPool
        tool, bank = self.tool(), Bank()
        key = self.lost_mid_payment(tool, bank, {"amount": 50}, paid=True)
        pool = ConnectionPool(DSN, min_size=2, max_size=2, kwargs={"autocommit": True})
        self.addCleanup(pool.close)
        ledger = Ledger(pool)
        with ledger.token_attempt(self.run_id, ttl=30):
            result = ledger.guarded(self.run_id, tool, {"amount": 50},
                                    lambda k: bank.pay({"amount": 50}, k),
                                    reconcile=bank.lookup)
        self.assertEqual(result["payment_id"], "pay-1")
        self.assertEqual(len(bank.payments), 1)
        self.assertEqual(self.events(key)[-2:], ["reconciled", "replay"])


class AsyncReconcileTest(Base, unittest.IsolatedAsyncioTestCase):

    def setUp(self) -> None:
        self.run_id = f"pyrec-async-{uuid.uuid4()}"
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(self.admin.close)

    async def test_an_async_lookup_settles_both_ways(self) -> None:
        pool = AsyncConnectionPool(DSN, min_size=2, max_size=2, kwargs={"autocommit": True})
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=PATIENCE)
        ledger = AsyncLedger(pool)
        bank = Bank()

        async def lookup(key: str, args: Any) -> Optional[Finding]:
            await asyncio.sleep(0)
            return bank.lookup(key, args)

        for paid in (True, False):
            tool = self.tool()
            self.run_id = f"pyrec-async-{uuid.uuid4()}"
            started: List[str] = []

            async def hangs(key: str) -> Any:
                started.append(key)
                if paid:
                    bank.payments[key] = {"payment_id": "pay-lost"}
                await asyncio.sleep(PATIENCE)

            async with ledger.token_attempt(self.run_id, ttl=30):
                call = asyncio.create_task(ledger.guarded(self.run_id, tool, {"n": 1}, hangs))
                while not started:
                    await asyncio.sleep(0.01)
                call.cancel()  # the worker gives up on the bank: the outcome is unknown
                with self.assertRaises(asyncio.CancelledError):
                    await call
            async with ledger.token_attempt(self.run_id, ttl=30):
                result = await ledger.guarded(
                    self.run_id, tool, {"n": 1},
                    lambda k: {"payment_id": f"pay-new-{k}"}, reconcile=lookup)
            if paid:
                self.assertEqual(result, {"payment_id": "pay-lost"})
                self.assertEqual(self.effect(self.run_id)["attempt"], 1)
            else:
                self.assertEqual(result, {"payment_id": f"pay-new-{started[0]}#2"})
                self.assertEqual(self.effect(self.run_id)["attempt"], 2)
            self.assertEqual(self.effect(self.run_id)["status"], "completed")
            self.assertIn("reconciled", self.events(started[0]))

    async def test_a_finding_the_ledger_cannot_record_stops_the_attempt(self) -> None:
        pool = AsyncConnectionPool(DSN, min_size=1, max_size=2, kwargs={"autocommit": True})
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=PATIENCE)
        ledger = AsyncLedger(pool)
        tool = self.tool()
        started: List[str] = []

        async def hangs(key: str) -> Any:
            started.append(key)
            await asyncio.sleep(PATIENCE)

        async with ledger.token_attempt(self.run_id, ttl=30):
            call = asyncio.create_task(ledger.guarded(self.run_id, tool, {"n": 2}, hangs))
            while not started:
                await asyncio.sleep(0.01)
            call.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await call

        async def unstorable(key: str, args: Any) -> Optional[Finding]:
            return Happened({"memo": "paid\u0000"})

        mails: List[str] = []
        async with ledger.token_attempt(self.run_id, ttl=30):
            with self.assertRaises(psycopg.Error):
                await ledger.guarded(self.run_id, tool, {"n": 2}, hangs, reconcile=unstorable)
            with self.assertRaises(EffectPaused):
                await ledger.guarded(self.run_id, "mail.send", {"to": "customer"}, mails.append)
        self.assertEqual(mails, [])
        self.assertEqual(self.effect(self.run_id)["status"], "unknown")


if __name__ == "__main__":
    unittest.main()
