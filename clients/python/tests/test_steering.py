"""Tests of the Python client against the runs people steer (extension 1.2): a drifted
replay paused as a divergence (`DivergencePaused`), an abandoned run (`RunAbandoned`), a
retired or unregistered tool (`ToolRefused`), and ``Ledger.history``.

DURABLE_LEDGER_DSN must be a superuser connection string of a database with the
extension at version 1.2 (the tests register and retire tools, resolve divergences,
abandon runs, and create login roles of their own, which they drop again).  Every test
uses runs and tool names of its own (uuid), so that the tools registry, which is the
database's, stays out of the other tests' way.

    DURABLE_LEDGER_DSN="dbname=postgres" /usr/bin/python3 -m unittest discover -v -s clients/python/tests
"""

from __future__ import annotations

import asyncio
import os
import sys
import unittest
import uuid
from typing import Any, Dict, List, Optional

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # clients/python, if PYTHONPATH lacks it

from durable_ledger import (  # noqa: E402
    AsyncLedger,
    AwaitingApproval,
    CallKey,
    BudgetExhausted,
    DivergencePaused,
    EffectDidNotHappen,
    EffectFailed,
    EffectPaused,
    InvalidArgument,
    Ledger,
    LedgerError,
    LedgerUsageError,
    PermissionDenied,
    RunAbandoned,
    ToolRefused,
    call_key,
)

from target import ADMIN_DSN, DSN  # noqa: E402  (where the connections go)

HISTORY_COLUMNS = ["id", "logged_at", "lease_epoch", "event", "key", "tool", "args", "attempt",
                   "outcome", "detail", "role_name", "application_name"]


def setUpModule() -> None:
    if not DSN:
        raise unittest.SkipTest("DURABLE_LEDGER_DSN is not set")


class Bank:
    """A downstream system that performs whatever it is asked, and remembers it."""

    def __init__(self) -> None:
        self.calls: List[Dict[str, Any]] = []

    def tool(self, ledger: Ledger, name: str) -> Any:
        @ledger.tool(name)
        def perform(args: Any, key: str) -> Any:
            self.calls.append({"tool": name, "args": args, "key": key})
            return {"paid": args, "n": len(self.calls)}
        return perform


