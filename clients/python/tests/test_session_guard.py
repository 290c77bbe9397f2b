"""A session attempt checks, in the very statement of each call, that the call reached the
session that holds the attempt's lease (``session_epoch``, extension 1.3), so that a
transaction pooler between client and database is caught before anything is performed:
`PoolerDetected` (a `LeaseLost`), the attempt stopped, and the lease ended where it was
taken (``release_attempt``) so that no other client of the pooler meets the lock.  Through
Debian's PgBouncer in ``pool_mode = transaction``, with `Ledger` and `AsyncLedger`; and,
directly, a lease dropped on the attempt's own connection (`LeaseLost`) and a release
that may not end the backend holding the lease (a WARNING that says what happens).

DURABLE_LEDGER_DSN must be a superuser connection string of a database with the extension
at version 1.3; DURABLE_LEDGER_PGBOUNCER_DSN one of the same database through PgBouncer
with ``pool_mode = transaction`` and a ``default_pool_size`` of 2 or more
(test/apps/030_python_client.pl starts one).
"""

from __future__ import annotations

import os
import sys
import time
import unittest
import uuid
from typing import Tuple, Any, Callable, List, Optional

import psycopg
from psycopg import sql

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # clients/python, if PYTHONPATH lacks it

from durable_ledger import (  # noqa: E402
    AsyncLedger,
    LeaseLost,
    Ledger,
    PoolerDetected,
)

from target import (ADMIN_DSN, DSN, THROUGH_PROXY, drop_leases, drop_leases_async,  # noqa: E402
                    ledger_backend)
BOUNCER_DSN = os.environ.get("DURABLE_LEDGER_PGBOUNCER_DSN")
#: How long a test waits for a state it polls for before it gives up.
PATIENCE = 30.0


def setUpModule() -> None:
    if not DSN:
        raise unittest.SkipTest("DURABLE_LEDGER_DSN is not set")


def wait_for(condition: Callable[[], bool], timeout: float = PATIENCE) -> bool:
    """Polls ``condition()`` until it is true; False if ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Guarded:
    """What the tests share: the admin's view of the run, a blocker through PgBouncer."""

    admin: "psycopg.Connection[Any]"
    run_id: str

    def start(self) -> None:
        self.run_id = f"pyguard-{uuid.uuid4()}"
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(self.admin.close)  # type: ignore[attr-defined]
        self.sent: List[str] = []

    def perform(self, key: str) -> Any:
        self.sent.append(key)
        return {"paid": len(self.sent)}

    def bouncer(self, **kwargs: Any) -> "psycopg.Connection[Any]":
        if not BOUNCER_DSN:
            self.skipTest("DURABLE_LEDGER_PGBOUNCER_DSN is not set")  # type: ignore[attr-defined]
        kwargs.setdefault("autocommit", True)
        conn = psycopg.connect(BOUNCER_DSN, application_name="durable-ledger-pytest", **kwargs)
        self.addCleanup(conn.close)  # type: ignore[attr-defined]
        return conn

    def holder(self, run: str) -> Optional[int]:
        """The backend whose session holds the run's session lease (the leases view)."""
        row = self.admin.execute("SELECT holder_pid FROM durable_ledger.leases"
                                 " WHERE run = %s AND kind = 'session'", (run,)).fetchone()
        return None if row is None else int(row[0])

    def epoch_held(self, run: str) -> Optional[int]:
        row = self.admin.execute("SELECT lease_epoch FROM durable_ledger.leases WHERE run = %s",
                                 (run,)).fetchone()
        return None if row is None else int(row[0])

    def occupy(self, pid: int) -> Tuple["psycopg.Connection[Any]", int]:
        """Another client of the pooler, with a transaction open on the server connection
        that holds the lease of backend ``pid`` (the leases view's holder): the pooler must
        send every other transaction elsewhere.  Returns it and that server connection's
        pid (``pid`` itself, or through a proxy, the proxy's backend whose connection to
        the shard ``pid`` is)."""
        blocker = self.bouncer(autocommit=False)
        deadline = time.monotonic() + PATIENCE
        while ledger_backend(blocker, self.run_id) != pid:
            blocker.rollback()  # the next transaction goes to another server connection
            if time.monotonic() > deadline:
                self.fail(f"PgBouncer never gave the blocker server connection {pid}")  # type: ignore[attr-defined]
        return blocker, int(blocker.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]

    def effects(self, run: str) -> int:
        return int(self.admin.execute("SELECT count(*) FROM durable_ledger.effects WHERE run = %s",
                                      (run,)).fetchone()[0])  # type: ignore[index]

    def events(self, run: str) -> List[str]:
        return [r[0] for r in self.admin.execute(
            "SELECT event::text FROM durable_ledger.audit_log WHERE run = %s ORDER BY id", (run,))]

    def locks_of(self, pid: int) -> int:
        return int(self.admin.execute("SELECT count(*) FROM pg_locks WHERE pid = %s"
                                      " AND locktype = 'advisory'", (pid,)).fetchone()[0])  # type: ignore[index]

    def gone(self, pid: int) -> bool:
        return self.admin.execute("SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s)",
                                  (pid,)).fetchone()[0]  # type: ignore[index,no-any-return]

    def assert_free(self, run: str, pid: int) -> None:
        """The run is free: the lock is gone from pg_locks, and a worker connecting
        directly takes the run at once."""
        self.assertTrue(wait_for(lambda: self.holder(run) is None and self.locks_of(pid) == 0),  # type: ignore[attr-defined]
                        f"backend {pid} still holds run {run}")
        with psycopg.connect(DSN, autocommit=True) as direct:  # type: ignore[arg-type]
            self.assertTrue(direct.execute(  # type: ignore[attr-defined]
                "SELECT durable_ledger.acquire_run(%s, wait => false)", (run,)).fetchone()[0])
            direct.execute("SELECT durable_ledger.release_run(%s)", (run,))

    def assert_detected(self, caught: PoolerDetected, pid: int, epoch: int) -> None:
        self.assertIsInstance(caught, LeaseLost)  # type: ignore[attr-defined]
        self.assertEqual((caught.run, caught.epoch, caught.pid), (self.run_id, epoch, pid))  # type: ignore[attr-defined]
        message = str(caught)
        for words in ("another server connection", "transaction pooler", "token_attempt",
                      "Nothing was called"):
            self.assertIn(words, message)  # type: ignore[attr-defined]


