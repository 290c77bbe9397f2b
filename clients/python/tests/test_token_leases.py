"""Tests of the Python client's token-lease mode (``Ledger.token_attempt``) against a real
server: calls of one attempt on different connections and backends, through a
psycopg_pool, a connection factory, and PgBouncer in transaction mode; renewal across a
slow tool; a lease broken by an admin, lost while a tool runs, or expired; the attempt
that retries it.

DURABLE_LEDGER_DSN must be a superuser connection string of a database with the
extension; DURABLE_LEDGER_PGBOUNCER_DSN one of the same database through PgBouncer with
``pool_mode = transaction`` (test/apps/030_python_client.pl starts one).

    DURABLE_LEDGER_DSN="dbname=postgres" DURABLE_LEDGER_PGBOUNCER_DSN="port=6432 dbname=postgres" \\
        /usr/bin/python3 -m unittest discover -v -s clients/python/tests
"""

from __future__ import annotations

import contextvars
import os
import queue
import random
import subprocess
import sys
import threading
import time
import unittest
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # clients/python, if PYTHONPATH lacks it

from durable_ledger import (  # noqa: E402
    EffectPaused,
    InvalidArgument,
    LeaseLost,
    Ledger,
    LedgerError,
    LedgerUsageError,
    RunBusy,
    TokenLease,
)

#: How long a test waits for a state it polls for before it gives up.
PATIENCE = 30.0


