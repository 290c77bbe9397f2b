"""Tests of the Python clients' local effects (``Ledger.local``, ``AsyncLedger.local``)
against a real server: an effect that is a write in the ledger's own database, made in
one transaction with its intent and its outcome (``begin_local``).

DURABLE_LEDGER_DSN must be a superuser connection string of a database with the
extension.

    DURABLE_LEDGER_DSN="dbname=postgres" /usr/bin/python3 -m unittest -v test_local
"""

from __future__ import annotations

import os
import sys
import unittest
import uuid
from typing import Any, List, Optional, Tuple

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # clients/python, if PYTHONPATH lacks it

from durable_ledger import (  # noqa: E402
    AsyncLedger,
    AttemptStopped,
    EffectDidNotHappen,
    EffectFailed,
    EffectPaused,
    Ledger,
)

from target import ADMIN_DSN, DSN  # noqa: E402  (where the connections go)
ORDERS = "durable_ledger_pytest_orders"


def setUpModule() -> None:
    if not DSN:
        raise unittest.SkipTest("DURABLE_LEDGER_DSN is not set")
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {ORDERS} (id serial PRIMARY KEY, run text, "
                     f"item text, ledger_key text)")
        # a constraint checked at COMMIT, which a test uses to end its backend right there
        conn.execute(f"""
            CREATE OR REPLACE FUNCTION {ORDERS}_end_backend() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.item = 'end the backend at commit' THEN
                    PERFORM pg_terminate_backend(pg_backend_pid());
                    PERFORM pg_sleep(30);  -- the signal ends it meanwhile
                END IF;
                RETURN NULL;
            END $$""")
        conn.execute(f"DROP TRIGGER IF EXISTS end_backend ON {ORDERS}")
        conn.execute(f"CREATE CONSTRAINT TRIGGER end_backend AFTER INSERT ON {ORDERS} "
                     f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                     f"EXECUTE FUNCTION {ORDERS}_end_backend()")


def order(item: str) -> Any:
    """A local effect's write: an order row, and its id as the result."""
    def write(conn: "psycopg.Connection[Any]", key: str) -> Any:
        row = conn.execute(f"INSERT INTO {ORDERS} (run, item, ledger_key) "
                           f"VALUES (current_setting('application_name'), %s, %s) "
                           f"RETURNING id", (item, key)).fetchone()
        assert row is not None
        return {"order": row[0], "item": item}
    return write