class PoolerDetectedTest(Guarded, unittest.TestCase):

    def setUp(self) -> None:
        self.start()

    def test_a_session_attempt_through_a_transaction_pooler_stops_before_anything_is_performed(
            self) -> None:
        ledger = Ledger(self.bouncer())
        pay = ledger.tool("bank.pay")(lambda args, key: self.perform(key))
        with self.assertLogs("durable_ledger", level="WARNING") as logs:
            with ledger.attempt(self.run_id):
                pid = self.holder(self.run_id)
                assert pid is not None
                blocker, server = self.occupy(pid)  # the attempt's server connection is busy
                with self.assertRaises(PoolerDetected) as caught:
                    pay(self.run_id, {"invoice": "INV-9", "amount": 4200})
                self.assert_detected(caught.exception, server, 1)
                self.assertNotEqual(caught.exception.reached_pid, server)
                self.assertIsNone(caught.exception.reached_epoch)
                # nothing was called: no intent, no effect row, the bank not asked
                self.assertEqual((self.sent, self.effects(self.run_id)), ([], 0))
                self.assertEqual(self.events(self.run_id), ["lease_acquired"])
                # the attempt is stopped: its further calls raise, and perform nothing
                with self.assertRaises(PoolerDetected):
                    pay(self.run_id, {"invoice": "INV-10", "amount": 1})
                with self.assertRaises(PoolerDetected):
                    ledger.record(self.run_id, "model", {"q": 1}, lambda: "an answer")
                self.assertEqual((self.sent, self.effects(self.run_id)), ([], 0))
            # the end of the block could not reach the attempt's session either (the
            # blocker holds it): release_attempt ended the lease by ending that backend
        self.assertTrue(any("release_attempt ended the lease" in r.getMessage()
                            for r in logs.records), [r.getMessage() for r in logs.records])
        self.assertTrue(wait_for(lambda: self.gone(pid)))
        self.assert_free(self.run_id, pid)
        self.assertEqual(self.events(self.run_id)[:2], ["lease_acquired", "lease_broken"])
        self.assertEqual(self.effects(self.run_id), 0)
        if not THROUGH_PROXY:  # (through a proxy: the proxy's connection to the shard)
            with self.assertRaises(psycopg.OperationalError):  # its server connection was ended
                blocker.execute("SELECT 1")

    def test_a_server_connection_another_attempt_took_over(self) -> None:
        # Two clients of the pooler are handed the same server connection, and each takes
        # the run there (a job delivered twice): the first one's calls are refused, its end
        # leaves the second one's lease alone, and the second one's release frees the run.
        first, second = Ledger(self.bouncer()), Ledger(self.bouncer())
        with first.attempt(self.run_id):
            pid = self.holder(self.run_id)
            assert pid is not None
            first_server = [first._holds[self.run_id].pid]  # the server connection its lease is on
            self.assertTrue(wait_for(lambda: second.acquire_run(self.run_id, wait=False)),
                            "the second client never reached the first one's server connection")
            self.assertEqual((self.holder(self.run_id), self.epoch_held(self.run_id)), (pid, 2))
            with self.assertRaises(PoolerDetected) as caught:
                first.guarded(self.run_id, "bank.pay", {"invoice": "INV-9"}, self.perform)
            detected = caught.exception
            server = first_server[0]
            self.assertEqual((detected.run, detected.epoch, detected.pid), (self.run_id, 1, server))
            if detected.reached_pid == server:  # it reached the very server connection
                self.assertEqual(detected.reached_epoch, 2)
                self.assertIn("another attempt took its session over", str(detected))
            else:
                self.assertIn("another server connection", str(detected))
            self.assertIn("token_attempt", str(detected))
            self.assertEqual((self.sent, self.effects(self.run_id)), ([], 0))
        # the first attempt's end never ends a later attempt's lease
        self.assertEqual((self.holder(self.run_id), self.epoch_held(self.run_id)), (pid, 2))
        self.assertTrue(second.release_run(self.run_id))
        self.assert_free(self.run_id, pid)