def wait_for(condition: Any, what: str, timeout: float = PATIENCE) -> bool:
    """Poll ``condition()`` until it is true; False if ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True

from target import ADMIN_DSN, CLIENT_DB, DSN  # noqa: E402  (where the connections go)
BOUNCER_DSN = os.environ.get("DURABLE_LEDGER_PGBOUNCER_DSN")
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "agent_loop.py")


def setUpModule() -> None:
    if not DSN:
        raise unittest.SkipTest("DURABLE_LEDGER_DSN is not set")


class Tool:
    """A side effect that remembers every call; ``during(key)`` runs inside it."""

    def __init__(self, result: Any = None, during: Any = None) -> None:
        self.keys: List[str] = []
        self.result = result
        self.during = during

    def __call__(self, key: str) -> Any:
        self.keys.append(key)
        if self.during is not None:
            self.during(key)
        return self.result


class Connections:
    """A connection factory over a fixed set of connections, handed out in turn (FIFO),
    that records which thread used which backend, and can refuse the renewal thread."""

    def __init__(self, conns: List["psycopg.Connection[Any]"]) -> None:
        self.free: "queue.Queue[psycopg.Connection[Any]]" = queue.Queue()
        for conn in conns:
            self.free.put(conn)
        self.uses: List[Tuple[str, int]] = []  # (thread name, backend pid)
        self.refuse_renewals = False
        self.refuse_next = 0  # borrowings (not the renewal thread's) to refuse, from now on

    @contextmanager
    def __call__(self) -> Iterator["psycopg.Connection[Any]"]:
        thread = threading.current_thread().name
        if self.refuse_renewals and "renewal" in thread:
            raise psycopg.OperationalError("the database cannot be reached (test)")
        if self.refuse_next and "renewal" not in thread:
            self.refuse_next -= 1
            raise psycopg.OperationalError("connection refused (test)")
        conn = self.free.get(timeout=30)
        try:
            self.uses.append((thread, conn.info.backend_pid))
            yield conn
        finally:
            self.free.put(conn)

    def calls(self) -> int:
        """Statements sent by anything but the renewal thread."""
        return sum(1 for thread, _ in self.uses if "renewal" not in thread)


class TokenLeaseTest(unittest.TestCase):

    def setUp(self) -> None:
        self.run_id = f"pytoken-{uuid.uuid4()}"
        # the ledger's own tables are read where they are (target.py)
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True, application_name="durable-ledger-pytest")
        self.addCleanup(self.admin.close)

    # -------------------------------------------------------------- helpers

    def connect(self, dsn: Optional[str] = None, **kwargs: Any) -> "psycopg.Connection[Any]":
        kwargs.setdefault("autocommit", True)
        conn = psycopg.connect(dsn or DSN, application_name="durable-ledger-pytest", **kwargs)
        self.addCleanup(conn.close)
        return conn

    def pool(self, dsn: Optional[str] = None, size: int = 3, **kwargs: Any) -> ConnectionPool:
        kwargs.setdefault("application_name", "durable-ledger-pytest")
        pool = ConnectionPool(dsn or DSN, min_size=size, max_size=size, kwargs=kwargs)
        self.addCleanup(pool.close)
        pool.wait(timeout=30)
        return pool

    def factory(self, n: int = 2) -> Connections:
        return Connections([self.connect() for _ in range(n)])

    def audit(self, run: str, *events: str) -> List[Dict[str, Any]]:
        with self.admin.cursor(row_factory=psycopg.rows.dict_row) as cur:
            cur.execute("SELECT event::text, key, backend_pid, lease_epoch, detail"
                        "  FROM durable_ledger.audit_log WHERE run = %s"
                        "   AND (cardinality(%s::text[]) = 0 OR event::text = ANY(%s))"
                        " ORDER BY id", (run, list(events), list(events)))
            return cur.fetchall()

    def effects(self, run: str) -> List[Tuple[Any, ...]]:
        """(tool, occurrence, status, lease_epoch, key) of the run, in order."""
        return self.admin.execute(
            "SELECT tool, occurrence, status::text, lease_epoch, key FROM durable_ledger.effects"
            " WHERE run = %s ORDER BY created_at, occurrence", (run,)).fetchall()

    def key(self, run: str, tool: str, args: Any, occurrence: int) -> str:
        return self.admin.execute("SELECT durable_ledger.effect_key(%s, %s, %s, %s)",
                                  (run, tool, Jsonb(args), occurrence)).fetchone()[0]

    def live_leases(self, run: str) -> List[Tuple[Any, ...]]:
        """(kind, holder, lease_epoch) of the run's live leases (the leases view)."""
        return self.admin.execute(
            "SELECT kind::text, holder, lease_epoch FROM durable_ledger.leases WHERE run = %s",
            (run,)).fetchall()

    def session_locks_of(self, pids: List[int]) -> int:
        """Advisory locks of the ledger's own lock class held by these backends."""
        return self.admin.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17484"
            " AND pid = ANY(%s)", (pids,)).fetchone()[0]

    def take_elsewhere(self, run: str) -> bool:
        """Whether another worker could take the run right now (and then it has it)."""
        return self.admin.execute("SELECT (durable_ledger.take_lease(%s, '1 minute')).token"
                                  " IS NOT NULL", (run,)).fetchone()[0]

    def tools(self, ledger: Ledger) -> Dict[str, Any]:
        """Three side-effecting tools whose downstream systems record every call."""
        sent: Dict[str, List[str]] = {"bank.pay": [], "mail.send": [], "crm.note": []}

        def make(name: str) -> Any:
            @ledger.tool(name)
            def tool(args: Any, idempotency_key: str) -> Any:
                sent[name].append(idempotency_key)
                return {"tool": name, "n": len(sent[name]), "args": args}
            return tool

        tools = {name: make(name) for name in sent}
        tools["sent"] = sent
        return tools

    # ------------------------------------------------ calls on many backends

    def test_a_pool_connection_is_given_back_as_it_was_lent(self) -> None:
        # A ledger statement on a pool's connection that is not in autocommit mode is a
        # transaction of its own sent alone: the connection is switched to autocommit for
        # it, and back.  The pool's next user gets it as its owner made it -- idle, not in
        # autocommit mode -- after a call, and after a statement the server refused.
        pool = self.pool(size=1)
        ledger = Ledger(pool)
        pay = self.tools(ledger)["bank.pay"]

        def as_lent() -> None:
            with pool.connection() as conn:
                self.assertFalse(conn.autocommit)
                self.assertEqual(conn.info.transaction_status, TransactionStatus.IDLE)
                conn.execute("SELECT 1")  # the owner's own statement opens a transaction
                self.assertEqual(conn.info.transaction_status, TransactionStatus.INTRANS)

        with ledger.token_attempt(self.run_id, ttl=30):
            self.assertEqual(pay(self.run_id, {"invoice": "INV-1"})["n"], 1)
        as_lent()
        with self.assertRaises(InvalidArgument):
            with ledger.token_attempt(self.run_id, ttl=30):
                ledger.guarded(self.run_id, "", {}, lambda key: None)  # 22023, nothing written
        as_lent()
        self.assertEqual([row[2] for row in self.effects(self.run_id)], ["completed"])

    def test_one_attempt_on_a_pool_runs_on_several_backends_and_lines_up(self) -> None:
        # Non-autocommit pool connections: each call is a transaction of its own all
        # the same, committed before the call returns.
        pool = self.pool(size=3)
        ledger = Ledger(pool)
        t = self.tools(ledger)
        pay, mail = t["bank.pay"], t["mail.send"]
        args = {"invoice": "INV-1", "amount": 10}
        with ledger.token_attempt(self.run_id, ttl=30, holder="pytest-worker") as lease:
            self.assertIsInstance(lease, TokenLease)
            self.assertEqual((lease.run, lease.epoch, lease.holder), (self.run_id, 1, "pytest-worker"))
            self.assertNotIn(lease.token, repr(lease))
            self.assertEqual(self.live_leases(self.run_id), [("token", "pytest-worker", 1)])
            first = [pay(self.run_id, args), pay(self.run_id, args),  # again: occurrence 2
                     mail(self.run_id, {"to": "a@example.com"}), pay(self.run_id, {"invoice": "INV-2"})]
        self.assertEqual([r["n"] for r in first], [1, 2, 1, 3])
        intents = self.audit(self.run_id, "intent")
        self.assertEqual(len(intents), 4)
        backends = {row["backend_pid"] for row in self.audit(self.run_id)}
        self.assertGreater(len({row["backend_pid"] for row in intents}), 1,
                           f"every call ran on one backend: {intents}")
        self.assertEqual(self.session_locks_of(list(backends)), 0, "a session lock was taken")
        self.assertEqual(self.effects(self.run_id), [
            ("bank.pay", 1, "completed", 1, self.key(self.run_id, "bank.pay", args, 1)),
            ("bank.pay", 2, "completed", 1, self.key(self.run_id, "bank.pay", args, 2)),
            ("mail.send", 1, "completed", 1, self.key(self.run_id, "mail.send", {"to": "a@example.com"}, 1)),
            ("bank.pay", 1, "completed", 1, self.key(self.run_id, "bank.pay", {"invoice": "INV-2"}, 1)),
        ])
        self.assertEqual(t["sent"]["bank.pay"], [row[4] for row in self.effects(self.run_id)
                                                 if row[0] == "bank.pay"])
        # released at the end: no live lease, and the release is audited
        self.assertEqual(self.live_leases(self.run_id), [])
        self.assertEqual(len(self.audit(self.run_id, "lease_released")), 1)

        # The retry (another worker, a connection factory this time) replays it all, in order.
        factory = self.factory(2)
        again = Ledger(factory)
        t2 = self.tools(again)
        with again.token_attempt(self.run_id, ttl=30) as lease:
            self.assertEqual(lease.epoch, 2)
            replayed = [t2["bank.pay"](self.run_id, args), t2["bank.pay"](self.run_id, args),
                        t2["mail.send"](self.run_id, {"to": "a@example.com"}),
                        t2["bank.pay"](self.run_id, {"invoice": "INV-2"})]
        self.assertEqual(replayed, first)
        self.assertEqual(t2["sent"], {"bank.pay": [], "mail.send": [], "crm.note": []})
        self.assertEqual(len(self.audit(self.run_id, "replay")), 4)
        used = {pid for thread, pid in factory.uses if "renewal" not in thread}
        self.assertEqual(len(used), 2, f"the factory's two connections were not both used: {factory.uses}")

    def test_through_pgbouncer_in_transaction_mode(self) -> None:
        if not BOUNCER_DSN:
            self.skipTest("DURABLE_LEDGER_PGBOUNCER_DSN is not set")
        self.warm_bouncer(3)
        # One client connection to PgBouncer, psycopg's defaults (it would prepare
        # statements after 5 executions: the ledger's calls never do), shared with the
        # renewal thread.
        conn = self.connect(BOUNCER_DSN)
        ledger = Ledger(conn)
        t = self.tools(ledger)
        with ledger.token_attempt(self.run_id, ttl=2) as lease:
            results = []
            for i in range(8):
                results.append(t[("bank.pay", "mail.send")[i % 2]](self.run_id, {"i": i // 4}))
                if i == 3:
                    time.sleep(1.5)  # renewals go through PgBouncer too
            self.assertGreaterEqual(lease.renewals, 1)
        self.assertIsNone(lease.lost)
        pids = [row["backend_pid"] for row in self.audit(self.run_id, "intent")]
        self.assertGreater(len(set(pids)), 1, f"PgBouncer sent every call to one backend: {pids}")
        self.assertEqual([(tool, occ) for tool, occ, *_ in self.effects(self.run_id)],
                         [("bank.pay", 1), ("mail.send", 1), ("bank.pay", 2), ("mail.send", 2),
                          ("bank.pay", 1), ("mail.send", 1), ("bank.pay", 2), ("mail.send", 2)])
        self.assertEqual(self.live_leases(self.run_id), [])

        # the retry, through PgBouncer on a pool, replays everything
        again = Ledger(self.pool(BOUNCER_DSN, size=2, autocommit=True, prepare_threshold=None))
        t2 = self.tools(again)
        with again.token_attempt(self.run_id, ttl=30):
            replayed = [t2[("bank.pay", "mail.send")[i % 2]](self.run_id, {"i": i // 4})
                        for i in range(8)]
        self.assertEqual(replayed, results)
        self.assertEqual(t2["sent"], {"bank.pay": [], "mail.send": [], "crm.note": []})

    def warm_bouncer(self, n: int) -> None:
        """Makes PgBouncer open n server connections (n transactions at once)."""
        barrier = threading.Barrier(n)
        pids: List[int] = []

        def hold() -> None:
            with psycopg.connect(BOUNCER_DSN, autocommit=True) as conn:
                with conn.transaction():
                    pids.append(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
                    barrier.wait(30)

        threads = [threading.Thread(target=hold) for _ in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        self.assertEqual(len(set(pids)), n, f"PgBouncer did not open {n} server connections")

    # ------------------------------------------------------------- renewal

    def test_renewal_keeps_a_short_lease_alive_across_a_slow_tool(self) -> None:
        # ttl 2 s; the tool takes 5 s.  Without renewal the lease would expire after 2 s
        # and another worker could take the run while the payment is in flight.
        conn = self.connect()
        ledger = Ledger(conn)  # one connection, shared by the calls and the renewals
        seen: Dict[str, Any] = {}

        def slow(key: str) -> None:
            time.sleep(3.5)
            seen["taken_elsewhere"] = self.take_elsewhere(self.run_id)
            seen["live"] = self.live_leases(self.run_id)
            time.sleep(1.5)

        with ledger.token_attempt(self.run_id, ttl=2) as lease:
            taken_at = lease.expires_at
            result = ledger.guarded(self.run_id, "bank.pay", {"amount": 5},
                                    Tool({"payment_id": "p1"}, during=slow))
            self.assertEqual(result, {"payment_id": "p1"})
            self.assertFalse(seen["taken_elsewhere"], "another worker took the run mid-payment")
            self.assertEqual(seen["live"], [("token", None, 1)])
            self.assertGreaterEqual(lease.renewals, 5)  # every ttl / 3
            self.assertGreater(lease.expires_at, taken_at + timedelta(seconds=3))
            nxt = Tool({"message_id": "m1"})
            self.assertEqual(ledger.guarded(self.run_id, "mail.send", {"to": "x"}, nxt),
                             {"message_id": "m1"})
            self.assertEqual(len(nxt.keys), 1)
        self.assertIsNone(lease.lost)
        self.assertEqual([(tool, status, epoch) for tool, _, status, epoch, _ in self.effects(self.run_id)],
                         [("bank.pay", "completed", 1), ("mail.send", "completed", 1)])
        # the completion came while the lease was live: not a late one
        self.assertEqual([row["event"] for row in self.audit(self.run_id)],
                         ["lease_acquired", "intent", "completed", "intent", "completed",
                          "lease_released"])
        # the renewals stopped with the attempt
        renewals = lease.renewals
        time.sleep(1)
        self.assertEqual(lease.renewals, renewals)

    # ------------------------------------------------------------ lost lease

    def test_a_lease_broken_by_an_admin_stops_the_attempt_and_the_retry_replays(self) -> None:
        factory = self.factory(2)
        ledger = Ledger(factory)
        first = Tool({"payment_id": "p1"})
        never = Tool({"should": "not happen"})
        with self.assertRaises(LeaseLost) as at_exit:
            with ledger.token_attempt(self.run_id, ttl=30) as lease:
                self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1}, first),
                                 {"payment_id": "p1"})
                self.assertTrue(self.admin.execute(
                    "SELECT durable_ledger.break_lease(%s, 'admin', NULL)", (self.run_id,)).fetchone()[0])
                with self.assertRaises(LeaseLost) as caught:
                    ledger.guarded(self.run_id, "mail.send", {"n": 2}, never)
                lost = caught.exception
                self.assertIsInstance(lost, LedgerError)
                self.assertEqual((lost.run, lost.epoch, lost.key, lost.decision),
                                 (self.run_id, 1, None, None))
                self.assertIn("expired", lost.reason)
                self.assertEqual(getattr(lost.__cause__, "sqlstate", None), "55L01")
                self.assertIs(lease.lost, lost)
                # from now on nothing goes out
                sent = factory.calls()
                for tool in ("mail.send", "crm.note"):
                    self.assertRaises(LeaseLost, ledger.guarded, self.run_id, tool, {"n": 3}, never)
                self.assertRaises(LeaseLost, lease.check)
                self.assertEqual(factory.calls(), sent)
            # the body went on after catching it: the attempt's end raises it again
        self.assertEqual(at_exit.exception.run, self.run_id)
        self.assertEqual(factory.calls(), sent, "a call went out after the lease was lost")
        self.assertEqual(never.keys, [])
        self.assertEqual([(tool, status) for tool, _, status, *_ in self.effects(self.run_id)],
                         [("bank.pay", "completed")])
        broken = self.audit(self.run_id, "lease_broken")
        self.assertEqual(len(broken), 1)
        self.assertEqual(broken[0]["detail"]["broken_by"], "admin")
        self.assertEqual(self.audit(self.run_id, "lease_released"), [])

        # the retry: a new attempt replays what the first completed and goes on
        retry = Tool({"should": "not happen"})
        nxt = Tool({"message_id": "m1"})
        with ledger.token_attempt(self.run_id, ttl=30) as lease:
            self.assertEqual(lease.epoch, 2)
            self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1}, retry),
                             {"payment_id": "p1"})
            self.assertEqual(ledger.guarded(self.run_id, "mail.send", {"n": 2}, nxt),
                             {"message_id": "m1"})
        self.assertEqual((retry.keys, len(nxt.keys)), ([], 1))
        self.assertEqual([(tool, status, epoch) for tool, _, status, epoch, _ in self.effects(self.run_id)],
                         [("bank.pay", "completed", 1), ("mail.send", "completed", 2)])

    def test_a_lease_lost_while_a_tool_runs_reports_the_outcome_then_stops(self) -> None:
        ledger = Ledger(self.pool(size=2, autocommit=True))
        state: Dict[str, Any] = {}

        def broken_meanwhile(key: str) -> None:
            self.admin.execute("SELECT durable_ledger.break_lease(%s, 'oncall', 'hung?')",
                               (self.run_id,))
            deadline = time.monotonic() + PATIENCE
            while state["lease"].lost is None and time.monotonic() < deadline:
                time.sleep(0.05)  # the renewal (every 2/3 s) finds out
            state["lost_seen_in_flight"] = state["lease"].lost is not None

        never = Tool({"should": "not happen"})
        with self.assertRaises(LeaseLost):
            with ledger.token_attempt(self.run_id, ttl=2) as lease:
                state["lease"] = lease
                # the call in flight is not cut short: its outcome is reported and returned
                self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1},
                                                Tool({"payment_id": "p1"}, during=broken_meanwhile)),
                                 {"payment_id": "p1"})
                self.assertTrue(state["lost_seen_in_flight"], "the renewal never noticed")
                ledger.guarded(self.run_id, "mail.send", {"n": 2}, never)
        self.assertEqual(never.keys, [])
        (pay,) = self.effects(self.run_id)
        self.assertEqual(pay[:3], ("bank.pay", 1, "completed"))
        self.assertEqual([row["event"] for row in self.audit(self.run_id)],
                         ["lease_acquired", "intent", "lease_broken", "late_completion"])

    def expired(self, run: str) -> bool:
        """Whether the run's live token lease has expired by the server's clock."""
        return bool(self.admin.execute(
            "SELECT bool_and(expires_at <= clock_timestamp()) FROM durable_ledger.token_leases"
            " WHERE run = %s AND released_at IS NULL", (run,)).fetchone()[0])

    def test_an_expired_lease_stops_the_attempt(self) -> None:
        # The renewals cannot reach the database (the tool's own calls can): the lease
        # expires by the server's clock while the tool runs.  (A ttl of 5 s, so that the
        # intent surely goes out before the expiry; the tool waits for the expiry itself.)
        factory = self.factory(2)
        ledger = Ledger(factory)
        never = Tool({"should": "not happen"})

        def until_expired(key: str) -> None:
            self.assertTrue(wait_for(lambda: self.expired(self.run_id), "the lease expires"),
                            "the lease did not expire")

        with self.assertLogs("durable_ledger", "WARNING") as logs:
            with self.assertRaises(LeaseLost) as caught:
                with ledger.token_attempt(self.run_id, ttl=5) as lease:
                    factory.refuse_renewals = True
                    self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1},
                                                    Tool({"payment_id": "p1"},
                                                         during=until_expired)),
                                     {"payment_id": "p1"})
                    ledger.guarded(self.run_id, "mail.send", {"n": 2}, never)
        self.assertIn("has expired", caught.exception.reason)
        self.assertIs(lease.lost, caught.exception)
        self.assertTrue(any("could not renew" in line for line in logs.output), logs.output)
        self.assertEqual(never.keys, [])
        self.assertEqual([(tool, status) for tool, _, status, *_ in self.effects(self.run_id)],
                         [("bank.pay", "completed")])
        self.assertEqual([row["event"] for row in self.audit(self.run_id)],
                         ["lease_acquired", "intent", "late_completion"])
        factory.refuse_renewals = False
        with ledger.token_attempt(self.run_id, ttl=30) as lease:
            self.assertEqual(lease.epoch, 2)
            self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1}, never),
                             {"payment_id": "p1"})
        self.assertEqual(never.keys, [])

    def test_a_begin_whose_outcome_is_unknown_stops_the_attempt(self) -> None:
        # The connection dies under begin_effect: its intent may or may not be recorded,
        # under a lease that is still live; the same call again would be the next
        # occurrence.  The attempt stops; the next one finds out.
        conns = [self.connect(), self.connect()]
        factory = Connections(conns)
        ledger = Ledger(factory)
        never = Tool({"should": "not happen"})
        with self.assertRaises(EffectPaused):
            with ledger.token_attempt(self.run_id, ttl=30):
                # the connection the next call will get is terminated
                victim = factory.free.queue[0].info.backend_pid
                self.admin.execute("SELECT pg_terminate_backend(%s)", (victim,))
                self.assertTrue(wait_for(lambda: not self.admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (victim,)).fetchone(),
                    "the backend ends"))
                with self.assertRaises(psycopg.OperationalError):
                    ledger.guarded(self.run_id, "bank.pay", {"n": 1}, never)
                sent = factory.calls()
                ledger.guarded(self.run_id, "bank.pay", {"n": 1}, never)
        self.assertEqual(factory.calls(), sent + 1, "only the release went out")  # at exit
        self.assertEqual(never.keys, [])
        # nothing was recorded: the next attempt executes it
        ledger = Ledger(lambda: psycopg.connect(DSN, autocommit=True))
        once = Tool({"payment_id": "p1"})
        with ledger.token_attempt(self.run_id, ttl=30):
            self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1}, once),
                             {"payment_id": "p1"})
        self.assertEqual(len(once.keys), 1)

    # ----------------------------------------------- the calls of an attempt

    def executor(self) -> ThreadPoolExecutor:
        """The agent framework's tool executor: its threads do not inherit contexts."""
        executor = ThreadPoolExecutor(4)
        self.addCleanup(executor.shutdown, wait=True)
        return executor

    def test_a_thread_that_outlives_its_attempt_never_acts_in_the_retry(self) -> None:
        # Parallel tool calls, each run in the attempt's context (what lease.bind and
        # contextvars.copy_context().run do): one fails, which ends the attempt while the
        # other still waits for a model; the job is retried in the same process, and the
        # leftover call wakes up during the retry.  It used to take the new attempt's
        # token: occurrence 1 for it, occurrence 2 for the retry's own call, two e-mails.
        ledger = Ledger(self.pool(size=3, autocommit=True))
        t = self.tools(ledger)
        model = threading.Event()

        def branch() -> Any:
            if not model.wait(PATIENCE):
                raise TimeoutError("the model never answered")
            return t["mail.send"](self.run_id, {"to": "a@example.com"})

        executor = self.executor()
        with self.assertRaises(RuntimeError):
            with ledger.token_attempt(self.run_id, ttl=30):
                leftover = executor.submit(contextvars.copy_context().run, branch)
                raise RuntimeError("crm lookup: 503")  # the other branch
        with ledger.token_attempt(self.run_id, ttl=30) as lease:
            self.assertEqual(lease.epoch, 2)
            model.set()  # the leftover call of attempt 1 goes on now
            with self.assertRaises(LeaseLost) as caught:
                leftover.result(timeout=PATIENCE)
            self.assertEqual((caught.exception.run, caught.exception.epoch), (self.run_id, 1))
            self.assertIn("has ended", caught.exception.reason)
            self.assertIsNone(lease.lost, "the stale call touched this attempt's lease")
            again = t["mail.send"](self.run_id, {"to": "a@example.com"})  # this attempt's own
        self.assertEqual(again["n"], 1)
        self.assertEqual(len(t["sent"]["mail.send"]), 1, "the e-mail was sent twice")
        self.assertEqual([(tool, occ, status, epoch) for tool, occ, status, epoch, _ in
                          self.effects(self.run_id)], [("mail.send", 1, "completed", 2)])

    def test_parallel_tool_calls_replayed_in_another_order_pay_nothing_twice(self) -> None:
        # A model asks for several tool calls at once; the agent runs them on its
        # executor (each bound to the attempt).  The worker restarts and the model asks
        # again, in another order: a key is the tool and the canonical args (or a business
        # key), never a position, so every call replays and nothing is paid twice.
        ledger = Ledger(self.pool(size=3, autocommit=True))
        paid: List[str] = []
        lock = threading.Lock()

        def pay(invoice: str, part: str = "", business_key: Optional[str] = None) -> Any:
            def perform(key: str) -> Dict[str, str]:
                with lock:
                    paid.append(invoice + part)
                time.sleep(random.random() / 50)  # they finish in any order
                return {"paid": invoice}
            args = {"invoice": invoice, **({"part": part} if part else {})}
            return ledger.guarded(self.run_id, "bank.pay", args, perform, business_key=business_key)

        calls = [("INV-1", "", None), ("INV-2", "", None), ("INV-3", "", None),
                 ("INV-4", "a", self.run_id + "-INV-4-a"), ("INV-4", "b", self.run_id + "-INV-4-b")]
        executor = self.executor()
        with ledger.token_attempt(self.run_id, ttl=30) as lease:
            futures = [executor.submit(lease.bind(pay), *c) for c in calls]
            [f.result(timeout=PATIENCE) for f in futures]
        self.assertEqual(len(paid), 5, "the first attempt performs every call once")
        with ledger.token_attempt(self.run_id, ttl=30) as lease:
            order = [calls[4], calls[2], calls[0], calls[3], calls[1]]
            futures = [executor.submit(lease.bind(pay), *c) for c in order]
            results = [f.result(timeout=PATIENCE)["paid"] for f in futures]
        self.assertEqual(len(paid), 5, "the replay performed something again")
        self.assertEqual(results, ["INV-4", "INV-3", "INV-1", "INV-4", "INV-2"])

    def test_a_leftover_thread_on_one_connection_never_takes_a_session_lease(self) -> None:
        # Ledger(conn) (one connection, as to PgBouncer): a call that outlives its attempt,
        # with no retry, used to take an implicit session lease on whatever backend it hit.
        conn = self.connect()
        ledger = Ledger(conn)
        t = self.tools(ledger)
        model = threading.Event()

        def branch() -> Any:
            if not model.wait(PATIENCE):
                raise TimeoutError("the model never answered")
            return t["mail.send"](self.run_id, {"to": "a@example.com"})

        executor = self.executor()
        with self.assertRaises(RuntimeError):
            with ledger.token_attempt(self.run_id, ttl=30):
                leftover = executor.submit(contextvars.copy_context().run, branch)
                raise RuntimeError("crm lookup: 503")
        model.set()
        with self.assertRaises(LeaseLost) as caught:
            leftover.result(timeout=PATIENCE)
        self.assertEqual(caught.exception.epoch, 1)
        # a call outside any attempt: no implicit session lease either
        with self.assertRaises(LedgerUsageError) as refused:
            t["mail.send"](self.run_id, {"to": "b@example.com"})
        self.assertIn("outside an attempt", str(refused.exception))
        self.assertEqual(t["sent"]["mail.send"], [])
        self.assertEqual(self.session_locks_of([conn.info.backend_pid]), 0, "a session lock was taken")
        self.assertEqual(self.live_leases(self.run_id), [])
        self.assertEqual(self.effects(self.run_id), [])
        # an explicit session attempt is still possible on this Ledger
        with ledger.attempt(self.run_id):
            t["mail.send"](self.run_id, {"to": "c@example.com"})
        self.assertEqual(len(t["sent"]["mail.send"]), 1)

    def test_a_call_from_a_thread_without_the_attempt_is_refused(self) -> None:
        # A bare executor.submit runs the tool in a thread that does not carry the attempt:
        # it cannot be told from a leftover of an earlier attempt, so it is refused.
        ledger = Ledger(self.pool(size=2, autocommit=True))
        t = self.tools(ledger)
        executor = self.executor()
        with ledger.token_attempt(self.run_id, ttl=30) as lease:
            bare = executor.submit(t["bank.pay"], self.run_id, {"n": 1})
            with self.assertRaises(LedgerUsageError) as caught:
                bare.result(timeout=PATIENCE)
            self.assertIn("lease.bind", str(caught.exception))
            self.assertEqual(t["sent"]["bank.pay"], [])
            bound = executor.submit(lease.bind(t["bank.pay"]), self.run_id, {"n": 1})
            self.assertEqual(bound.result(timeout=PATIENCE)["n"], 1)
        self.assertEqual(len(t["sent"]["bank.pay"]), 1)
        self.assertEqual([(tool, occ, status, epoch) for tool, occ, status, epoch, _ in
                          self.effects(self.run_id)], [("bank.pay", 1, "completed", 1)])

    def test_the_end_of_an_attempt_waits_for_its_calls_in_flight(self) -> None:
        # Ledger(pool): a call is performing in another thread when the block is left (the
        # other branch failed).  Its completion used to take the session path and trip
        # (OutcomeNotRecorded, the payment 'started' for a person); now the exit waits for
        # it, renewing the lease meanwhile, and releases after the completion.
        ledger = Ledger(self.pool(size=3, autocommit=True))
        entered, go = threading.Event(), threading.Event()
        seen: Dict[str, Any] = {}

        def pay(key: str) -> Any:
            entered.set()
            if not go.wait(PATIENCE * 2):
                raise TimeoutError("never let go")
            return {"payment_id": "p1"}

        def bank(lease: TokenLease, renewals: int) -> None:
            # The bank answers once the block has been left and the lease is still being
            # renewed (ttl 3 s: every second): the exit is waiting for this call.
            try:
                seen["renewed while waiting"] = wait_for(lambda: lease.renewals > renewals,
                                                         "a renewal after the block was left")
                seen["lease at that moment"] = self.live_leases(self.run_id)
            finally:
                go.set()

        executor = self.executor()
        with self.assertRaises(RuntimeError):
            with ledger.token_attempt(self.run_id, ttl=3) as lease:
                call = executor.submit(contextvars.copy_context().run, ledger.guarded,
                                       self.run_id, "bank.pay", {"n": 1}, pay)
                self.assertTrue(entered.wait(PATIENCE))
                answer = threading.Thread(target=bank, args=(lease, lease.renewals))
                answer.start()
                raise RuntimeError("the model call of the other branch failed")
        answer.join(PATIENCE)
        self.assertEqual(call.result(timeout=PATIENCE), {"payment_id": "p1"})
        self.assertTrue(seen["renewed while waiting"], "the lease was not held while the call ran")
        self.assertEqual(seen["lease at that moment"], [("token", None, 1)])
        self.assertEqual([(tool, status) for tool, _, status, *_ in self.effects(self.run_id)],
                         [("bank.pay", "completed")])
        self.assertEqual([row["event"] for row in self.audit(self.run_id)],
                         ["lease_acquired", "intent", "completed", "lease_released"])
        self.assertEqual(self.live_leases(self.run_id), [])

    # -------------------------------------- one connection shared with a tool

    def _begin_inside_a_tools_transaction(self, end: str) -> None:
        # Ledger(conn) shared with a tool that runs a transaction on it from another
        # thread: the tool's BEGIN may land right after the ledger checked that the
        # connection is idle (the review saw it in 2 of 15 runs).  Here the BEGIN is put
        # exactly there; the tool's transaction then ends with ``end``.
        conn = self.connect()
        ledger = Ledger(conn)
        checked = ledger._check_writable
        state = {"begin": False}

        def idle_then_begin() -> None:
            checked()
            if state["begin"]:
                state["begin"] = False
                conn.execute("BEGIN")  # the tool's transaction starts

        ledger._check_writable = idle_then_begin  # type: ignore[method-assign]
        never = Tool({"should": "not happen"})
        with ledger.token_attempt(self.run_id, ttl=30):
            state["begin"] = True
            with self.assertRaises(LedgerUsageError) as caught:
                ledger.guarded(self.run_id, "mail.send", {"to": "a"}, never)
            conn.execute(end)  # the tool's transaction ends
            self.assertIn("was not sent", str(caught.exception))
            self.assertIn("dedicated", str(caught.exception))
            # the attempt stops, as after any begin whose commit it did not see
            with self.assertRaises(EffectPaused):
                ledger.guarded(self.run_id, "mail.send", {"to": "a"}, never)
        self.assertEqual(never.keys, [])
        # begin_effect was never sent: the tool's COMMIT committed no intent of it (it
        # did when the statement was sent first and its status read after the reply)
        self.assertEqual(self.effects(self.run_id), [], f"an intent went with the {end}")
        once = Tool({"message_id": "m1"})
        with ledger.token_attempt(self.run_id, ttl=30):
            self.assertEqual(ledger.guarded(self.run_id, "mail.send", {"to": "a"}, once),
                             {"message_id": "m1"})
        self.assertEqual(len(once.keys), 1)
        self.assertEqual([(occ, status, epoch) for _, occ, status, epoch, _ in self.effects(self.run_id)],
                         [(1, "completed", 2)])

    def test_a_begin_inside_a_tools_transaction_that_rolls_back_is_not_sent(self) -> None:
        self._begin_inside_a_tools_transaction("ROLLBACK")

    def test_a_begin_inside_a_tools_transaction_that_commits_is_not_sent(self) -> None:
        self._begin_inside_a_tools_transaction("COMMIT")

    # ------------------------------------------- stale pooled connections

    def stale_pool(self) -> Tuple[ConnectionPool, Any]:
        """A pool of one connection, and a function that kills it while it is idle (as
        idle_session_timeout or a restarted PgBouncer do) and waits until it is gone."""
        name = f"dl-stale-{uuid.uuid4().hex[:12]}"
        pool = self.pool(size=1, autocommit=True, application_name=name)

        def kill_idle() -> None:
            pids = [pid for (pid,) in self.admin.execute(  # (not a proxy's connections to its shard)
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = %s",
                (name, CLIENT_DB))]
            self.assertEqual(len(pids), 1, f"the pool's connections: {pids}")
            self.admin.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
            self.assertTrue(wait_for(lambda: not self.admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pids[0],)).fetchone(),
                "the backend ends"))

        return pool, kill_idle

    def test_a_pooled_connection_that_died_idle_loses_neither_report_nor_release(self) -> None:
        # psycopg_pool 3.1 hands out idle connections without checking them.  The
        # completion, the release and the next take_lease each meet a dead one: each is
        # sent once more on a fresh connection (they are idempotent; begin_effect never).
        pool, kill_idle = self.stale_pool()
        ledger = Ledger(pool)
        with self.assertLogs("durable_ledger", "WARNING") as logs:
            with ledger.token_attempt(self.run_id, ttl=30) as lease:
                paid = ledger.guarded(self.run_id, "bank.pay", {"n": 1},
                                      Tool({"payment_id": "p1"}, during=lambda key: kill_idle()))
                self.assertEqual(paid, {"payment_id": "p1"})
                kill_idle()  # before the release
            self.assertIsNone(lease.lost)
            self.assertEqual([(tool, status) for tool, _, status, *_ in self.effects(self.run_id)],
                             [("bank.pay", "completed")])
            self.assertEqual([row["event"] for row in self.audit(self.run_id)],
                             ["lease_acquired", "intent", "completed", "lease_released"])
            self.assertEqual(self.live_leases(self.run_id), [])
            kill_idle()  # before the next take_lease
            never = Tool({"should": "not happen"})
            with ledger.token_attempt(self.run_id, ttl=30) as lease:
                self.assertEqual(lease.epoch, 2)
                self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1}, never),
                                 {"payment_id": "p1"})
        self.assertEqual(never.keys, [])
        resent = [line for line in logs.output if "once more on a fresh connection" in line]
        self.assertEqual([line.split(":")[2].split(" of ")[0] for line in resent],
                         ["complete_effect", "release_lease", "take_lease"], logs.output)

    def test_a_report_whose_connection_could_not_be_had_is_sent_on_the_next(self) -> None:
        # the factory cannot connect once, just when the completion needs a connection
        # (a pool's PoolTimeout is the same): nothing was sent, so it is sent on the next
        factory = self.factory()
        ledger = Ledger(factory)
        with self.assertLogs("durable_ledger", "WARNING") as logs:
            with ledger.token_attempt(self.run_id, ttl=30) as lease:
                paid = ledger.guarded(self.run_id, "bank.pay", {"n": 1},
                                      Tool({"payment_id": "p1"},
                                           during=lambda key: setattr(factory, "refuse_next", 1)))
                self.assertEqual(paid, {"payment_id": "p1"})
        self.assertIsNone(lease.lost)
        self.assertEqual(factory.refuse_next, 0)
        self.assertEqual([status for _, _, status, *_ in self.effects(self.run_id)], ["completed"])
        self.assertTrue([line for line in logs.output
                         if "complete_effect" in line and "once more" in line], logs.output)

    def test_a_renewal_on_a_dead_pooled_connection_is_sent_again_at_once(self) -> None:
        pool, kill_idle = self.stale_pool()
        ledger = Ledger(pool)
        with self.assertLogs("durable_ledger", "WARNING") as logs:
            with ledger.token_attempt(self.run_id, ttl=3) as lease:  # renewed every second
                kill_idle()
                renewals = lease.renewals
                self.assertTrue(wait_for(lambda: lease.renewals > renewals, "a renewal"))
        self.assertIsNone(lease.lost)
        self.assertFalse([line for line in logs.output if "could not renew" in line], logs.output)
        self.assertTrue([line for line in logs.output
                         if "renew_lease" in line and "once more" in line], logs.output)

    # ---------------------------------------------------- exclusion, usage

    def test_one_live_lease_of_either_kind_and_release_at_the_end(self) -> None:
        ledger = Ledger(self.pool(size=2))
        other = Ledger(self.pool(size=1))
        session = Ledger(self.connect())
        with ledger.token_attempt(self.run_id, ttl=30):
            with self.assertRaises(RunBusy):
                with other.token_attempt(self.run_id):
                    self.fail("two token leases on one run")
            self.assertFalse(session.acquire_run(self.run_id, wait=False))
            with self.assertRaises(RunBusy) as busy:  # 55P03 at once, named
                session.acquire_run(self.run_id)
            self.assertEqual(busy.exception.sqlstate, "55P03")
            self.assertIn("is held by a token lease", str(busy.exception))
            with self.assertRaises(LedgerUsageError):  # and no implicit session lease
                session.guarded(self.run_id, "t", {}, Tool())
            with self.assertRaises(LedgerUsageError):
                with ledger.token_attempt(self.run_id):
                    self.fail("two attempts at one run in one Ledger")
        # released at the end, also after an error: the next worker takes it at once
        with self.assertRaises(KeyError):
            with other.token_attempt(self.run_id, ttl=30):
                raise KeyError("the agent crashed")
        self.assertEqual(self.live_leases(self.run_id), [])
        with session.attempt(self.run_id):
            with self.assertRaises(RunBusy):
                with other.token_attempt(self.run_id):
                    self.fail("a token lease while a session holds the run")
        self.assertEqual(len(self.audit(self.run_id, "lease_released")), 3)

    def test_a_pooled_ledger_refuses_session_leases(self) -> None:
        ledger = Ledger(self.pool(size=1))
        self.assertIsNone(ledger.conn)
        never = Tool()
        with self.assertRaises(LedgerUsageError) as caught:
            ledger.guarded(self.run_id, "t", {}, never)
        self.assertIn("token_attempt", str(caught.exception))
        self.assertRaises(LedgerUsageError, ledger.acquire_run, self.run_id)
        self.assertRaises(LedgerUsageError, ledger.release_run, self.run_id)
        with self.assertRaises(LedgerUsageError):
            with ledger.attempt(self.run_id):
                self.fail("a session attempt on a pool")
        self.assertEqual(never.keys, [])
        self.assertEqual(self.effects(self.run_id), [])
        self.assertIsNone(ledger.effect_status("0" * 64))
        with ledger.token_attempt(self.run_id, ttl=timedelta(seconds=30)):
            ledger.guarded(self.run_id, "t", {}, Tool({"ok": 1}))
        self.assertEqual(ledger.effect_status(self.key(self.run_id, "t", {}, 1))["status"], "completed")
        self.assertRaises(TypeError, Ledger, object())
        with self.assertRaises(InvalidArgument):  # 22023: a ttl of 1 s .. 1 day
            with ledger.token_attempt(self.run_id, ttl=0.5):
                self.fail("a ttl below one second")

    def test_example_agent_loop_with_token_leases_through_pgbouncer(self) -> None:
        if not BOUNCER_DSN:
            self.skipTest("DURABLE_LEDGER_PGBOUNCER_DSN is not set")
        proc = subprocess.run([sys.executable, EXAMPLE, "--token-lease", "--dsn", BOUNCER_DSN,
                               "--run", self.run_id], capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        first, _, second = proc.stdout.partition("== attempt 2")
        self.assertIn("(token lease, epoch 1)", first)
        self.assertIn("(token lease, epoch 2)", second)
        self.assertEqual(first.count("EXECUTED"), 3, proc.stdout)
        self.assertEqual(second.count("EXECUTED"), 0, proc.stdout)
        self.assertIn("downstream calls made in this attempt: 0", second)
        self.assertRegex(proc.stdout, r"(?m)^ok - ")
        self.assertEqual(len(self.audit(self.run_id, "lease_released")), 2)


if __name__ == "__main__":
    unittest.main()