class LocalTest(unittest.TestCase):

    def setUp(self) -> None:
        self.run_id = f"pylocal-{uuid.uuid4()}"
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(self.admin.close)

    def pool(self, size: int = 2) -> ConnectionPool:
        pool = ConnectionPool(DSN, min_size=size, max_size=size,  # type: ignore[arg-type]
                              kwargs={"autocommit": True, "application_name": self.run_id})
        self.addCleanup(pool.close)
        pool.wait(timeout=30)
        return pool

    def connect(self) -> "psycopg.Connection[Any]":
        conn = psycopg.connect(DSN, autocommit=True,  # type: ignore[arg-type]
                               application_name=self.run_id)
        self.addCleanup(conn.close)
        return conn

    def orders(self) -> List[Tuple[Any, ...]]:
        return self.admin.execute(f"SELECT item, ledger_key FROM {ORDERS} WHERE run = %s "
                                  f"ORDER BY id", (self.run_id,)).fetchall()

    def effects(self) -> List[Tuple[Any, ...]]:
        """(tool, occurrence, attempt, status, local) of the run's effects, in order."""
        return self.admin.execute(
            "SELECT tool, occurrence, attempt, status::text, local FROM durable_ledger.effects"
            " WHERE run = %s ORDER BY created_at", (self.run_id,)).fetchall()

    # ------------------------------------------------------------------ tests

    def test_the_write_and_its_outcome_commit_together_and_replay(self) -> None:
        ledger = Ledger(self.pool())
        written: List[str] = []

        def write(conn: Any, key: str) -> Any:
            written.append(key)
            return order("tea")(conn, key)

        with ledger.token_attempt(self.run_id):
            first = ledger.local(self.run_id, "shop.order", {"item": "tea"}, write)
        self.assertEqual(first["item"], "tea")
        self.assertEqual(self.effects(), [("shop.order", 1, 1, "completed", True)])
        self.assertEqual(self.orders(), [("tea", written[0])])
        # the next attempt replays the recorded result; the write is not made again
        with ledger.token_attempt(self.run_id):
            again = ledger.local(self.run_id, "shop.order", {"item": "tea"}, write)
        self.assertEqual(again, first)
        self.assertEqual(len(written), 1)
        self.assertEqual(len(self.orders()), 1)

    def test_on_a_session_attempt_on_one_connection(self) -> None:
        conn = self.connect()
        ledger = Ledger(conn)
        with ledger.attempt(self.run_id):
            result = ledger.local(self.run_id, "shop.order", {"item": "jam"}, order("jam"))
            # the connection is the Ledger's again, idle, and the lease still works
            self.assertEqual(conn.info.transaction_status.name, "IDLE")
            self.assertEqual(ledger.guarded(self.run_id, "mail.send", {"to": "a"},
                                            lambda key: {"sent": True}), {"sent": True})
        self.assertEqual(result["item"], "jam")
        self.assertEqual([row[3:] for row in self.effects()],
                         [("completed", True), ("completed", False)])

    def test_a_refusal_rolls_the_writes_back_and_records_the_failure(self) -> None:
        ledger = Ledger(self.pool())

        def out_of_stock(conn: Any, key: str) -> Any:
            order("ink")(conn, key)  # written, then refused: rolled back to the savepoint
            raise EffectDidNotHappen({"out_of_stock": True})

        with ledger.token_attempt(self.run_id):
            with self.assertRaises(EffectFailed) as caught:
                ledger.local(self.run_id, "shop.order", {"item": "ink"}, out_of_stock)
        self.assertFalse(caught.exception.replayed)
        self.assertEqual(self.effects(), [("shop.order", 1, 1, "failed", True)])
        self.assertEqual(self.orders(), [])
        with ledger.token_attempt(self.run_id):
            with self.assertRaises(EffectFailed) as again:
                ledger.local(self.run_id, "shop.order", {"item": "ink"}, out_of_stock)
        self.assertTrue(again.exception.replayed)
        self.assertEqual(again.exception.error, {"out_of_stock": True})

    def test_an_error_of_the_write_leaves_nothing_and_the_attempt_goes_on(self) -> None:
        ledger = Ledger(self.pool())
        tries: List[str] = []

        def flaky(conn: Any, key: str) -> Any:
            tries.append(key)
            result = order("cup")(conn, key)
            if len(tries) == 1:
                raise RuntimeError("the tool's bug")
            return result

        with ledger.token_attempt(self.run_id):
            with self.assertRaises(RuntimeError):
                ledger.local(self.run_id, "shop.order", {"item": "cup"}, flaky)
            self.assertEqual(self.effects(), [])
            self.assertEqual(self.orders(), [])
            # nothing happened: the same call in the same attempt is occurrence 1 again
            ledger.local(self.run_id, "shop.order", {"item": "cup"}, flaky)
        self.assertEqual(tries[0], tries[1])
        self.assertEqual(self.effects(), [("shop.order", 1, 1, "completed", True)])
        self.assertEqual(self.orders(), [("cup", tries[0])])

    def test_a_pause_commits_what_begin_local_found(self) -> None:
        # an effect begun with begin_effect whose worker died: begin_local of the same
        # call finds it unknown and pauses; that finding is committed, for a person
        ledger = Ledger(self.pool())
        with self.assertRaises(RuntimeError):
            with ledger.token_attempt(self.run_id):
                ledger.guarded(self.run_id, "shop.order", {"item": "pen"},
                               lambda key: (_ for _ in ()).throw(RuntimeError("died")))
        written: List[str] = []
        with ledger.token_attempt(self.run_id):
            with self.assertRaises(EffectPaused):
                ledger.local(self.run_id, "shop.order", {"item": "pen"},
                             lambda conn, key: written.append(key))
        self.assertEqual(written, [])
        self.assertEqual(self.effects(), [("shop.order", 1, 1, "unknown", False)])
        listed = self.admin.execute("SELECT count(*) FROM durable_ledger.unresolved "
                                    "WHERE run = %s", (self.run_id,)).fetchone()
        self.assertEqual(listed, (1,))

    def test_a_commit_whose_answer_is_lost_stops_the_attempt(self) -> None:
        # the backend ends at COMMIT (a deferred trigger terminates it): the client cannot
        # know whether the transaction committed, so the attempt stops without a person;
        # it did not commit, and the next attempt executes the effect once
        ledger = Ledger(self.pool())
        item = "end the backend at commit"
        with ledger.token_attempt(self.run_id):
            with self.assertRaises(psycopg.OperationalError):
                ledger.local(self.run_id, "shop.order", {"item": "x"}, order(item))
            with self.assertRaises(AttemptStopped):
                ledger.local(self.run_id, "shop.order", {"item": "x"}, order("y"))
        self.assertEqual(self.effects(), [])
        self.assertEqual(self.orders(), [])
        with ledger.token_attempt(self.run_id):
            ledger.local(self.run_id, "shop.order", {"item": "x"}, order("y"))
        self.assertEqual(self.effects(), [("shop.order", 1, 1, "completed", True)])
        self.assertEqual([item for item, _ in self.orders()], ["y"])