class AsyncPoolerDetectedTest(Guarded, unittest.IsolatedAsyncioTestCase):

    def setUp(self) -> None:
        self.start()

    async def test_a_session_attempt_through_a_transaction_pooler_stops_before_anything_is_performed(
            self) -> None:
        if not BOUNCER_DSN:
            self.skipTest("DURABLE_LEDGER_PGBOUNCER_DSN is not set")
        conn = await psycopg.AsyncConnection.connect(BOUNCER_DSN, autocommit=True)
        self.addAsyncCleanup(conn.close)
        ledger = AsyncLedger(conn)

        @ledger.tool("bank.pay")
        async def pay(args: Any, key: str) -> Any:
            return self.perform(key)

        with self.assertLogs("durable_ledger", level="WARNING") as logs:
            async with ledger.attempt(self.run_id):
                pid = self.holder(self.run_id)
                assert pid is not None
                blocker, server = self.occupy(pid)
                with self.assertRaises(PoolerDetected) as caught:
                    await pay(self.run_id, {"invoice": "INV-9", "amount": 4200})
                self.assert_detected(caught.exception, server, 1)
                self.assertNotEqual(caught.exception.reached_pid, server)
                self.assertEqual((self.sent, self.effects(self.run_id)), ([], 0))
                with self.assertRaises(PoolerDetected):
                    await ledger.record(self.run_id, "model", {"q": 1}, lambda: "an answer")
                self.assertEqual(self.events(self.run_id), ["lease_acquired"])
        self.assertTrue(any("release_attempt ended the lease" in r.getMessage()
                            for r in logs.records), [r.getMessage() for r in logs.records])
        self.assertTrue(wait_for(lambda: self.gone(pid)))
        self.assert_free(self.run_id, pid)
        self.assertIn("lease_broken", self.events(self.run_id))
        self.assertEqual(self.effects(self.run_id), 0)
        blocker.close()


