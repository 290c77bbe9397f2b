"""The server's notices reach the application: every WARNING and NOTICE that a ledger
statement gets is logged through ``logging.getLogger("durable_ledger")`` (WARNING at
logging.WARNING, NOTICE at logging.INFO), the ledger's own warnings as structured records
(``record.durable_ledger``): a call executed although it diverges (01L01, with the key it
may duplicate), a tool nobody registered (01L02), a report kept as a conflict (01L03) --
on a single connection and on a pool, with `Ledger` and `AsyncLedger`.

DURABLE_LEDGER_DSN must be a superuser connection string of a database with the
extension at version 1.3 (the tests register tools under names of their own, and set the
unregistered-tools policy to 'warn' for a moment, setting it back).
"""

from __future__ import annotations

import logging
import os
import sys
import unittest
import uuid
from typing import Any, Dict, List, Optional

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # clients/python, if PYTHONPATH lacks it

from durable_ledger import AsyncLedger, Ledger, OutcomeNotRecorded  # noqa: E402
from durable_ledger import _protocol  # noqa: E402

from target import ADMIN_DSN, DSN  # noqa: E402  (where the connections go)


def setUpModule() -> None:
    if not DSN:
        raise unittest.SkipTest("DURABLE_LEDGER_DSN is not set")


def ledger_records(logs: Any, event: str) -> List[Dict[str, Any]]:
    """The structured records of ``event`` that assertLogs captured."""
    return [r.durable_ledger for r in logs.records
            if getattr(r, "durable_ledger", {}).get("event") == event]