class AsyncLocalTest(unittest.IsolatedAsyncioTestCase):

    def setUp(self) -> None:
        self.run_id = f"pylocal-async-{uuid.uuid4()}"
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True)  # type: ignore[arg-type]
        self.addCleanup(self.admin.close)

    async def pool(self, size: int = 2) -> AsyncConnectionPool:
        pool = AsyncConnectionPool(DSN, min_size=size, max_size=size,  # type: ignore[arg-type]
                                   kwargs={"autocommit": True, "application_name": self.run_id})
        self.addAsyncCleanup(pool.close)
        await pool.wait(timeout=30)
        return pool

    def orders(self) -> List[Tuple[Any, ...]]:
        return self.admin.execute(f"SELECT item FROM {ORDERS} WHERE run = %s ORDER BY id",
                                  (self.run_id,)).fetchall()

    def effects(self) -> List[Tuple[Any, ...]]:
        return self.admin.execute(
            "SELECT occurrence, attempt, status::text, local FROM durable_ledger.effects"
            " WHERE run = %s ORDER BY created_at", (self.run_id,)).fetchall()

    @staticmethod
    def order(item: str, fail: Optional[BaseException] = None) -> Any:
        async def write(conn: "psycopg.AsyncConnection[Any]", key: str) -> Any:
            cur = await conn.execute(f"INSERT INTO {ORDERS} (run, item, ledger_key) "
                                     f"VALUES (current_setting('application_name'), %s, %s) "
                                     f"RETURNING id", (item, key))
            row = await cur.fetchone()
            if fail is not None:
                raise fail
            return {"order": row[0] if row else None}
        return write

    async def test_execute_replay_refusal_and_error(self) -> None:
        ledger = AsyncLedger(await self.pool())
        async with ledger.token_attempt(self.run_id):
            first = await ledger.local(self.run_id, "shop.order", {"item": "tea"},
                                       self.order("tea"))
            with self.assertRaises(EffectFailed):
                await ledger.local(self.run_id, "shop.order", {"item": "ink"},
                                   self.order("ink", EffectDidNotHappen({"stock": 0})))
            with self.assertRaises(RuntimeError):
                await ledger.local(self.run_id, "shop.order", {"item": "cup"},
                                   self.order("cup", RuntimeError("bug")))
        self.assertEqual(self.orders(), [("tea",)])
        self.assertEqual(self.effects(), [(1, 1, "completed", True), (1, 1, "failed", True)])
        async with ledger.token_attempt(self.run_id):
            again = await ledger.local(self.run_id, "shop.order", {"item": "tea"},
                                       self.order("tea"))
        self.assertEqual(again, first)
        self.assertEqual(self.orders(), [("tea",)])

    async def test_a_commit_whose_answer_is_lost_stops_the_attempt(self) -> None:
        ledger = AsyncLedger(await self.pool())
        async with ledger.token_attempt(self.run_id):
            with self.assertRaises(psycopg.OperationalError):
                await ledger.local(self.run_id, "shop.order", {"item": "x"},
                                   self.order("end the backend at commit"))
            with self.assertRaises(AttemptStopped):
                await ledger.local(self.run_id, "shop.order", {"item": "x"}, self.order("y"))
        self.assertEqual(self.effects(), [])


if __name__ == "__main__":
    unittest.main()