class LostOnItsConnectionTest(Guarded, unittest.TestCase):
    """Directly: a lease dropped on the attempt's own connection is `LeaseLost` (not a
    pooler), and a statement that reaches another connection is `PoolerDetected` however
    it got there."""

    def setUp(self) -> None:
        self.start()

    def test_a_lease_dropped_behind_the_ledgers_back_stops_the_attempt(self) -> None:
        ledger = Ledger(psycopg.connect(DSN, autocommit=True))  # type: ignore[arg-type]
        self.addCleanup(ledger.conn.close)  # type: ignore[union-attr]

        def reset(key: str) -> Any:
            assert ledger.conn is not None
            drop_leases(ledger.conn)  # pg_advisory_unlock_all(): a pooler's reset, say
            return self.perform(key)

        with ledger.attempt(self.run_id):
            self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1}, reset), {"paid": 1})
            with self.assertRaises(LeaseLost) as caught:
                ledger.guarded(self.run_id, "bank.pay", {"n": 2}, self.perform)
            self.assertNotIsInstance(caught.exception, PoolerDetected)
            self.assertEqual((caught.exception.run, caught.exception.epoch), (self.run_id, 1))
            self.assertIn("DISCARD ALL", str(caught.exception))
            with self.assertRaises(LeaseLost):  # stopped: no more calls in this attempt
                ledger.guarded(self.run_id, "bank.pay", {"n": 3}, self.perform)
        self.assertEqual((len(self.sent), self.effects(self.run_id)), (1, 1))
        self.assertEqual(self.holder(self.run_id), None)
        # the next attempt goes on, on the same connection
        with ledger.attempt(self.run_id):
            self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1}, self.perform),
                             {"paid": 1})  # replayed
            self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 2}, self.perform),
                             {"paid": 2})
        self.assertEqual(len(self.sent), 2)

    async def _async_case(self) -> None:
        conn = await psycopg.AsyncConnection.connect(DSN, autocommit=True)  # type: ignore[arg-type]
        ledger = AsyncLedger(conn)
        try:
            async def reset(key: str) -> Any:
                await drop_leases_async(conn)
                return self.perform(key)

            async with ledger.attempt(self.run_id):
                self.assertEqual(await ledger.guarded(self.run_id, "bank.pay", {"n": 1}, reset),
                                 {"paid": 1})
                with self.assertRaises(LeaseLost) as caught:
                    await ledger.guarded(self.run_id, "bank.pay", {"n": 2}, self.perform)
                self.assertNotIsInstance(caught.exception, PoolerDetected)
                self.assertEqual(caught.exception.epoch, 1)
            self.assertEqual((len(self.sent), self.effects(self.run_id)), (1, 1))
            self.assertIsNone(self.holder(self.run_id))
        finally:
            await conn.close()

    def test_async_a_lease_dropped_behind_the_ledgers_back_stops_the_attempt(self) -> None:
        import asyncio
        asyncio.run(self._async_case())

    def test_a_statement_on_another_connection_is_detected_and_the_release_ends_the_lease(
            self) -> None:
        # What a pooler does, made by hand: the Ledger's statements go to another session
        # (of the same role) after acquire_run.
        first = psycopg.connect(DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(first.close)
        ledger = Ledger(first)
        self.assertTrue(ledger.acquire_run(self.run_id))
        pid = first.info.backend_pid
        held = ledger_backend(first, self.run_id)  # the lease's holder: a proxy's shard backend, else pid
        other = psycopg.connect(DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(other.close)
        ledger.conn = other
        asked: List[str] = []
        with self.assertRaises(PoolerDetected) as caught:  # a recorded call is guarded too
            ledger.record(self.run_id, "model", {"q": 1}, lambda: asked.append("model"))
        self.assertEqual((caught.exception.pid, caught.exception.reached_pid),
                         (pid, other.info.backend_pid))
        with self.assertRaises(PoolerDetected):  # and the attempt is stopped
            ledger.guarded(self.run_id, "bank.pay", {"n": 1}, self.perform)
        self.assertEqual((asked, self.sent, self.effects(self.run_id)), ([], [], 0))
        with self.assertLogs("durable_ledger", level="WARNING"):
            self.assertTrue(ledger.release_run(self.run_id))  # by release_attempt
        self.assertTrue(wait_for(lambda: self.gone(held)))
        self.assert_free(self.run_id, held)
        self.assertIn("lease_broken", self.events(self.run_id))

    def test_a_release_that_may_not_end_the_holder_says_what_happens(self) -> None:
        # The lease is a superuser's session; the statement that ends the attempt reaches
        # a session of a worker role, which may not terminate a superuser's backend
        # (pg_terminate_backend's rule): release_attempt is refused with 42501, and the
        # client says where the lease stays and until when.
        role = f"dl_pyguard_{uuid.uuid4().hex[:12]}"
        self.admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE durable_ledger_worker").format(
            sql.Identifier(role)))
        self.addCleanup(self.admin.execute, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
        holder = psycopg.connect(DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(holder.close)
        ledger = Ledger(holder)
        self.assertTrue(ledger.acquire_run(self.run_id))
        pid = holder.info.backend_pid
        held = ledger_backend(holder, self.run_id)  # the lease's holder: a proxy's shard backend, else pid
        worker = psycopg.connect(DSN, autocommit=True, user=role)  # type: ignore[arg-type]
        ledger.conn = worker
        with self.assertLogs("durable_ledger", level="WARNING") as logs:
            self.assertFalse(ledger.release_run(self.run_id))
        worker.close()
        [warning] = [r for r in logs.records
                     if getattr(r, "durable_ledger", {}).get("event") == "lease_left_held"]
        message = warning.getMessage()
        for words in (f"stays held by server connection {pid} until that connection closes",
                      "server_lifetime", "server_idle_timeout", "durable_ledger.break_lease("):
            self.assertIn(words, message)
        self.assertEqual(warning.durable_ledger["sqlstate"], "42501")  # type: ignore[attr-defined]
        self.assertEqual(self.holder(self.run_id), held)  # as it says: still held there
        self.assertTrue(self.admin.execute("SELECT durable_ledger.break_lease(%s, 'test')",
                                           (self.run_id,)).fetchone()[0])
        self.assertTrue(wait_for(lambda: self.gone(held)))
        self.assert_free(self.run_id, held)


if __name__ == "__main__":
    unittest.main()