class NoticeCases:
    """The cases, for each kind of ledger (the subclasses say how an attempt is made)."""

    admin: "psycopg.Connection[Any]"
    run_id: str
    tag: str

    def setUp(self) -> None:
        self.run_id = f"pynotice-{uuid.uuid4()}"
        self.tag = uuid.uuid4().hex[:12]
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(self.admin.close)  # type: ignore[attr-defined]

    def key(self, tool: str, args: Any, occurrence: int = 1) -> str:
        return self.admin.execute("SELECT durable_ledger.effect_key(%s, %s, %s, %s)",
                                  (self.run_id, tool, Jsonb(args), occurrence)).fetchone()[0]

    def bodies(self, tool: str) -> List[Any]:
        return [r[0] for r in self.admin.execute(
            "SELECT args FROM durable_ledger.effects WHERE run = %s AND tool = %s"
            " ORDER BY created_at", (self.run_id, tool))]

    def call(self, tool: str, args: Any, perform: Any) -> Any:
        """One attempt at the run that makes one call."""
        raise NotImplementedError

    # ---------------------------------------------------------------- 01L01

    def check_divergence_warning(self) -> None:
        tool = f"mail.send.{self.tag}"
        self.admin.execute("SELECT durable_ledger.register_tool(%s, 'test', divergence => 'warn')",
                           (tool,))
        self.call(tool, {"body": "Dear ACME, paid."}, lambda key: {"sent": 1})
        # the retry: the model reworded the email; the tool's policy is warn: it executes
        with self.assertLogs("durable_ledger", level="WARNING") as logs:  # type: ignore[attr-defined]
            self.call(tool, {"body": "Dear ACME, we paid."}, lambda key: {"sent": 2})
        [record] = ledger_records(logs, "divergence")
        self.assertEqual(record["sqlstate"], "01L01")  # type: ignore[attr-defined]
        self.assertEqual((record["run"], record["tool"]), (self.run_id, tool))  # type: ignore[attr-defined]
        self.assertEqual(record["key"], self.key(tool, {"body": "Dear ACME, we paid."}))  # type: ignore[attr-defined]
        self.assertEqual(record["may_duplicate"], self.key(tool, {"body": "Dear ACME, paid."}))  # type: ignore[attr-defined]
        [logged] = [r for r in logs.records if getattr(r, "durable_ledger", None) is record]
        self.assertEqual(logged.levelno, logging.WARNING)  # type: ignore[attr-defined]
        self.assertIn(record["may_duplicate"], logged.getMessage())  # type: ignore[attr-defined]
        self.assertIn("01L01", logged.getMessage())  # type: ignore[attr-defined]
        self.assertEqual(len(self.bodies(tool)), 2)  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- 01L02

    def check_unregistered_tool_warning(self) -> None:
        tool = f"crm.note.{self.tag}"
        previous = self.admin.execute(
            "SELECT durable_ledger.set_unregistered_tools('warn', 'test')").fetchone()[0]
        self.addCleanup(self.admin.execute,  # type: ignore[attr-defined]
                        "SELECT durable_ledger.set_unregistered_tools(%s, 'test')", (previous,))
        with self.assertLogs("durable_ledger", level="WARNING") as logs:  # type: ignore[attr-defined]
            self.call(tool, {"note": 1}, lambda key: {"noted": key})
        [record] = ledger_records(logs, "unregistered_tool")
        self.assertEqual((record["sqlstate"], record["run"], record["tool"], record["key"]),  # type: ignore[attr-defined]
                         ("01L02", self.run_id, tool, self.key(tool, {"note": 1})))
        self.assertIn(tool, record["message"])  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- 01L03

    def check_conflict_warning(self) -> None:
        tool = f"bank.pay.{self.tag}"
        webhook = psycopg.connect(DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(webhook.close)  # type: ignore[attr-defined]

        def pay(key: str) -> Any:
            # the bank's webhook records the payment as declined meanwhile; then the
            # payment's own report says it happened: a conflict, for a person
            webhook.execute("SELECT durable_ledger.fail_effect(%s, %s, 1)",
                            (key, Jsonb({"code": "webhook"})))
            return {"payment_id": "p-1"}

        with self.assertLogs("durable_ledger", level="WARNING") as logs:  # type: ignore[attr-defined]
            with self.assertRaises(OutcomeNotRecorded):  # type: ignore[attr-defined]
                self.call(tool, {"invoice": "INV-9"}, pay)
        [record] = ledger_records(logs, "conflict")
        self.assertEqual((record["sqlstate"], record["run"], record["key"]),  # type: ignore[attr-defined]
                         ("01L03", self.run_id, self.key(tool, {"invoice": "INV-9"})))
        self.assertTrue(self.admin.execute(  # type: ignore[attr-defined]
            "SELECT conflict FROM durable_ledger.effects WHERE key = %s",
            (record["key"],)).fetchone()[0])


class SingleConnectionNoticesTest(NoticeCases, unittest.TestCase):
    """`Ledger` on one connection, under session attempts."""

    def setUp(self) -> None:
        super().setUp()
        conn = psycopg.connect(DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(conn.close)
        self.ledger = Ledger(conn)

    def call(self, tool: str, args: Any, perform: Any) -> Any:
        with self.ledger.attempt(self.run_id):
            return self.ledger.guarded(self.run_id, tool, args, perform)

    def test_a_divergence_warning_is_a_structured_log_record(self) -> None:
        self.check_divergence_warning()

    def test_an_unregistered_tool_warning_is_logged(self) -> None:
        self.check_unregistered_tool_warning()

    def test_a_conflicting_report_is_logged(self) -> None:
        self.check_conflict_warning()

    def test_a_decorated_tool_and_a_read_log_too(self) -> None:
        # the decorator goes through guarded; a warning that comes with effect_status
        # (none does today) would be logged as well: the read is watched like any statement
        tool = f"mail.send.{self.tag}"
        self.admin.execute("SELECT durable_ledger.register_tool(%s, 'test', divergence => 'warn')",
                           (tool,))
        send = self.ledger.tool(tool)(lambda args, key: {"sent": args["body"]})
        with self.ledger.attempt(self.run_id):
            send(self.run_id, {"body": "a"})
        with self.assertLogs("durable_ledger", level="WARNING") as logs:
            with self.ledger.attempt(self.run_id):
                self.assertEqual(send(self.run_id, {"body": "b"}), {"sent": "b"})
        [record] = ledger_records(logs, "divergence")
        self.assertEqual(record["may_duplicate"], self.key(tool, {"body": "a"}))
        self.assertEqual(self.ledger.effect_status(record["key"])["status"], "completed")  # type: ignore[index]
        self.assertEqual(self.ledger.conn._notice_handlers, [])  # type: ignore[union-attr]


class PoolNoticesTest(NoticeCases, unittest.TestCase):
    """`Ledger` on a psycopg_pool.ConnectionPool, under token attempts."""

    def setUp(self) -> None:
        super().setUp()
        self.pool = ConnectionPool(DSN, min_size=2, max_size=2,  # type: ignore[arg-type]
                                   kwargs={"autocommit": True})
        self.addCleanup(self.pool.close)
        self.pool.wait(timeout=30)
        self.ledger = Ledger(self.pool)

    def call(self, tool: str, args: Any, perform: Any) -> Any:
        with self.ledger.token_attempt(self.run_id, ttl=30):
            return self.ledger.guarded(self.run_id, tool, args, perform)

    def tearDown(self) -> None:
        # one handler per statement, removed after it: the pooled connections keep none
        for _ in range(2):
            with self.pool.connection() as conn:
                self.assertEqual(conn._notice_handlers, [])

    def test_a_divergence_warning_is_a_structured_log_record(self) -> None:
        self.check_divergence_warning()

    def test_an_unregistered_tool_warning_is_logged(self) -> None:
        self.check_unregistered_tool_warning()

    def test_a_conflicting_report_is_logged(self) -> None:
        self.check_conflict_warning()

    def test_a_factory_logs_too(self) -> None:
        conns: List["psycopg.Connection[Any]"] = []

        def connect() -> "psycopg.Connection[Any]":
            conn = psycopg.connect(DSN, autocommit=True)  # type: ignore[arg-type]
            conns.append(conn)
            return conn

        self.ledger = Ledger(connect)
        self.check_unregistered_tool_warning()
        self.assertGreater(len(conns), 1)


class AsyncSingleConnectionNoticesTest(unittest.IsolatedAsyncioTestCase):
    """`AsyncLedger` on one AsyncConnection (session attempts) and on an
    AsyncConnectionPool (token attempts)."""

    def setUp(self) -> None:
        self.run_id = f"pynotice-async-{uuid.uuid4()}"
        self.tag = uuid.uuid4().hex[:12]
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(self.admin.close)

    key = NoticeCases.key

    async def ledgers(self) -> Dict[str, AsyncLedger]:
        conn = await psycopg.AsyncConnection.connect(DSN, autocommit=True)  # type: ignore[arg-type]
        self.addAsyncCleanup(conn.close)
        pool = AsyncConnectionPool(DSN, min_size=2, max_size=2,  # type: ignore[arg-type]
                                   kwargs={"autocommit": True})
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=30)
        self.pool = pool
        return {"connection": AsyncLedger(conn), "pool": AsyncLedger(pool)}

    async def acall(self, ledger: AsyncLedger, run: str, tool: str, args: Any,
                    perform: Any) -> Any:
        if ledger.conn is not None:
            async with ledger.attempt(run):
                return await ledger.guarded(run, tool, args, perform)
        async with ledger.token_attempt(run, ttl=30):
            return await ledger.guarded(run, tool, args, perform)

    async def no_handlers_left(self, ledgers: Dict[str, AsyncLedger]) -> None:
        assert ledgers["connection"].conn is not None
        self.assertEqual(ledgers["connection"].conn._notice_handlers, [])
        for _ in range(2):
            async with self.pool.connection() as conn:
                self.assertEqual(conn._notice_handlers, [])

    async def test_a_divergence_warning_is_a_structured_log_record(self) -> None:
        ledgers = await self.ledgers()
        tool = f"mail.send.{self.tag}"
        self.admin.execute("SELECT durable_ledger.register_tool(%s, 'test', divergence => 'warn')",
                           (tool,))
        for kind, ledger in ledgers.items():
            with self.subTest(kind):
                run = f"{self.run_id}-{kind}"

                async def send(key: str) -> Any:
                    return {"sent": key}

                await self.acall(ledger, run, tool, {"body": "a"}, send)
                with self.assertLogs("durable_ledger", level="WARNING") as logs:
                    await self.acall(ledger, run, tool, {"body": "b"}, send)
                [record] = ledger_records(logs, "divergence")
                key = lambda args: self.admin.execute(  # noqa: E731
                    "SELECT durable_ledger.effect_key(%s, %s, %s, 1)",
                    (run, tool, Jsonb(args))).fetchone()[0]
                self.assertEqual((record["sqlstate"], record["run"], record["tool"]),
                                 ("01L01", run, tool))
                self.assertEqual(record["key"], key({"body": "b"}))
                self.assertEqual(record["may_duplicate"], key({"body": "a"}))
        await self.no_handlers_left(ledgers)

    async def test_an_unregistered_tool_warning_is_logged(self) -> None:
        ledgers = await self.ledgers()
        tool = f"crm.note.{self.tag}"
        previous = self.admin.execute(
            "SELECT durable_ledger.set_unregistered_tools('warn', 'test')").fetchone()[0]
        self.addCleanup(self.admin.execute,
                        "SELECT durable_ledger.set_unregistered_tools(%s, 'test')", (previous,))
        for kind, ledger in ledgers.items():
            with self.subTest(kind):
                run = f"{self.run_id}-{kind}"
                with self.assertLogs("durable_ledger", level="WARNING") as logs:
                    await self.acall(ledger, run, tool, {"note": 1}, lambda key: {"noted": 1})
                [record] = ledger_records(logs, "unregistered_tool")
                self.assertEqual((record["sqlstate"], record["run"], record["tool"]),
                                 ("01L02", run, tool))
                self.assertEqual(record["key"], self.admin.execute(
                    "SELECT durable_ledger.effect_key(%s, %s, %s, 1)",
                    (run, tool, Jsonb({"note": 1}))).fetchone()[0])
        await self.no_handlers_left(ledgers)

    async def test_a_conflicting_report_is_logged(self) -> None:
        ledgers = await self.ledgers()
        tool = f"bank.pay.{self.tag}"
        for kind, ledger in ledgers.items():
            with self.subTest(kind):
                run = f"{self.run_id}-{kind}"

                async def pay(key: str) -> Any:
                    self.admin.execute("SELECT durable_ledger.fail_effect(%s, %s, 1)",
                                       (key, Jsonb({"code": "webhook"})))
                    return {"payment_id": "p-1"}

                with self.assertLogs("durable_ledger", level="WARNING") as logs:
                    with self.assertRaises(OutcomeNotRecorded):
                        await self.acall(ledger, run, tool, {"invoice": "INV-9"}, pay)
                [record] = ledger_records(logs, "conflict")
                self.assertEqual((record["sqlstate"], record["run"]), ("01L03", run))
                self.assertTrue(self.admin.execute(
                    "SELECT conflict FROM durable_ledger.effects WHERE key = %s",
                    (record["key"],)).fetchone()[0])
        await self.no_handlers_left(ledgers)


class NoticeLevelsTest(unittest.TestCase):
    """How a notice's severity maps onto a log level (no database needed)."""

    def diag(self, severity: str, sqlstate: str, detail: Optional[str] = None) -> Any:
        return _protocol.Notice(severity, sqlstate, f"a {severity.lower()}", detail, None)

    def test_warning_at_warning_notice_at_info(self) -> None:
        about = _protocol.About("run-1", "t", None, from_row=True)
        with self.assertLogs("durable_ledger", level="DEBUG") as logs:
            _protocol.log_notices([self.diag("WARNING", "01000"), self.diag("NOTICE", "00000"),
                                   self.diag("WARNING", "01L04")],
                                  about, [{"key": "k-1", "run": "run-1"}])
        self.assertEqual([r.levelno for r in logs.records],
                         [logging.WARNING, logging.INFO, logging.WARNING])
        self.assertEqual([r.durable_ledger["event"] for r in logs.records],  # type: ignore[attr-defined]
                         ["notice", "notice", "superseded_report"])
        self.assertEqual({(r.durable_ledger["run"], r.durable_ledger["key"])  # type: ignore[attr-defined]
                          for r in logs.records}, {("run-1", "k-1")})


if __name__ == "__main__":
    unittest.main()