class SteeringTest(unittest.TestCase):

    def setUp(self) -> None:
        self.run_id = f"pysteer-{uuid.uuid4()}"
        self.tag = uuid.uuid4().hex[:12]
        # the ledger's own tables are read where they are (target.py)
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True, application_name="durable-ledger-pytest")
        self.addCleanup(self.admin.close)

    # -------------------------------------------------------------- helpers

    def connect(self, **kwargs: Any) -> "psycopg.Connection[Any]":
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("application_name", "durable-ledger-pytest")
        conn = psycopg.connect(DSN, **kwargs)
        self.addCleanup(conn.close)  # closing the session ends any lease it holds
        return conn

    def ledger(self, **kwargs: Any) -> Ledger:
        return Ledger(self.connect(**kwargs))

    def pool(self, size: int = 2) -> ConnectionPool:
        pool = ConnectionPool(DSN, min_size=size, max_size=size,
                              kwargs={"application_name": "durable-ledger-pytest"})
        self.addCleanup(pool.close)
        pool.wait(timeout=30)
        return pool

    def tool_name(self, name: str) -> str:
        """A tool of this test alone: the registry is the database's."""
        return f"{name}.{self.tag}"

    def register(self, tool: str, **kwargs: Any) -> None:
        extra = "".join(f", {k} => %({k})s" for k in kwargs)
        self.admin.execute(f"SELECT durable_ledger.register_tool(%(tool)s, 'test'{extra})",
                           {"tool": tool, **kwargs})

    def effect_keys(self, run: Optional[str] = None) -> List[str]:
        return [r[0] for r in self.admin.execute(
            "SELECT key FROM durable_ledger.effects WHERE run = %s ORDER BY created_at",
            (run or self.run_id,))]

    def unresolved(self) -> List[Dict[str, Any]]:
        with self.admin.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT key, tool, status, may_duplicate FROM durable_ledger.unresolved "
                        "WHERE run = %s", (self.run_id,))
            return cur.fetchall()

    def login_role(self, *grants: str, settings: Optional[Dict[str, str]] = None) -> str:
        """A login role of this test with the given ledger roles and role settings; it is
        dropped (its settings reset) when the test ends."""
        self.roles = getattr(self, "roles", 0) + 1
        role = f"dl_pytest_{self.tag}_{self.roles}"
        self.admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        self.addCleanup(self.admin.execute,
                        sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
        for grant in grants:
            self.admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(grant),
                                                                sql.Identifier(role)))
        for name, value in (settings or {}).items():
            self.admin.execute(sql.SQL("ALTER ROLE {} SET {} = {}").format(
                sql.Identifier(role), sql.SQL(name), sql.Literal(value)))
            self.addCleanup(self.admin.execute, sql.SQL("ALTER ROLE {} RESET {}").format(
                sql.Identifier(role), sql.SQL(name)))
        return role

    # ------------------------------------------------------------ budgets (1.3)

    def test_a_loop_that_rewords_its_email_is_stopped_at_the_budget(self) -> None:
        # The seeds' onboarding agent: a retry loop sent the same email fourteen times,
        # reworded each time -- each a new call to the ledger, which executes it.  A
        # budget of three emails a run stops the loop at the fourth, not the fifteenth.
        email_tool = self.tool_name("t.email")
        self.register(email_tool)
        self.admin.execute("SELECT durable_ledger.set_budget(%s, 3, 'test')", (email_tool,))
        bank = Bank()
        ledger = self.ledger()
        send = bank.tool(ledger, email_tool)
        stopped: Optional[BudgetExhausted] = None
        with ledger.attempt(self.run_id, model="model-a"):
            for n in range(1, 15):
                try:
                    send(self.run_id, {"to": "ann@example.com",
                                       "body": f"Welcome aboard! (try {n})"})
                except BudgetExhausted as exc:
                    stopped = exc
                    break
        self.assertEqual(len(bank.calls), 3)
        assert stopped is not None
        self.assertIsInstance(stopped, EffectPaused)
        self.assertEqual(stopped.tool, email_tool)
        self.assertIn("its budget of 3 per run", stopped.reason)
        waiting = self.unresolved()
        self.assertEqual([(w["tool"], w["status"]) for w in waiting], [(email_tool, None)])
        # each call carried the attempt's model
        models = [r[0] for r in self.admin.execute(
            "SELECT meta ->> 'model' FROM durable_ledger.effects WHERE run = %s",
            (self.run_id,))]
        self.assertEqual(models, ["model-a"] * 3)

        # a person raises the run's budget: the next attempt replays the three emails
        # and sends the fourth, once, under another model (audited once)
        self.admin.execute("SELECT durable_ledger.set_run_budget(%s, 'ops', 'one more is fine', "
                           "tool => %s, max_executions => 4)", (self.run_id, email_tool))
        self.assertEqual(self.unresolved(), [])
        pool = self.pool()
        pooled = Ledger(pool)
        send_pooled = bank.tool(pooled, email_tool)
        with pooled.token_attempt(self.run_id, ttl=60, model="model-b"):
            for n in range(1, 5):
                send_pooled(self.run_id, {"to": "ann@example.com",
                                          "body": f"Welcome aboard! (try {n})"})
            with self.assertRaises(BudgetExhausted):
                send_pooled(self.run_id, {"to": "ann@example.com", "body": "Welcome! (5)"})
        self.assertEqual(len(bank.calls), 4)
        changes = [r[0] for r in self.admin.execute(
            "SELECT detail FROM durable_ledger.audit_log WHERE run = %s "
            "AND event = 'model_changed'", (self.run_id,))]
        self.assertEqual(changes, [{"from": "model-a", "to": "model-b"}])
        with self.assertRaises(TypeError):
            with ledger.attempt(self.run_id, model=""):
                pass

    # ------------------------------------------------------------ approvals (1.3)

    def test_a_call_that_needs_approval_waits_for_another_login(self) -> None:
        refund_tool = self.tool_name("t.refund")
        self.register(refund_tool)
        self.admin.execute("SELECT durable_ledger.set_approval(%s, 'strict $.amount > 100', 'test')",
                           (refund_tool,))
        bank = Bank()
        first = self.ledger()
        refund = bank.tool(first, refund_tool)
        with first.attempt(self.run_id):
            refund(self.run_id, {"order": 1, "amount": 50})  # under the limit: at once
            with self.assertRaises(AwaitingApproval) as caught:
                refund(self.run_id, {"order": 2, "amount": 500})
            waiting = caught.exception
            self.assertIsInstance(waiting, EffectPaused)  # existing handlers of pauses catch it
            self.assertEqual(waiting.decision, "pause")
            self.assertRegex(waiting.key, r"^[0-9a-f]{64}$")
            self.assertIn("approval", waiting.reason)
            with self.assertRaises(EffectPaused):  # the attempt stops there
                refund(self.run_id, {"order": 3, "amount": 5})
        self.assertEqual([c["args"]["order"] for c in bank.calls], [1])
        self.assertEqual(self.unresolved(), [{"key": waiting.key, "tool": refund_tool,
                                              "status": "awaiting_approval",
                                              "may_duplicate": None}])

        # The role that made the call may not approve it; an approver may.
        with self.assertRaises(psycopg.errors.InsufficientPrivilege):
            self.admin.execute("SELECT durable_ledger.approve_effect(%s, 'me')", (waiting.key,))
        approver = self.connect(user=self.login_role("durable_ledger_approver"))
        row = approver.execute("SELECT status, approver FROM durable_ledger.approve_effect("
                               "%s, 'Alice', 'order 2 checked')", (waiting.key,)).fetchone()
        self.assertEqual(row, ("approved", "Alice"))
        self.assertEqual(self.unresolved(), [])

        # The next attempt replays order 1 and performs the approved order 2, once.
        for _ in range(2):
            again = self.ledger()
            with again.attempt(self.run_id):
                bank.tool(again, refund_tool)(self.run_id, {"order": 1, "amount": 50})
                bank.tool(again, refund_tool)(self.run_id, {"order": 2, "amount": 500})
        self.assertEqual([c["args"]["order"] for c in bank.calls], [1, 2])

        # Rejected: never performed; the next attempt gets EffectFailed.
        other_run = self.run_id + "-rejected"
        with first.attempt(other_run):
            with self.assertRaises(AwaitingApproval) as caught:
                refund(other_run, {"order": 9, "amount": 900})
        approver.execute("SELECT durable_ledger.reject_effect(%s, 'Bob', 'no such order')",
                         (caught.exception.key,))
        later = self.ledger()
        with later.attempt(other_run):
            with self.assertRaises(EffectFailed):
                bank.tool(later, refund_tool)(other_run, {"order": 9, "amount": 900})
        self.assertEqual([c["args"]["order"] for c in bank.calls], [1, 2])

    # ------------------------------------------------------------ divergence

    def test_drifted_replay_raises_divergence_paused_and_stops_the_attempt(self) -> None:
        pay_tool, mail_tool = self.tool_name("t.pay"), self.tool_name("t.mail")
        self.register(pay_tool)
        bank = Bank()

        first = self.ledger()
        with first.attempt(self.run_id):
            receipt = bank.tool(first, pay_tool)(self.run_id, {"invoice": 1, "memo": "a"})
        self.assertEqual(len(bank.calls), 1)
        (earlier,) = self.effect_keys()

        # Attempt 2: the model reworded the memo.  The call is not performed.
        second = self.ledger()
        pay, mail = bank.tool(second, pay_tool), bank.tool(second, mail_tool)
        with second.attempt(self.run_id):
            with self.assertRaises(DivergencePaused) as caught:
                pay(self.run_id, {"invoice": 1, "memo": "b"})
            drift = caught.exception
            self.assertIsInstance(drift, EffectPaused)  # existing handlers of pauses catch it
            self.assertIsInstance(drift, LedgerError)
            self.assertEqual(drift.decision, "pause")
            self.assertEqual(drift.run, self.run_id)
            self.assertEqual(drift.tool, pay_tool)
            self.assertRegex(drift.key, r"^[0-9a-f]{64}$")
            self.assertNotEqual(drift.key, earlier)
            self.assertIn(earlier, drift.reason)  # the effect it may duplicate
            self.assertIn("resolve_divergence", drift.reason)
            self.assertIn(drift.key, str(drift))

            # The attempt stops there: no further call of it performs anything, not the
            # same call, not the original one, not another tool.
            for call, args in ((pay, {"invoice": 1, "memo": "b"}),
                               (pay, {"invoice": 1, "memo": "a"}),
                               (mail, {"to": "ap@example.com"})):
                with self.assertRaises(EffectPaused) as again:
                    call(self.run_id, args)
                self.assertNotIsInstance(again.exception, DivergencePaused)
                self.assertIn("stopped in this attempt", again.exception.reason)
        self.assertEqual(len(bank.calls), 1, bank.calls)
        self.assertEqual(self.effect_keys(), [earlier])
        self.assertEqual(self.unresolved(), [{"key": drift.key, "tool": pay_tool,
                                              "status": None, "may_duplicate": earlier}])

        # A person says it is the same payment: a new attempt gets the recorded result.
        self.admin.execute("SELECT durable_ledger.resolve_divergence(%s, 'same', 'test')",
                           (drift.key,))
        third = self.ledger()
        with third.attempt(self.run_id):
            again_receipt = bank.tool(third, pay_tool)(self.run_id, {"invoice": 1, "memo": "b"})
        self.assertEqual(again_receipt, receipt)
        self.assertEqual(len(bank.calls), 1, bank.calls)
        self.assertEqual(self.unresolved(), [])

    def test_divergence_in_a_token_attempt_then_distinct_executes(self) -> None:
        pay_tool = self.tool_name("t.pay")
        self.register(pay_tool)
        bank = Bank()
        ledger = Ledger(self.pool())
        pay = bank.tool(ledger, pay_tool)

        with ledger.token_attempt(self.run_id, ttl=60):
            pay(self.run_id, {"invoice": 1, "memo": "a"})
        with ledger.token_attempt(self.run_id, ttl=60):
            with self.assertRaises(DivergencePaused) as caught:
                pay(self.run_id, {"invoice": 1, "memo": "b"})
            with self.assertRaises(EffectPaused):
                pay(self.run_id, {"invoice": 2, "memo": "c"})
        self.assertEqual(len(bank.calls), 1, bank.calls)
        self.assertEqual(caught.exception.run, self.run_id)
        self.assertEqual(caught.exception.tool, pay_tool)

        # A person says it is another payment: the next attempt executes it.
        self.admin.execute("SELECT durable_ledger.resolve_divergence(%s, 'distinct', 'test')",
                           (caught.exception.key,))
        with ledger.token_attempt(self.run_id, ttl=60):
            pay(self.run_id, {"invoice": 1, "memo": "b"})
        self.assertEqual([c["args"]["memo"] for c in bank.calls], ["a", "b"])
        self.assertEqual(bank.calls[1]["key"], caught.exception.key)

    # -------------------------------------------------------------- call ids

    def test_call_key_is_the_javascript_clients(self) -> None:
        self.assertEqual(call_key("r/1", "pay", "c"), 'call:["r/1","pay","c"]')
        self.assertEqual(call_key("r", "pay", "é\u2028"), 'call:["r","pay","é\u2028"]')
        self.assertNotEqual(call_key("r", "1/pay", "c"), call_key("r/1", "pay", "c"))
        long_key = call_key("r" * 190, "pay", "c")
        self.assertRegex(long_key, r"^call:sha256:[0-9a-f]{64}$")
        self.assertIsInstance(long_key, CallKey)
        with self.assertRaises(TypeError):
            call_key("r", "pay", "")
        with self.assertRaises(TypeError):
            call_key("r", "pay", "\ud800")  # a lone surrogate (json.loads makes them)

    def test_a_call_named_anew_in_a_later_attempt_pauses_then_same_replays(self) -> None:
        pay_tool = self.tool_name("t.pay")
        ledger = Ledger(self.pool())
        paid: List[str] = []

        def pay(call_id: str, invoice: int) -> Any:
            return ledger.guarded(self.run_id, pay_tool, {"invoice": invoice},
                                  lambda key: paid.append(call_id) or {"paid": call_id},
                                  call_id=call_id)

        with self.assertRaises(TypeError):
            ledger.guarded(self.run_id, pay_tool, {}, lambda key: None,
                           business_key="INV-1", call_id="c")
        with ledger.token_attempt(self.run_id, ttl=60):
            # a call id's key that lost its CallKey (a str operation made it plain) is
            # refused by the ledger, not begun as an operation's business key
            with self.assertRaises(InvalidArgument):
                ledger.guarded(self.run_id, pay_tool, {}, lambda key: paid.append("plain"),
                               business_key=str(call_key(self.run_id, pay_tool, "c"))[:])
        with ledger.token_attempt(self.run_id, ttl=60):
            self.assertEqual(pay("call-a", 7), {"paid": "call-a"})
            self.assertEqual(pay("call-b", 7), {"paid": "call-b"})  # one attempt: a repeat
        with ledger.token_attempt(self.run_id, ttl=60):
            with self.assertRaises(DivergencePaused) as caught:
                pay("call-z", 7)  # the answer was lost: the model named it anew
        self.assertEqual(caught.exception.key, call_key(self.run_id, pay_tool, "call-z"))
        self.assertIn("new call id", caught.exception.reason)
        self.assertEqual(paid, ["call-a", "call-b"])
        self.admin.execute("SELECT durable_ledger.resolve_divergence(%s, 'same', 'test')",
                           (caught.exception.key,))
        with ledger.token_attempt(self.run_id, ttl=60):
            self.assertEqual(pay("call-z", 7), {"paid": "call-a"})
            self.assertEqual(pay("call-a", 7), {"paid": "call-a"})  # replayed by its own id
        # once this attempt replayed both earlier payments, a new id is a repeat
        with ledger.token_attempt(self.run_id, ttl=60):
            self.assertEqual(pay("call-a", 7), {"paid": "call-a"})
            self.assertEqual(pay("call-b", 7), {"paid": "call-b"})
            self.assertEqual(pay("call-c", 7), {"paid": "call-c"})
        self.assertEqual(paid, ["call-a", "call-b", "call-c"])

    async def _async_named_anew(self) -> None:
        pay_tool = self.tool_name("t.pay")
        async with AsyncConnectionPool(DSN, open=False) as pool:
            ledger = AsyncLedger(pool)
            paid: List[str] = []

            async def pay(call_id: str) -> Any:
                return await ledger.guarded(self.run_id, pay_tool, {"invoice": 8},
                                            lambda key: paid.append(call_id) or {"paid": call_id},
                                            call_id=call_id)

            async with ledger.token_attempt(self.run_id, ttl=60):
                await pay("call-a")
            async with ledger.token_attempt(self.run_id, ttl=60):
                with self.assertRaises(DivergencePaused):
                    await pay("call-z")
            self.assertEqual(paid, ["call-a"])

    def test_async_a_call_named_anew_in_a_later_attempt_pauses(self) -> None:
        asyncio.run(self._async_named_anew())

    # -------------------------------------------------------------- abandon

    def test_abandoned_run_raises_run_abandoned_now_and_in_a_new_attempt(self) -> None:
        pay_tool = self.tool_name("t.pay")
        bank = Bank()
        ledger = self.ledger()
        pay = bank.tool(ledger, pay_tool)
        with ledger.attempt(self.run_id):
            pay(self.run_id, {"invoice": 1})
            self.assertTrue(self.admin.execute(
                "SELECT durable_ledger.abandon_run(%s, 'test', 'wrong customer')",
                (self.run_id,)).fetchone()[0])
            with self.assertRaises(RunAbandoned) as caught:
                pay(self.run_id, {"invoice": 2})
            self.assertIsInstance(caught.exception, LedgerError)
            self.assertEqual(caught.exception.run, self.run_id)
            self.assertIsNone(caught.exception.key)
            self.assertIn("abandoned", caught.exception.reason)
            self.assertIn("must not be retried", caught.exception.reason)
            self.assertEqual(getattr(caught.exception.__cause__, "sqlstate", None), "55L02")
            # the attempt stays stopped, without asking the database
            with self.assertRaises(RunAbandoned):
                pay(self.run_id, {"invoice": 1})
        self.assertEqual([c["args"] for c in bank.calls], [{"invoice": 1}])

        # a new attempt, in each way one starts
        with self.assertRaises(RunAbandoned):
            with ledger.attempt(self.run_id):
                self.fail("an attempt of an abandoned run began")
        with self.assertRaises(RunAbandoned):
            ledger.acquire_run(self.run_id)
        fresh = self.ledger()  # a call outside an attempt is refused before anything
        with self.assertRaises(LedgerUsageError):
            bank.tool(fresh, pay_tool)(self.run_id, {"invoice": 3})
        pooled = Ledger(self.pool())
        with self.assertRaises(RunAbandoned):
            with pooled.token_attempt(self.run_id, ttl=60):
                self.fail("a token attempt of an abandoned run began")
        self.assertEqual(len(bank.calls), 1, bank.calls)
        self.assertEqual(len(self.effect_keys()), 1)

    def test_abandoned_during_a_token_attempt(self) -> None:
        bank = Bank()
        ledger = Ledger(self.pool())
        pay = bank.tool(ledger, self.tool_name("t.pay"))
        with self.assertRaises(RunAbandoned):
            with ledger.token_attempt(self.run_id, ttl=60):
                pay(self.run_id, {"invoice": 1})
                self.admin.execute("SELECT durable_ledger.abandon_run(%s, 'test')",
                                   (self.run_id,))
                with self.assertRaises(RunAbandoned):
                    pay(self.run_id, {"invoice": 2})
                pay(self.run_id, {"invoice": 3})  # raises again: the attempt is stopped
        self.assertEqual([c["args"] for c in bank.calls], [{"invoice": 1}])
        self.assertEqual(len(self.effect_keys()), 1)

    # --------------------------------------------------------- refused tools

    def test_retired_tool_raises_tool_refused_and_stops_the_attempt(self) -> None:
        fax_tool, mail_tool = self.tool_name("t.fax"), self.tool_name("t.mail")
        self.register(fax_tool)
        bank = Bank()
        first = self.ledger()
        with first.attempt(self.run_id):
            sent = bank.tool(first, fax_tool)(self.run_id, {"to": "+1 555 0100"})
        self.admin.execute("SELECT durable_ledger.retire_tool(%s, 'test', 'no more faxes')",
                           (fax_tool,))

        second = self.ledger()
        fax, mail = bank.tool(second, fax_tool), bank.tool(second, mail_tool)
        with second.attempt(self.run_id):
            # what the retired tool recorded still replays
            self.assertEqual(fax(self.run_id, {"to": "+1 555 0100"}), sent)
            with self.assertRaises(ToolRefused) as caught:
                fax(self.run_id, {"to": "+1 555 0199"})
            refused = caught.exception
            self.assertIsInstance(refused, LedgerError)
            self.assertNotIsInstance(refused, EffectPaused)
            self.assertEqual((refused.run, refused.tool, refused.key), (self.run_id, fax_tool, None))
            self.assertIn("retired", refused.reason)
            self.assertEqual(getattr(refused.__cause__, "sqlstate", None), "55L03")
            # the attempt stops: another tool's call is not performed either
            with self.assertRaises(EffectPaused) as again:
                mail(self.run_id, {"to": "ap@example.com"})
            self.assertIn("refused", again.exception.reason)
        self.assertEqual(len(bank.calls), 1, bank.calls)
        self.assertEqual(len(self.effect_keys()), 1)

    def test_unregistered_tool_refused_where_the_database_says_so(self) -> None:
        # set_unregistered_tools is the database's (an admin's, audited); the
        # suite runs one test at a time, and it is set back at the end
        registered, unknown = self.tool_name("t.pay"), self.tool_name("t.unknown")
        self.register(registered)
        previous = self.admin.execute(
            "SELECT durable_ledger.set_unregistered_tools('refuse', 'python-test')").fetchone()[0]
        self.addCleanup(self.admin.execute,
                        "SELECT durable_ledger.set_unregistered_tools(%s, 'python-test')", (previous,))
        bank = Bank()
        worker = self.ledger(user=self.login_role("durable_ledger_worker"))
        with worker.attempt(self.run_id):
            with self.assertRaises(ToolRefused) as caught:
                bank.tool(worker, unknown)(self.run_id, {"invoice": 1})
            self.assertEqual(caught.exception.tool, unknown)
            self.assertIn("not registered", caught.exception.reason)
            with self.assertRaises(EffectPaused):
                bank.tool(worker, registered)(self.run_id, {"invoice": 1})
        self.assertEqual(bank.calls, [])
        self.assertEqual(self.effect_keys(), [])

        # a registered tool executes under refuse, in a new attempt
        with worker.attempt(self.run_id):
            bank.tool(worker, registered)(self.run_id, {"invoice": 1})
        self.assertEqual([c["tool"] for c in bank.calls], [registered])

    # -------------------------------------------------------------- history

    def test_history_lists_the_run_in_order(self) -> None:
        pay_tool, refund_tool = self.tool_name("t.pay"), self.tool_name("t.refund")
        bank = Bank()

        def refuse(args: Any, key: str) -> Any:
            raise EffectDidNotHappen({"code": "closed"})

        ledger = self.ledger()
        pay = bank.tool(ledger, pay_tool)
        refund = ledger.tool(refund_tool)(refuse)
        with ledger.attempt(self.run_id):
            receipt = pay(self.run_id, {"invoice": 1, "amount": 10})
            with self.assertRaises(EffectFailed):
                refund(self.run_id, {"invoice": 1})
        with ledger.attempt(self.run_id):
            self.assertEqual(pay(self.run_id, {"invoice": 1, "amount": 10}), receipt)

        rows = ledger.history(self.run_id)
        self.assertIsInstance(rows, list)
        for row in rows:
            self.assertEqual(list(row), HISTORY_COLUMNS)
        self.assertEqual([r["id"] for r in rows], sorted(r["id"] for r in rows))
        self.assertEqual(
            [(r["lease_epoch"], r["event"], r["tool"], r["args"], r["attempt"], r["outcome"])
             for r in rows],
            [(1, "lease_acquired", None, None, None, None),
             (1, "intent", pay_tool, {"invoice": 1, "amount": 10}, 1, None),
             (1, "completed", pay_tool, {"invoice": 1, "amount": 10}, 1, receipt),
             (1, "intent", refund_tool, {"invoice": 1}, 1, None),
             (1, "failed", refund_tool, {"invoice": 1}, 1, {"code": "closed"}),
             (1, "lease_released", None, None, None, None),
             (2, "lease_acquired", None, None, None, None),
             (2, "replay", pay_tool, {"invoice": 1, "amount": 10}, 1, receipt),
             (2, "lease_released", None, None, None, None)])
        pay_key, refund_key = self.effect_keys()
        self.assertEqual([r["key"] for r in rows if r["tool"] == pay_tool], [pay_key] * 3)
        self.assertEqual([r["key"] for r in rows if r["tool"] == refund_tool], [refund_key] * 2)
        self.assertTrue(all(r["application_name"] == "durable-ledger-pytest" for r in rows))

        # on a pool, the same rows; a run never seen has none
        pooled = Ledger(self.pool())
        self.assertEqual(pooled.history(self.run_id), rows)
        self.assertEqual(pooled.history(f"{self.run_id}-never"), [])

    def test_history_needs_the_auditor_role(self) -> None:
        ledger = self.ledger()
        with ledger.attempt(self.run_id):
            Bank().tool(ledger, self.tool_name("t.pay"))(self.run_id, {"invoice": 1})
        auditor = Ledger(self.connect(user=self.login_role("durable_ledger_auditor")))
        self.assertEqual([r["event"] for r in auditor.history(self.run_id)],
                         ["lease_acquired", "intent", "completed", "lease_released"])
        worker = Ledger(self.connect(user=self.login_role("durable_ledger_worker")))
        with self.assertRaises(PermissionDenied) as denied:  # 42501, named
            worker.history(self.run_id)
        self.assertIsInstance(denied.exception.__cause__, psycopg.errors.InsufficientPrivilege)


if __name__ == "__main__":
    unittest.main()
