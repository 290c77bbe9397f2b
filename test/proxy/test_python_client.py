"""The Python client (clients/python) against durable_ledger_proxy and three shards
(test/apps/060_proxy.pl): the README's safe shape, a worker killed mid-payment and a
person's resolution, a reconciler, recorded model turns, token attempts of parallel
calls through a pool, and what ``routed=True`` changes.  PROXY_DSN (a superuser),
SHARD_DSNS ('|'-separated, p0 first); the roles agent (worker) and oncall (admin).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import unittest
import uuid
from typing import Any, Dict, List, Optional

import psycopg
from psycopg_pool import AsyncConnectionPool

from durable_ledger import (AsyncLedger, EffectPaused, Happened, Ledger, OutcomeNotRecorded)

from test_proxy import PROXY_DSN, SHARD_DSNS, shard_index

CLIENT = os.path.join(os.environ.get("TESTDIR", ""), "clients", "python")


def setUpModule() -> None:
    if not PROXY_DSN or not SHARD_DSNS:
        raise unittest.SkipTest("PROXY_DSN and SHARD_DSNS are not set")


def as_user(user: str) -> str:
    return psycopg.conninfo.make_conninfo(PROXY_DSN, user=user)


class Bank:
    """The downstream: every call it receives, by idempotency key."""

    def __init__(self) -> None:
        self.calls: List[str] = []

    def pay(self, args: Any, key: str) -> Dict[str, Any]:
        self.calls.append(key)
        return {"payment_id": f"pay-{len(self.calls)}", "amount": args["amount"]}


class ClientThroughProxyTest(unittest.TestCase):

    def setUp(self) -> None:
        self.tag = uuid.uuid4().hex[:10]

    def connect(self, dsn: str) -> "psycopg.Connection[Any]":
        conn = psycopg.connect(dsn, autocommit=True)
        self.addCleanup(conn.close)
        return conn

    def run_on(self, i: int, prefix: str = "client") -> str:
        n = 0
        while shard_index(f"{prefix}-{self.tag}-{n}", len(SHARD_DSNS)) != i:
            n += 1
        return f"{prefix}-{self.tag}-{n}"

    def shard_rows(self, i: int, run: str) -> List[Any]:
        return self.connect(SHARD_DSNS[i]).execute(
            "SELECT tool, status, attempt FROM durable_ledger.effects WHERE run = %s ORDER BY created_at",
            (run,)).fetchall()

    def wait_no_session_lease(self, run: str) -> None:
        """A closed proxy session's connection to the shard ends asynchronously."""
        i = shard_index(run, len(SHARD_DSNS))
        shard = self.connect(SHARD_DSNS[i])
        deadline = time.monotonic() + 60
        while shard.execute("SELECT count(*) FROM durable_ledger.leases WHERE run = %s AND kind = 'session'",
                            (run,)).fetchone()[0]:
            self.assertLess(time.monotonic(), deadline, f"the lease of {run} never ended")
            time.sleep(0.01)

    def test_the_safe_shape_pays_once_per_run_on_every_shard(self) -> None:
        bank = Bank()
        for i in range(len(SHARD_DSNS)):
            run = self.run_on(i)
            for attempt in range(2):  # the first attempt, then a rerun of the whole job
                with self.connect(as_user("agent")) as conn:
                    ledger = Ledger(conn, routed=True)

                    @ledger.tool("bank.pay")
                    def pay(args: Any, key: str) -> Any:
                        return bank.pay(args, key)

                    with ledger.attempt(run):
                        receipt = pay(run, {"invoice": f"INV-{i}", "amount": 100 + i})
                        note = ledger.record(run, "llm.note", receipt, lambda: {"text": "paid"})
                self.assertEqual(receipt["amount"], 100 + i)
                self.assertEqual(note, {"text": "paid"})
                self.wait_no_session_lease(run)
            self.assertEqual(self.shard_rows(i, run), [("bank.pay", "completed", 1), ("llm.note", "completed", 1)],
                             f"the run's effects are on its shard p{i}")
        self.assertEqual(len(bank.calls), len(SHARD_DSNS), "one payment per run, the reruns replayed")

    def test_a_worker_killed_mid_payment_pauses_until_a_person_resolves_through_the_proxy(self) -> None:
        run = self.run_on(1, "killed")
        worker = textwrap.dedent(f"""
            import os, signal, psycopg
            from durable_ledger import Ledger
            ledger = Ledger(psycopg.connect({as_user("agent")!r}, autocommit=True), routed=True)
            with ledger.attempt({run!r}):
                ledger.guarded({run!r}, "bank.pay", {{"invoice": "INV-9", "amount": 4200}},
                               lambda key: os.kill(os.getpid(), signal.SIGKILL))
        """)
        env = dict(os.environ, PYTHONPATH=CLIENT)
        done = subprocess.run([sys.executable, "-c", worker], env=env, timeout=120)
        self.assertEqual(done.returncode, -signal.SIGKILL, "the worker died at the bank")
        self.wait_no_session_lease(run)
        bank = Bank()
        with self.connect(as_user("agent")) as conn:
            ledger = Ledger(conn, routed=True)
            with self.assertRaises(EffectPaused) as paused:
                with ledger.attempt(run):
                    ledger.guarded(run, "bank.pay", {"invoice": "INV-9", "amount": 4200},
                                   lambda key: bank.pay({"amount": 4200}, key))
        key = paused.exception.key
        oncall = self.connect(as_user("oncall"))
        self.assertEqual(oncall.execute("SELECT shard FROM durable_ledger.unresolved WHERE key = %s",
                                        (key,)).fetchone()[0], "p1")
        oncall.execute("SELECT durable_ledger.resolve_effect(%s, 'completed', '{\"payment_id\": \"pay_81\"}', 'maria')",
                       (key,))
        self.wait_no_session_lease(run)
        with self.connect(as_user("agent")) as conn:
            ledger = Ledger(conn, routed=True)
            with ledger.attempt(run):
                result = ledger.guarded(run, "bank.pay", {"invoice": "INV-9", "amount": 4200},
                                        lambda key: bank.pay({"amount": 4200}, key))
        self.assertEqual(result, {"payment_id": "pay_81"})
        self.assertEqual(bank.calls, [], "the bank was never called again")

    def test_a_reconciler_settles_an_unknown_outcome_through_the_proxy(self) -> None:
        tool = f"bank.pay.{self.tag}"
        oncall = self.connect(as_user("oncall"))
        oncall.execute("SELECT durable_ledger.register_tool(%s, 'maria')", (tool,))
        oncall.execute("SELECT durable_ledger.set_reconcile(%s, '0 seconds', 'maria')", (tool,))
        run = self.run_on(2, "reconciled")
        worker = textwrap.dedent(f"""
            import os, signal, psycopg
            from durable_ledger import Ledger
            ledger = Ledger(psycopg.connect({as_user("agent")!r}, autocommit=True), routed=True)
            with ledger.attempt({run!r}):
                ledger.guarded({run!r}, {tool!r}, {{"invoice": "INV-7", "amount": 70}},
                               lambda key: (open(os.environ["BANK"], "w").write(key),
                                            os.kill(os.getpid(), signal.SIGKILL)))
        """)
        bank_file = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bank-{self.tag}")
        self.addCleanup(lambda: os.path.exists(bank_file) and os.unlink(bank_file))
        env = dict(os.environ, PYTHONPATH=CLIENT, BANK=bank_file)
        self.assertEqual(subprocess.run([sys.executable, "-c", worker], env=env, timeout=120).returncode,
                         -signal.SIGKILL)
        with open(bank_file) as f:
            paid_under = f.read()
        self.wait_no_session_lease(run)
        asked: List[str] = []

        def lookup(downstream_key: str, args: Any) -> Any:
            asked.append(downstream_key)
            return Happened({"payment_id": "found", "key": downstream_key}) if downstream_key == paid_under else None

        with self.connect(as_user("agent")) as conn:
            ledger = Ledger(conn, routed=True)
            with ledger.attempt(run):
                result = ledger.guarded(run, tool, {"invoice": "INV-7", "amount": 70},
                                        lambda key: self.fail("paid again"), reconcile=lookup)
        self.assertEqual(result, {"payment_id": "found", "key": paid_under})
        self.assertEqual(asked, [paid_under])
        self.assertEqual(self.shard_rows(2, run), [(tool, "completed", 1)])

    def test_parallel_tool_calls_of_token_attempts_through_a_pool(self) -> None:
        runs = [self.run_on(i % len(SHARD_DSNS), f"async{i}") for i in range(6)]
        bank = Bank()

        async def main() -> List[Any]:
            async with AsyncConnectionPool(as_user("agent"), min_size=4, max_size=4,
                                           kwargs={"autocommit": True}, open=False) as pool:
                ledger = AsyncLedger(pool, routed=True)

                @ledger.tool("bank.pay")
                async def pay(args: Any, key: str) -> Any:
                    await asyncio.sleep(0.01)
                    return bank.pay(args, key)

                async def agent(run: str) -> Any:
                    async with ledger.token_attempt(run, ttl=30):
                        return await asyncio.gather(pay(run, {"invoice": "A", "amount": 1}),
                                                    pay(run, {"invoice": "B", "amount": 2}))

                first = await asyncio.gather(*(agent(run) for run in runs))
                again = await asyncio.gather(*(agent(run) for run in runs))
                self.assertEqual(first, again, "the rerun replays every result")
                return first

        asyncio.run(main())
        self.assertEqual(len(bank.calls), 2 * len(runs), "each call paid once, the rerun replayed")
        for run in runs:
            self.assertEqual(len(self.shard_rows(shard_index(run, len(SHARD_DSNS)), run)), 2)

    def test_a_canceled_call_through_the_proxy_stops_the_attempt_as_an_unknown_outcome(self) -> None:
        """A cancel (57014) or a lost shard (08006) through the proxy may follow a commit on
        the shard: the client takes it as an unknown outcome and stops the attempt, instead
        of making the next call (a new occurrence) as after a clean refusal."""
        run = self.run_on(0, "canceled")
        blocker = self.connect(SHARD_DSNS[0])
        worker = psycopg.connect(as_user("agent"), autocommit=True, options="-c statement_timeout=500")
        self.addCleanup(worker.close)
        ledger = Ledger(worker, routed=True)
        performed: List[str] = []
        with self.assertRaises(EffectPaused) as stopped:  # the attempt stops there
            with ledger.attempt(run):
                with blocker.transaction():
                    blocker.execute("LOCK TABLE durable_ledger.effects IN ACCESS EXCLUSIVE MODE")
                    with self.assertRaises(psycopg.Error) as first:
                        ledger.guarded(run, "bank.pay", {"n": 1}, lambda key: performed.append(key))
                    self.assertEqual(first.exception.sqlstate, "57014", str(first.exception))
                ledger.guarded(run, "bank.pay", {"n": 2}, lambda key: performed.append(key))
        self.assertIn("stopped in this attempt", str(stopped.exception))
        self.assertIn("outcome of the statement unknown", str(stopped.exception))
        self.assertEqual(performed, [])
        self.assertEqual(self.shard_rows(0, run), [], "the canceled call wrote nothing, and no other was made")

    def test_routed_reports_go_to_the_runs_shard(self) -> None:
        """A business key that runs of two routing keys used (the routing rules forbid it)
        is on two shards: a report naming its run still lands on its own; one that does
        not (routed=False) is refused by the proxy, and the client stops the attempt."""
        invoice = f"TWICE-{self.tag}"
        runs = [self.run_on(0, "twice"), self.run_on(2, "twice")]
        results = []
        for run, routed in zip(runs, (True, False)):
            with self.connect(as_user("agent")) as conn:
                ledger = Ledger(conn, routed=routed)
                try:
                    with ledger.attempt(run):
                        results.append(ledger.guarded(run, "bank.pay", {"amount": 5},
                                                      lambda key: {"paid": key}, business_key=invoice))
                except OutcomeNotRecorded as e:
                    results.append(type(e).__name__)
        self.assertEqual(results, [{"paid": f"{invoice}#1"}, "OutcomeNotRecorded"])
        statuses = [self.connect(SHARD_DSNS[i]).execute(
            "SELECT status FROM durable_ledger.effects WHERE key = %s", (invoice,)).fetchone()[0] for i in (0, 2)]
        self.assertEqual(statuses, ["completed", "started"])


if __name__ == "__main__":
    unittest.main()
