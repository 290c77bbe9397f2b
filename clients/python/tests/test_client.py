"""Tests of the durable_ledger Python client against a real server.

DURABLE_LEDGER_DSN must name a database where ``CREATE EXTENSION durable_ledger`` has
been run, as a superuser (some tests resolve effects and read the leases view).  Every
test uses runs and business keys of its own (uuid), and closes its connections, which
ends their leases.

    DURABLE_LEDGER_DSN="dbname=postgres" /usr/bin/python3 -m unittest discover -v -s clients/python/tests
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Any, List

import psycopg
from psycopg.types.json import Jsonb

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # clients/python, if PYTHONPATH lacks it

from durable_ledger import (  # noqa: E402
    AttemptStopped,
    BusinessKeyConflict,
    EffectDidNotHappen,
    EffectFailed,
    EffectInProgress,
    EffectPaused,
    InvalidArgument,
    LeaseLost,
    Ledger,
    LedgerError,
    LedgerRefused,
    LedgerUsageError,
    OutcomeNotRecorded,
    PermissionDenied,
    RunBusy,
    ToolRefused,
    side_effect,
)

from target import (ADMIN_DSN, DSN, ERROR_ENDS_SESSION_LEASE, drop_leases,  # noqa: E402
                    ledger_backend, session_backends)
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "agent_loop.py")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def setUpModule() -> None:
    if not DSN:
        raise unittest.SkipTest("DURABLE_LEDGER_DSN is not set")


class Recorder:
    """A side effect that remembers every call: the downstream system of the tests."""

    def __init__(self, result: Any = None, raises: BaseException | None = None) -> None:
        self.keys: List[str] = []
        self.result = result
        self.raises = raises

    def __call__(self, key: str) -> Any:
        self.keys.append(key)
        if self.raises is not None:
            raise self.raises
        return self.result


class Parked:
    """A side effect that waits at the bank until ``go`` is set, then returns or raises."""

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.keys: List[str] = []
        self.entered = threading.Event()
        self.go = threading.Event()

    def __call__(self, key: str) -> Any:
        self.keys.append(key)
        self.entered.set()
        if not self.go.wait(60):
            raise TimeoutError("never let go")
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class ClientTest(unittest.TestCase):

    def setUp(self) -> None:
        self.run_id = f"pytest-{uuid.uuid4()}"
        # the ledger's own tables are read where they are (target.py)
        self.admin = psycopg.connect(ADMIN_DSN, autocommit=True, application_name="durable-ledger-pytest")
        self.addCleanup(self.admin.close)

    def connect(self, autocommit: bool = True) -> "psycopg.Connection[Any]":
        conn = psycopg.connect(DSN, autocommit=autocommit, application_name="durable-ledger-pytest")
        self.addCleanup(conn.close)  # closing the session ends any lease it holds
        return conn

    def ledger(self, run: Optional[str] = "") -> Ledger:
        """A new worker: a new connection (a new session) that starts an attempt at
        ``run`` (by default this test's run; None: at no run yet), as every attempt
        must: the client takes no lease implicitly."""
        ledger = Ledger(self.connect())
        if run is not None:
            self.assertTrue(ledger.acquire_run(run or self.run_id, wait=False),
                            "the run is held by another session")
        return ledger

    def wait_gone(self, pids: List[int]) -> None:
        """A closed connection's backends end (and drop its leases) asynchronously: poll
        until they have left pg_stat_activity (their locks go before), 60 s at most.
        ``pids``: target.session_backends of the connection, taken before it closed."""
        deadline = time.monotonic() + 60
        while self.admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)",
                                 (pids,)).fetchone():
            if time.monotonic() > deadline:
                self.fail(f"backends {pids} did not end")
            time.sleep(0.01)

    def close(self, ledger: Ledger) -> None:
        pids = session_backends(ledger.conn)
        ledger.conn.close()
        self.wait_gone(pids)

    def row(self, key: str) -> dict:
        with self.admin.cursor(row_factory=psycopg.rows.dict_row) as cur:
            cur.execute("SELECT * FROM durable_ledger.effect_status(%s)", (key,))
            row = cur.fetchone()
        self.assertIsNotNone(row, f"no effect row for {key}")
        return row

    def effect_count(self, run: str) -> int:
        return self.admin.execute("SELECT count(*) FROM durable_ledger.effects WHERE run = %s",
                                  (run,)).fetchone()[0]

    def derived_key(self, tool: str, args: Any, occurrence: int = 1) -> str:
        return self.admin.execute("SELECT durable_ledger.effect_key(%s, %s, %s, %s)",
                                  (self.run_id, tool, Jsonb(args), occurrence)).fetchone()[0]

    # ------------------------------------------------------------- execute

    def test_execute_completes_and_records_result(self) -> None:
        args = {"invoice": "INV-9", "amount": 4200, "currency": "USD"}
        pay = Recorder({"payment_id": "pay_81"})
        result = self.ledger().guarded(self.run_id, "bank.pay", args, pay,
                                       meta={"model": "test-model"})
        self.assertEqual(result, {"payment_id": "pay_81"})
        self.assertEqual(len(pay.keys), 1)
        key = pay.keys[0]
        self.assertEqual(key, self.derived_key("bank.pay", args))
        row = self.row(key)
        self.assertEqual(row["status"], "completed")
        self.assertEqual(row["result"], {"payment_id": "pay_81"})
        self.assertEqual(row["meta"], {"model": "test-model"})
        self.assertEqual(row["tool"], "bank.pay")

    def test_execute_returns_recorded_value(self) -> None:
        # the first run gets what a replay will get: the JSON the ledger recorded
        ledger = self.ledger()
        first = ledger.guarded(self.run_id, "t", {}, Recorder(("a", 1)))
        self.assertEqual(first, ["a", 1])
        nothing = ledger.guarded(self.run_id, "t2", {}, Recorder(None))
        self.assertIsNone(nothing)
        self.assertEqual(self.row(self.derived_key("t2", {}))["status"], "completed")

    # -------------------------------------------------------------- replay

    def test_replay_returns_recorded_result_without_performing(self) -> None:
        args = {"invoice": "INV-1", "amount": 10}
        first = self.ledger()
        self.assertEqual(first.guarded(self.run_id, "bank.pay", args, Recorder({"id": 1})), {"id": 1})
        self.close(first)  # the worker dies after the payment; a new one takes over
        again = Recorder({"id": 2})
        result = self.ledger().guarded(self.run_id, "bank.pay", args, again)
        self.assertEqual(result, {"id": 1})
        self.assertEqual(again.keys, [], "perform was called on a replay")

    def test_replay_with_args_in_another_key_order(self) -> None:
        ledger = self.ledger()
        ledger.guarded(self.run_id, "bank.pay", {"invoice": "INV-2", "amount": 4200,
                                                 "currency": "USD"}, Recorder({"id": "p1"}))
        self.assertTrue(ledger.release_run(self.run_id))  # a new attempt, same connection
        self.assertTrue(ledger.acquire_run(self.run_id))
        again = Recorder({"id": "p2"})
        result = ledger.guarded(self.run_id, "bank.pay",
                                {"currency": "USD", "amount": 4200.0, "invoice": "INV-2"}, again)
        self.assertEqual(result, {"id": "p1"})
        self.assertEqual(again.keys, [])

    def test_again_is_not_twice(self) -> None:
        # the same call twice in one attempt is two effects; a replay maps onto both, in order
        ledger = self.ledger()
        args = {"to": "ACME", "amount": 5}
        first = Recorder({"n": 1})
        second = Recorder({"n": 2})
        self.assertEqual(ledger.guarded(self.run_id, "bank.pay", args, first), {"n": 1})
        self.assertEqual(ledger.guarded(self.run_id, "bank.pay", args, second), {"n": 2})
        self.assertNotEqual(first.keys, second.keys)
        self.assertEqual(second.keys, [self.derived_key("bank.pay", args, 2)])
        self.close(ledger)  # this worker ends; the next one replays the run
        replay = self.ledger()
        never = Recorder({"n": 99})
        self.assertEqual(replay.guarded(self.run_id, "bank.pay", args, never), {"n": 1})
        self.assertEqual(replay.guarded(self.run_id, "bank.pay", args, never), {"n": 2})
        self.assertEqual(never.keys, [])

    # ------------------------------------------------------------- failure

    def test_did_not_happen_records_failure(self) -> None:
        error = {"code": "card_declined"}
        pay = Recorder(raises=EffectDidNotHappen(error))
        with self.assertRaises(EffectFailed) as caught:
            self.ledger().guarded(self.run_id, "bank.pay", {"amount": 1}, pay)
        failed = caught.exception
        self.assertIsInstance(failed, LedgerError)
        self.assertFalse(failed.replayed)
        self.assertEqual(failed.error, error)
        self.assertEqual(failed.key, pay.keys[0])
        self.assertEqual(failed.decision, "execute")
        row = self.row(pay.keys[0])
        self.assertEqual(row["status"], "failed")
        self.assertEqual(row["error"], error)

    def test_replayed_failure_raises_and_next_call_executes(self) -> None:
        args = {"amount": 1}
        first = self.ledger()
        self.assertRaises(EffectFailed, first.guarded, self.run_id, "bank.pay", args,
                          Recorder(raises=EffectDidNotHappen({"code": "declined"})))
        self.close(first)
        ledger = self.ledger()
        never = Recorder({"paid": True})
        with self.assertRaises(EffectFailed) as caught:
            ledger.guarded(self.run_id, "bank.pay", args, never)
        self.assertTrue(caught.exception.replayed)
        self.assertEqual(caught.exception.decision, "replay")
        self.assertEqual(caught.exception.error, {"code": "declined"})
        self.assertTrue(caught.exception.reason)
        self.assertEqual(never.keys, [])
        # to try again, call again: the next occurrence, a key of its own
        retry = Recorder({"paid": True})
        self.assertEqual(ledger.guarded(self.run_id, "bank.pay", args, retry), {"paid": True})
        self.assertEqual(retry.keys, [self.derived_key("bank.pay", args, 2)])

    # ------------------------------------------------------ unknown outcome

    def test_unknown_outcome_is_not_guessed_and_next_attempt_pauses(self) -> None:
        ledger = self.ledger()
        boom = TimeoutError("bank did not answer")
        pay = Recorder(raises=boom)
        with self.assertRaises(TimeoutError) as caught:
            ledger.guarded(self.run_id, "bank.pay", {"amount": 7}, pay)
        self.assertIs(caught.exception, boom)
        key = pay.keys[0]
        self.assertEqual(self.row(key)["status"], "started")  # not failed: never guessed
        self.assertIsNone(self.row(key)["error"])
        self.close(ledger)
        self.assertEqual(self.row(key)["status"], "unknown")

        never = Recorder({"paid": True})
        with self.assertRaises(EffectPaused) as paused:
            self.ledger().guarded(self.run_id, "bank.pay", {"amount": 7}, never)
        self.assertEqual(paused.exception.key, key)
        self.assertEqual(paused.exception.decision, "pause")
        self.assertIn("unknown", paused.exception.reason)
        self.assertEqual(never.keys, [])

    def test_same_attempt_stops_after_unknown_outcome_or_pause(self) -> None:
        # retrying in the same attempt would be occurrence 2, a new key: it must not execute
        ledger = self.ledger()
        pay = Recorder(raises=ConnectionResetError("reset by peer"))
        self.assertRaises(ConnectionResetError, ledger.guarded,
                          self.run_id, "bank.pay", {"amount": 3}, pay)
        never = Recorder({"paid": True})
        for tool in ("bank.pay", "mail.send"):
            with self.assertRaises(EffectPaused) as paused:
                ledger.guarded(self.run_id, tool, {"amount": 3}, never)
            self.assertEqual(paused.exception.key, pay.keys[0])
        self.assertEqual(never.keys, [])
        self.assertEqual(self.effect_count(self.run_id), 1)

        # the same after a pause from the ledger: a new connection, paused, asked again
        self.close(ledger)
        other = self.ledger()
        for _ in range(2):
            with self.assertRaises(EffectPaused):
                other.guarded(self.run_id, "bank.pay", {"amount": 3}, never)
        self.assertEqual(never.keys, [])
        self.assertEqual(self.effect_count(self.run_id), 1)

    def test_resolve_turns_pause_into_replay(self) -> None:
        first = self.ledger()
        pay = Recorder(raises=TimeoutError())
        self.assertRaises(TimeoutError, first.guarded, self.run_id, "bank.pay", {"amount": 9}, pay)
        self.close(first)
        ledger = self.ledger()
        never = Recorder({"payment_id": "wrong"})
        self.assertRaises(EffectPaused, ledger.guarded, self.run_id, "bank.pay", {"amount": 9}, never)
        self.admin.execute(
            "SELECT durable_ledger.resolve_effect(%s, 'completed', %s, 'pytest', 'found at the bank')",
            (pay.keys[0], Jsonb({"payment_id": "pay_found"})))
        self.assertTrue(ledger.release_run(self.run_id))  # a new attempt
        self.assertTrue(ledger.acquire_run(self.run_id))
        self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"amount": 9}, never),
                         {"payment_id": "pay_found"})
        self.assertEqual(never.keys, [])

    def test_outcome_not_recorded_when_connection_breaks(self) -> None:
        ledger = self.ledger()
        pids = session_backends(ledger.conn)

        def pay(key: str) -> Any:
            ledger.conn.close()  # the worker's connection dies while the bank pays
            return {"payment_id": "pay_lost"}

        with self.assertRaises(OutcomeNotRecorded) as caught:
            ledger.guarded(self.run_id, "bank.pay", {"amount": 4}, pay)
        self.assertEqual(caught.exception.result, {"payment_id": "pay_lost"})
        key = caught.exception.key
        self.wait_gone(pids)
        self.assertEqual(self.row(key)["status"], "unknown")
        self.assertRaises(EffectPaused, self.ledger().guarded, self.run_id, "bank.pay",
                          {"amount": 4}, Recorder())

    def test_contradicting_completion_raises(self) -> None:
        ledger = self.ledger()

        def pay(key: str) -> Any:
            # someone else reports this very effect with another result first
            ledger.conn.execute("SELECT durable_ledger.complete_effect(%s, %s)",
                                (key, Jsonb({"payment_id": "A"})))
            return {"payment_id": "B"}

        with self.assertRaises(OutcomeNotRecorded) as caught:
            ledger.guarded(self.run_id, "bank.pay", {"amount": 5}, pay)
        self.assertEqual(caught.exception.result, {"payment_id": "B"})
        row = self.row(caught.exception.key)
        self.assertTrue(row["conflict"])
        self.assertEqual(row["result"], {"payment_id": "A"})

    def test_unserialisable_result_is_not_recorded(self) -> None:
        ledger = self.ledger()
        with self.assertRaises(OutcomeNotRecorded) as caught:
            ledger.guarded(self.run_id, "t", {}, Recorder(object()))
        self.assertEqual(self.row(caught.exception.key)["status"], "started")
        self.assertIsInstance(caught.exception.__cause__, Exception)

    # ------------------------------------------- reports name their attempt

    def audit(self, key: str) -> List[tuple]:
        """(event, attempt) of every audit row of key, in order."""
        return self.admin.execute(
            "SELECT event::text, attempt FROM durable_ledger.audit_log WHERE key = %s ORDER BY id",
            (key,)).fetchall()

    def declined_first_attempt(self, invoice: str, args: Any) -> None:
        """Attempt 1 of business key ``invoice``: the bank declines, the client records it."""
        declined = Recorder(raises=EffectDidNotHappen({"code": "declined"}))
        with self.assertRaises(EffectFailed):
            self.ledger(f"{self.run_id}-{invoice}").guarded(
                f"{self.run_id}-{invoice}", "bank.pay", args, declined, business_key=invoice)
        row = self.row(invoice)
        self.assertEqual((row["attempt"], row["status"]), (1, "failed"))

    def test_report_on_retried_business_key_lands_on_its_attempt_without_the_lease(self) -> None:
        # Attempt 1 was declined; attempt 2 is executed by another worker whose connection
        # loses the lease that began attempt 2 while the bank pays (a pooler resets it):
        # this connection no longer holds that lease, so only the attempt number the
        # report carries can tie it to attempt 2.
        invoice = f"INV-{uuid.uuid4()}"
        args = {"invoice": invoice, "amount": 70}
        self.declined_first_attempt(invoice, args)
        ledger = self.ledger()

        def pay(key: str) -> Any:
            drop_leases(ledger.conn)  # the lease is gone
            return {"payment_id": "pay_2"}

        self.assertEqual(ledger.guarded(self.run_id, "bank.pay", args, pay, business_key=invoice),
                         {"payment_id": "pay_2"})
        row = self.row(invoice)
        self.assertEqual((row["attempt"], row["status"], row["conflict"], row["result"]),
                         (2, "completed", False, {"payment_id": "pay_2"}))
        self.assertEqual(self.audit(invoice), [("intent", 1), ("failed", 1), ("intent", 2),
                                               ("late_completion", 2)])

        # the same report without its attempt would not be applied: a flagged conflict
        other = f"INV-{uuid.uuid4()}"
        args = {"invoice": other, "amount": 70}
        self.declined_first_attempt(other, args)
        raw = self.connect()
        raw.execute("SELECT durable_ledger.acquire_run(%s)", (f"{self.run_id}-raw",))
        self.assertEqual(raw.execute(
            "SELECT decision, attempt FROM durable_ledger.begin_effect(%s, 'bank.pay', %s, %s)",
            (f"{self.run_id}-raw", Jsonb(args), other)).fetchone(), ("execute", 2))
        drop_leases(raw)
        raw.execute("SELECT durable_ledger.complete_effect(%s, %s)", (other, Jsonb({"payment_id": "x"})))
        row = self.row(other)
        self.assertEqual((row["attempt"], row["conflict"], row["result"]), (2, True, None))
        self.assertNotEqual(row["status"], "completed")

    def interleave(self, invoice: str, args: Any, first_outcome: Any) -> tuple:
        """Two attempts of business key ``invoice`` through one Ledger, run and lease.

        Attempt 1 waits at the bank while the bank's webhook records it as declined
        (another connection); the agent then retries, which executes attempt 2 under the
        same lease, and it waits at the bank too; only then does attempt 1's own report
        (``first_outcome``: a refusal or a payment) arrive, on the connection that holds
        the lease that began attempt 2.  Returns (attempt 1's exception, the effect row
        right after it, the second perform, the second call's future, the pool).
        """
        ledger = self.ledger()
        webhook = self.connect()
        first, second = Parked(first_outcome), Parked({"payment_id": "pay_2"})
        pool = ThreadPoolExecutor(2)
        self.addCleanup(pool.shutdown)
        self.addCleanup(second.go.set)  # never leave a thread waiting at the bank
        self.addCleanup(first.go.set)
        one = pool.submit(ledger.guarded, self.run_id, "bank.pay", args, first, business_key=invoice)
        self.assertTrue(first.entered.wait(30), "attempt 1 never reached the bank")
        webhook.execute("SELECT durable_ledger.fail_effect(%s, %s, 1)",
                        (invoice, Jsonb({"code": "declined"})))
        two = pool.submit(ledger.guarded, self.run_id, "bank.pay", args, second, business_key=invoice)
        self.assertTrue(second.entered.wait(30), "attempt 2 never reached the bank")
        # each attempt reaches the provider with a key of its own (a provider that keeps
        # its answer to a key would answer attempt 2 with attempt 1's decline)
        self.assertEqual((first.keys, second.keys), ([f"{invoice}#1"], [f"{invoice}#2"]))
        first.go.set()
        error = one.exception(timeout=30)
        return error, self.row(invoice), second, two

    def test_late_refusal_of_attempt_1_never_decides_attempt_2(self) -> None:
        # Without its attempt, attempt 1's refusal would be applied to attempt 2 here (this
        # session holds the lease that began attempt 2): attempt 2, whose payment is in
        # flight, would be "failed", and a third attempt could pay again.
        invoice = f"INV-{uuid.uuid4()}"
        args = {"invoice": invoice, "amount": 71}
        error, row, second, two = self.interleave(invoice, args,
                                                  EffectDidNotHappen({"code": "declined"}))
        self.assertIsInstance(error, EffectFailed)  # the refusal is on record: accepted
        self.assertFalse(error.replayed)
        self.assertEqual(error.error, {"code": "declined"})
        self.assertEqual((row["attempt"], row["status"], row["conflict"], row["error"]),
                         (2, "started", False, None))
        second.go.set()
        self.assertEqual(two.result(timeout=30), {"payment_id": "pay_2"})
        row = self.row(invoice)
        self.assertEqual((row["attempt"], row["status"], row["conflict"], row["result"]),
                         (2, "completed", False, {"payment_id": "pay_2"}))
        self.assertEqual(self.audit(invoice), [("intent", 1), ("failed", 1), ("intent", 2),
                                               ("completed", 2)])
        self.assertEqual(self.admin.execute(
            "SELECT attempt, status::text, error FROM durable_ledger.past_attempts WHERE key = %s",
            (invoice,)).fetchall(), [(1, "failed", {"code": "declined"})])

    def test_late_completion_of_replaced_attempt_is_kept_as_conflict_not_applied(self) -> None:
        # The bank did pay attempt 1, though the webhook said it declined: the client's
        # completion of attempt 1 arrives while attempt 2 is in flight.  Without its
        # attempt it would complete attempt 2 with attempt 1's payment; with it, it is
        # evidence of a double payment, kept as a conflict for a person.
        invoice = f"INV-{uuid.uuid4()}"
        args = {"invoice": invoice, "amount": 72}
        error, row, second, two = self.interleave(invoice, args, {"payment_id": "pay_1"})
        self.assertIsInstance(error, OutcomeNotRecorded)
        self.assertEqual(error.result, {"payment_id": "pay_1"})
        self.assertEqual((row["attempt"], row["status"], row["conflict"], row["result"]),
                         (2, "started", True, None))
        conflict = self.admin.execute(
            "SELECT attempt, detail->'result' FROM durable_ledger.audit_log"
            " WHERE key = %s AND event = 'conflict'", (invoice,)).fetchall()
        self.assertEqual(conflict, [(1, {"payment_id": "pay_1"})])
        second.go.set()
        self.assertIsInstance(two.exception(timeout=30), OutcomeNotRecorded)  # still flagged
        row = self.row(invoice)
        self.assertEqual(row["attempt"], 2)
        self.assertNotEqual(row["result"], {"payment_id": "pay_1"})
        self.assertTrue(row["conflict"])
        self.assertEqual(self.admin.execute(
            "SELECT count(*) FROM durable_ledger.unresolved WHERE key = %s", (invoice,)).fetchone()[0], 1)

    # --------------------------------------------------------- in progress

    def test_in_progress_with_business_key_held_elsewhere(self) -> None:
        invoice = f"INV-{uuid.uuid4()}"
        holder = self.connect()
        holder.execute("SELECT durable_ledger.acquire_run(%s)", (f"{self.run_id}-other",))
        key = holder.execute(
            "SELECT key FROM durable_ledger.begin_effect(%s, 'bank.pay', %s, %s)",
            (f"{self.run_id}-other", Jsonb({"invoice": invoice}), invoice)).fetchone()[0]
        self.assertEqual(key, invoice)
        ledger = self.ledger()
        never = Recorder({"paid": "twice"})
        with self.assertRaises(EffectInProgress) as caught:
            ledger.guarded(self.run_id, "bank.pay", {"invoice": invoice}, never, business_key=invoice)
        self.assertEqual(caught.exception.key, invoice)
        self.assertEqual(caught.exception.decision, "in_progress")
        self.assertTrue(caught.exception.reason)
        self.assertEqual(never.keys, [])
        # the other worker finishes; asking again (same attempt) replays its outcome
        holder.execute("SELECT durable_ledger.complete_effect(%s, %s)", (invoice, Jsonb({"paid": "once"})))
        self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"invoice": invoice}, never,
                                        business_key=invoice), {"paid": "once"})
        self.assertEqual(never.keys, [])

    # ----------------------------------------------------------- decorator

    def test_decorator_passes_key_as_idempotency_key(self) -> None:
        ledger = self.ledger()
        sent: List[tuple] = []

        @ledger.tool("mail.send")
        def send_email(args: dict, idempotency_key: str) -> dict:
            """Sends an email."""
            sent.append((args, idempotency_key))
            return {"message_id": f"m{len(sent)}"}

        args = {"to": "a@example.com", "subject": "hi"}
        self.assertEqual(send_email(self.run_id, args), {"message_id": "m1"})
        self.assertEqual(send_email.__name__, "send_email")
        self.assertEqual(send_email.__doc__, "Sends an email.")
        self.assertEqual(len(sent), 1)
        self.assertEqual(sent[0][0], args)
        key = sent[0][1]
        self.assertRegex(key, HEX64)
        self.assertEqual(key, self.derived_key("mail.send", args))
        self.assertEqual(self.row(key)["tool"], "mail.send")
        self.assertEqual(self.row(key)["result"], {"message_id": "m1"})

        ledger.release_run(self.run_id)  # a new attempt replays
        ledger.acquire_run(self.run_id)
        self.assertEqual(send_email(self.run_id, dict(reversed(list(args.items())))), {"message_id": "m1"})
        self.assertEqual(len(sent), 1)

    def test_side_effect_decorator_with_business_key(self) -> None:
        ledger = self.ledger()
        invoice = f"INV-{uuid.uuid4()}"
        keys: List[str] = []

        @side_effect(ledger, "bank.pay", business_key=lambda a: a["invoice"])
        def pay(args: dict, idempotency_key: str) -> dict:
            keys.append(idempotency_key)
            return {"paid": args["invoice"]}

        self.assertEqual(pay(self.run_id, {"invoice": invoice}), {"paid": invoice})
        self.assertEqual(keys, [f"{invoice}#1"])
        self.assertTrue(self.row(invoice)["business_key"])
        # another run, another worker: the business key is one operation across runs
        other = self.ledger(f"{self.run_id}-b")
        pay_elsewhere = other.tool("bank.pay", business_key=lambda a: a["invoice"])(pay.perform)
        self.assertEqual(pay_elsewhere(f"{self.run_id}-b", {"invoice": invoice}), {"paid": invoice})
        self.assertEqual(keys, [f"{invoice}#1"])

    def test_decorated_failure_and_read_only_tool(self) -> None:
        ledger = self.ledger()
        lookups: List[str] = []

        def lookup(invoice: str) -> str:  # read-only: not decorated, never in the ledger
            lookups.append(invoice)
            return "due"

        @ledger.tool("bank.pay")
        def pay(args: dict, idempotency_key: str) -> dict:
            raise EffectDidNotHappen({"code": "closed"})

        self.assertEqual(lookup("INV-1"), "due")
        with self.assertRaises(EffectFailed) as caught:
            pay(self.run_id, {"invoice": "INV-1"})
        self.assertEqual(caught.exception.error, {"code": "closed"})
        self.assertEqual(self.effect_count(self.run_id), 1)
        self.assertEqual(self.row(caught.exception.key)["tool"], "bank.pay")

    # -------------------------------------------------------- connections

    def test_non_autocommit_connection_refused(self) -> None:
        with self.assertRaises(LedgerUsageError) as caught:
            Ledger(self.connect(autocommit=False))
        self.assertIn("autocommit", str(caught.exception))

        ledger = self.ledger()
        never = Recorder({"x": 1})
        with ledger.conn.transaction():
            self.assertRaises(LedgerUsageError, ledger.guarded, self.run_id, "t", {}, never)
        ledger.conn.autocommit = False
        self.assertRaises(LedgerUsageError, ledger.guarded, self.run_id, "t", {}, never)
        self.assertEqual(never.keys, [])
        self.assertEqual(self.effect_count(self.run_id), 0)

    def test_a_report_that_ran_inside_a_tools_transaction_is_not_recorded(self) -> None:
        # A tool opens a transaction on the Ledger's connection while the effect is
        # performed (a parallel tool call, say): the completion then runs inside that
        # transaction, and would vanish with its ROLLBACK although the call had returned
        # the result as recorded.  It is not sent at all.
        ledger = self.ledger()

        def send(key: str) -> Any:
            ledger.conn.execute("BEGIN")  # another tool's transaction on the shared connection
            return {"message_id": "m1"}

        with self.assertRaises(OutcomeNotRecorded) as caught:
            ledger.guarded(self.run_id, "mail.send", {"to": "a"}, send)
        ledger.conn.execute("ROLLBACK")
        self.assertEqual(caught.exception.result, {"message_id": "m1"})
        self.assertIn("was not sent", str(caught.exception))
        self.assertEqual(self.row(caught.exception.key)["status"], "started")
        never = Recorder({"x": 1})
        with self.assertRaises(EffectPaused):  # the run stops in this attempt
            ledger.guarded(self.run_id, "mail.send", {"to": "a"}, never)
        self.assertEqual(never.keys, [])

    def test_acquire_release_and_attempt(self) -> None:
        def holder() -> Any:
            row = self.admin.execute("SELECT holder_pid FROM durable_ledger.leases WHERE run = %s",
                                     (self.run_id,)).fetchone()
            return row and row[0]

        ledger = self.ledger(None)
        pid = ledger_backend(ledger.conn, self.run_id)
        with ledger.attempt(self.run_id) as run:
            self.assertEqual(run, self.run_id)
            self.assertEqual(holder(), pid)
            busy = self.ledger(None)
            self.assertFalse(busy.acquire_run(self.run_id, wait=False))
            with self.assertRaises(RunBusy):
                with busy.attempt(self.run_id, wait=False):
                    self.fail("entered an attempt on a run held elsewhere")
        self.assertIsNone(holder())

        with self.assertRaises(KeyError):
            with ledger.attempt(self.run_id):
                self.assertEqual(holder(), pid)
                raise KeyError("the agent crashed")
        self.assertIsNone(holder(), "the lease outlived a failed attempt")

        self.assertTrue(ledger.acquire_run(self.run_id))
        self.assertTrue(ledger.release_run(self.run_id))
        self.assertFalse(ledger.release_run(self.run_id))

    def test_effect_status(self) -> None:
        ledger = self.ledger()
        self.assertIsNone(ledger.effect_status("0" * 64))
        pay = Recorder({"ok": True})
        ledger.guarded(self.run_id, "t", [1, 2], pay)
        status = ledger.effect_status(pay.keys[0])
        self.assertEqual(status["status"], "completed")
        self.assertEqual(status["args"], [1, 2])

    # -------------------------------------------------------------- example

    def test_example_agent_loop_runs(self) -> None:
        proc = subprocess.run([sys.executable, EXAMPLE, "--dsn", DSN, "--run", self.run_id],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        out = proc.stdout
        first, _, second = out.partition("== attempt 2")
        self.assertIn("== attempt 1", first)
        self.assertEqual(first.count("EXECUTED"), 3, out)
        self.assertEqual(first.count("REFUSED downstream"), 1, out)
        self.assertEqual(second.count("EXECUTED"), 0, out)
        self.assertEqual(second.count("replayed (not performed)"), 4, out)  # 3 results, 1 failure
        self.assertEqual(second.count("failure replayed"), 1, out)
        self.assertEqual(out.count("read-only (no ledger)"), 6, out)
        self.assertIn("downstream calls made in this attempt: 0", second)
        self.assertIn("bank payments 1, bank refusals 1, emails sent 2", out)
        self.assertRegex(out, r"(?m)^ok - ")
        # read-only tools bypass the ledger: 2 payments and 2 emails recorded, nothing else
        tools = self.admin.execute(
            "SELECT tool, status FROM durable_ledger.effects WHERE run = %s ORDER BY created_at",
            (self.run_id,)).fetchall()
        self.assertEqual(tools, [("bank.pay", "completed"), ("mail.send", "completed"),
                                 ("bank.pay", "failed"), ("mail.send", "completed")])

    def test_a_call_left_over_from_an_ended_attempt_never_acts_in_the_next(self) -> None:
        # A step of attempt 1 runs in a thread and is still sleeping when the attempt
        # gives up on it (a timeout); the retry, attempt 2, pays.  The leftover step then
        # calls the bank: bound to attempt 1 it gets LeaseLost, unbound it is refused
        # while attempt 2 is open; it never counts as a call of attempt 2 (which would
        # be occurrence 2 there: a second payment).  (helper-25's finding.)
        from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

        ledger = self.ledger(None)
        pay = Recorder({"payment_id": "pay_1"})
        args = {"invoice": "INV-9", "amount": 42}
        go = threading.Event()

        def step() -> Any:
            go.wait(30)
            return ledger.guarded(self.run_id, "bank.pay", args, pay)

        with ThreadPoolExecutor(2) as pool:
            leftovers = []
            with self.assertRaises(FutureTimeout):
                with ledger.attempt(self.run_id):
                    leftovers.append(pool.submit(ledger.bind(step)))
                    leftovers.append(pool.submit(step))  # a bare thread: no attempt
                    leftovers[0].result(timeout=0.2)
            with ledger.attempt(self.run_id):  # the retry
                self.assertEqual(ledger.guarded(self.run_id, "bank.pay", args, pay),
                                 {"payment_id": "pay_1"})
                go.set()
                with self.assertRaises(LeaseLost):
                    leftovers[0].result(timeout=30)
                with self.assertRaises(LedgerUsageError):
                    leftovers[1].result(timeout=30)
        self.assertEqual(len(pay.keys), 1, f"paid {len(pay.keys)} times")
        self.assertEqual(self.effect_count(self.run_id), 1)

    def test_a_second_attempt_at_an_open_run_on_one_ledger_is_refused(self) -> None:
        # A job delivered twice to one process: two threads, one Ledger, one connection.
        # The second acquire_run would start a new epoch of the same session lease under
        # the first attempt's feet, and both would count calls in it: refused instead.
        ledger = self.ledger(None)
        mail = Recorder({"sent": True})
        inside = threading.Event()
        release = threading.Event()

        def first() -> None:
            with ledger.attempt(self.run_id):
                ledger.guarded(self.run_id, "mail.send", {"to": "ap"}, mail)
                inside.set()
                release.wait(30)

        worker = threading.Thread(target=first)
        worker.start()
        self.assertTrue(inside.wait(30))
        with self.assertRaises(LedgerUsageError):
            with ledger.attempt(self.run_id):
                self.fail("a second attempt at an open run")
        with self.assertRaises(LedgerUsageError):
            ledger.acquire_run(self.run_id)
        with self.assertRaises(LedgerUsageError):  # nor released under its feet
            ledger.release_run(self.run_id)
        release.set()
        worker.join(30)
        with ledger.attempt(self.run_id):  # after the first: a new attempt replays
            self.assertEqual(ledger.guarded(self.run_id, "mail.send", {"to": "ap"}, mail),
                             {"sent": True})
        self.assertEqual(len(mail.keys), 1)

    def test_two_acquire_runs_at_once_on_one_ledger_one_is_refused(self) -> None:
        # helper-26: both used to pass the check before either's reply came back, and
        # shared one lease epoch (two payments).  The run is claimed before the statement.
        ledger = self.ledger(None)
        pay = Recorder({"payment_id": "pay_1"})
        start = threading.Barrier(2)
        outcomes: List[str] = []

        def delivery() -> None:
            start.wait(10)
            try:
                ledger.acquire_run(self.run_id)
            except LedgerUsageError:
                outcomes.append("refused")
                return
            outcomes.append("acquired")
            ledger.guarded(self.run_id, "bank.pay", {"invoice": "INV-9"}, pay)

        threads = [threading.Thread(target=delivery) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(sorted(outcomes), ["acquired", "refused"])
        self.assertEqual(len(pay.keys), 1)

    def test_a_clean_refusal_of_begin_effect_does_not_stop_the_attempt(self) -> None:
        # helper-26: a named refusal (here 23505) was taken for a begin_effect whose
        # outcome is unknown, and stopped the token attempt.  Nothing was written: the
        # attempt goes on.
        from psycopg_pool import ConnectionPool

        invoice = f"INV-{uuid.uuid4()}"
        setup = self.ledger(f"{self.run_id}-setup")
        setup.guarded(f"{self.run_id}-setup", "bank.pay", {"amount": 1}, Recorder({"ok": 1}),
                      business_key=invoice)
        pool = ConnectionPool(DSN, min_size=1, max_size=2, kwargs={"autocommit": True}, open=True)
        self.addCleanup(pool.close)
        for source in (self.connect(), pool):
            ledger = Ledger(source)
            run = f"{self.run_id}-{len(str(source))}-{uuid.uuid4().hex[:6]}"
            with ledger.token_attempt(run, ttl=30):
                with self.assertRaises(BusinessKeyConflict):
                    ledger.guarded(run, "bank.pay", {"amount": 2}, Recorder("no"), business_key=invoice)
                self.assertEqual(ledger.guarded(run, "mail.send", {"to": "ap"}, Recorder({"sent": 1})),
                                 {"sent": 1})

    def test_an_attempt_interrupted_while_it_waits_at_its_end_is_still_ended(self) -> None:
        # helper-26: a job time-out (SIGALRM) during the end's wait for a bound call in
        # flight left the run held by this Ledger for good.  Now the end and the release
        # happen however the wait ends.
        import signal

        class JobTimeout(Exception):
            pass

        def on_alarm(signum: int, frame: Any) -> None:
            raise JobTimeout("the job timed out")

        ledger = self.ledger(None)
        slow = threading.Event()

        def perform(key: str) -> Any:
            slow.wait(1.5)
            return {"paid": True}

        previous = signal.signal(signal.SIGALRM, on_alarm)
        self.addCleanup(signal.signal, signal.SIGALRM, previous)
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(1) as pool:
            with self.assertRaises(JobTimeout):
                with ledger.attempt(self.run_id):
                    future = pool.submit(ledger.bind(ledger.guarded), self.run_id, "bank.pay",
                                         {"invoice": 1}, perform)
                    time.sleep(0.2)
                    signal.setitimer(signal.ITIMER_REAL, 0.3)
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.assertEqual(future.result(timeout=30), {"paid": True})
        with ledger.attempt(self.run_id):  # attemptable again; the call replays
            self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"invoice": 1}, perform),
                             {"paid": True})

    # ------------------------------------------------------- named errors

    def test_a_lease_wait_ends_by_itself_naming_the_holder(self) -> None:
        # The default lock_timeout (0) used to mean waiting for ever behind a live
        # holder; now the wait ends (durable_ledger.lease_wait_timeout) with RunBusy, whose
        # message names the run, the holder's backend and application, and since when.
        holder = Ledger(psycopg.connect(DSN, autocommit=True, application_name="worker-7"))
        self.addCleanup(holder.conn.close)
        self.assertTrue(holder.acquire_run(self.run_id))
        waiter = Ledger(self.connect())
        waiter.conn.execute("SET durable_ledger.lease_wait_timeout = '300ms'")
        started = time.monotonic()
        with self.assertRaises(RunBusy) as busy:
            waiter.acquire_run(self.run_id)
        self.assertGreaterEqual(time.monotonic() - started, 0.25)
        self.assertEqual(busy.exception.sqlstate, "55P03")
        self.assertIsInstance(busy.exception.__cause__, psycopg.errors.LockNotAvailable)
        message = str(busy.exception)
        self.assertIn(f'run "{self.run_id}"', message)
        self.assertIn(f"Backend {ledger_backend(holder.conn, self.run_id)} held it", message)
        self.assertIn('application "worker-7"', message)
        self.assertIn("durable_ledger.lease_wait_timeout", message)
        with self.assertRaises(RunBusy):  # the attempt form, too
            with waiter.attempt(self.run_id):
                self.fail("entered an attempt on a held run")
        self.assertTrue(holder.release_run(self.run_id))
        self.assertTrue(waiter.acquire_run(self.run_id))

    def test_the_ledgers_sqlstates_come_as_named_exceptions(self) -> None:
        ledger = self.ledger()
        invoice = f"INV-{uuid.uuid4()}"
        ledger.guarded(self.run_id, "bank.pay", {"amount": 1}, Recorder({"ok": 1}),
                       business_key=invoice)
        never = Recorder("SHOULD-NOT-HAPPEN")
        with self.assertRaises(BusinessKeyConflict) as conflict:  # 23505
            ledger.guarded(self.run_id, "bank.pay", {"amount": 2}, never, business_key=invoice)
        self.assertEqual(conflict.exception.sqlstate, "23505")
        self.assertIsInstance(conflict.exception, LedgerRefused)
        if ERROR_ENDS_SESSION_LEASE:  # through a proxy: a new attempt (target.py)
            ledger.release_run(self.run_id)
            ledger.acquire_run(self.run_id)
        with self.assertRaises(InvalidArgument) as invalid:  # 22023: an empty tool name
            ledger.guarded(self.run_id, "", {}, never)
        self.assertEqual(invalid.exception.sqlstate, "22023")
        self.assertEqual(never.keys, [])
        # a role without the worker's grant: PermissionDenied, whose hint names the role
        role = f"nogrant_{uuid.uuid4().hex[:8]}"
        self.admin.execute(f"CREATE ROLE {role} LOGIN")
        self.addCleanup(self.admin.execute, f"DROP ROLE {role}")
        outsider = Ledger(psycopg.connect(DSN, autocommit=True, user=role))
        self.addCleanup(outsider.conn.close)
        with self.assertRaises(PermissionDenied) as denied:
            outsider.acquire_run(self.run_id)
        self.assertEqual(denied.exception.sqlstate, "42501")
        self.assertIn("GRANT durable_ledger_worker TO", str(denied.exception))  # says which role
        # errors of the caller's own function are never translated
        if ERROR_ENDS_SESSION_LEASE:
            ledger.release_run(self.run_id)
            ledger.acquire_run(self.run_id)
        with self.assertRaises(psycopg.errors.UniqueViolation):
            ledger.guarded(self.run_id, "db.write", {"n": 1},
                           Recorder(raises=psycopg.errors.UniqueViolation("the tool's own")))

    # ------------------------------------------------- what a newcomer runs

    def test_an_in_process_retry_outside_an_attempt_is_refused_not_performed_twice(self) -> None:
        # 1.0's first example: a Ledger on a connection, a tool called with the run's id,
        # the run retried by the same process on the same connection.  The implicit lease
        # of the first try made the retry's calls occurrence 2 of the same attempt: a
        # second payment.  Now no call begins outside an attempt.
        ledger = self.ledger(None)
        pay = Recorder({"payment_id": "pay_1"})
        for _ in range(2):
            with self.assertRaises(LedgerUsageError) as refused:
                ledger.guarded(self.run_id, "bank.pay", {"invoice": "INV-9", "amount": 42}, pay)
            self.assertIn("`with ledger.attempt(run):`", str(refused.exception))
        self.assertEqual(pay.keys, [])
        self.assertEqual(self.effect_count(self.run_id), 0)
        self.assertEqual(self.admin.execute("SELECT count(*) FROM durable_ledger.leases WHERE run = %s",
                                            (self.run_id,)).fetchone()[0], 0, "a lease was taken")
        # the same retry loop, each try an attempt: paid once, replayed after
        for _ in range(2):
            with ledger.attempt(self.run_id):
                self.assertEqual(ledger.guarded(self.run_id, "bank.pay",
                                                {"invoice": "INV-9", "amount": 42}, pay),
                                 {"payment_id": "pay_1"})
        self.assertEqual(len(pay.keys), 1)

    def test_parallel_calls_of_one_attempt_in_threads(self) -> None:
        # An agent runs the model's tool calls in a thread pool, on one Ledger with one
        # connection: the calls of one attempt run in parallel (their statements take
        # turns on the connection; their effects overlap), ten times over; a second
        # attempt asks for them in the reverse order and replays every one.
        from concurrent.futures import ThreadPoolExecutor

        ledger = self.ledger(None)
        performed: List[str] = []
        inside = threading.Semaphore(0)
        lock = threading.Lock()

        def perform(key: str) -> Any:
            with lock:
                performed.append(key)
            inside.release()
            time.sleep(0.02)  # in flight while the other calls begin and report
            return {"done": key[:8]}

        calls = [("bank.pay", {"invoice": i}) for i in range(3)] + [("mail.send", {"to": i}) for i in range(3)]
        first: List[Any] = []
        for _ in range(10):
            run = f"{self.run_id}-{len(first)}"
            with ledger.attempt(run), ThreadPoolExecutor(len(calls)) as pool:
                call = ledger.bind(lambda c: ledger.guarded(run, c[0], c[1], perform))
                first.append(list(pool.map(call, calls)))
        self.assertEqual(len(performed), 10 * len(calls))
        self.assertEqual(len(set(performed)), len(performed))
        for i, results in enumerate(first):
            run = f"{self.run_id}-{i}"
            with ledger.attempt(run), ThreadPoolExecutor(len(calls)) as pool:
                call = ledger.bind(lambda c: ledger.guarded(run, c[0], c[1], perform))
                again = list(pool.map(call, calls[::-1]))
            self.assertEqual(again[::-1], results)
        self.assertEqual(len(performed), 10 * len(calls), "a replay performed again")

    def test_record_an_error_stops_the_attempt_and_the_next_makes_the_call_again(self) -> None:
        # A recorded call that raises records nothing and stops the attempt: a retry in the
        # attempt would act on another answer than the replay sees (the replay makes the
        # lost call again first).  The next attempt makes it again: no person, no pause.
        calls: List[str] = []

        def model(answer: str) -> Any:
            def call() -> Any:
                calls.append(answer)
                if answer == "timeout":
                    raise TimeoutError("the model did not answer")
                if answer == "refused":
                    raise EffectDidNotHappen({"code": "content_policy"})
                return {"content": answer}
            return call

        pay = Recorder({"payment_id": "p-1"})
        ledger = self.ledger()
        self.assertEqual(ledger.record(self.run_id, "model", {"turn": 0}, model("hello")),
                         {"content": "hello"})
        with self.assertRaises(EffectFailed) as failed:  # a refusal is an answer: recorded
            ledger.record(self.run_id, "model", {"turn": 2}, model("refused"))
        self.assertFalse(failed.exception.replayed)
        self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1}, pay), {"payment_id": "p-1"})
        with self.assertRaises(TimeoutError):  # as raised; nothing recorded
            ledger.record(self.run_id, "model", {"turn": 1}, model("timeout"))
        with self.assertRaises(AttemptStopped) as stopped:  # a retry in this attempt
            ledger.record(self.run_id, "model", {"turn": 1}, model("NOT CALLED"))
        self.assertNotIsInstance(stopped.exception, EffectPaused, "nothing for a person")
        self.assertIn("no person is needed", str(stopped.exception))
        with self.assertRaises(AttemptStopped):
            ledger.guarded(self.run_id, "bank.pay", {"n": 2}, pay)
        self.close(ledger)

        # a result that cannot be recorded (not JSON) stops the attempt the same way
        ledger = self.ledger()
        with self.assertRaises(OutcomeNotRecorded) as unrecorded:
            ledger.record(self.run_id, "model", {"turn": 3}, lambda: {"at": object()})
        self.assertIn("makes the recorded call again", str(unrecorded.exception))
        with self.assertRaises(AttemptStopped):
            ledger.record(self.run_id, "model", {"turn": 3}, model("NOT CALLED"))
        self.close(ledger)

        # the next attempt: what was answered replays, the call that raised is made again
        # (its attempt 2); nothing waits for a person
        ledger = self.ledger()
        self.assertEqual(ledger.record(self.run_id, "model", {"turn": 3}, lambda: "three"),
                         "three")
        self.assertEqual(ledger.record(self.run_id, "model", {"turn": 0}, model("NOT CALLED")),
                         {"content": "hello"})
        with self.assertRaises(EffectFailed) as failed:
            ledger.record(self.run_id, "model", {"turn": 2}, model("NOT CALLED"))
        self.assertTrue(failed.exception.replayed)
        self.assertEqual(ledger.guarded(self.run_id, "bank.pay", {"n": 1}, pay), {"payment_id": "p-1"})
        self.assertEqual(ledger.record(self.run_id, "model", {"turn": 1}, model("again")),
                         {"content": "again"})
        self.assertEqual(calls, ["hello", "refused", "timeout", "again"])
        self.assertEqual(len(pay.keys), 1)
        self.assertEqual(self.admin.execute(
            "SELECT attempt, status::text FROM durable_ledger.effects"
            " WHERE run = %s AND args = '{\"turn\": 1}'", (self.run_id,)).fetchall(),
            [(2, "completed")])
        self.assertEqual(self.admin.execute(
            "SELECT count(*) FROM durable_ledger.unresolved WHERE run = %s",
            (self.run_id,)).fetchone()[0], 0)

        # a tool registered as side-effecting: refused, not called, the attempt stops
        tool = f"charge-{uuid.uuid4()}"
        self.admin.execute("SELECT durable_ledger.register_tool(%s, 'pytest')", (tool,))
        charge = Recorder("NOT CALLED")
        with self.assertRaises(ToolRefused):
            ledger.record(self.run_id, tool, {}, lambda: charge("no key"))
        self.assertEqual(charge.keys, [])
        with self.assertRaises(EffectPaused):
            ledger.guarded(self.run_id, "bank.pay", {"n": 2}, pay)

    def test_record_whose_lease_was_broken_mid_call_tells_what_the_ledger_did(self) -> None:
        # A token attempt's recorded call outlives its lease (broken): the next worker makes
        # the call again; the first worker's answer -- or refusal -- reported on the replaced
        # attempt is kept as superseded: its error says so (not that a person must resolve
        # anything), and a refusal is not taken for recorded.
        from psycopg_pool import ConnectionPool
        pool = ConnectionPool(DSN, min_size=1, max_size=2, kwargs={"autocommit": True},
                              open=True)
        self.addCleanup(pool.close)
        for outcome in ("answer", "refusal"):
            run = f"{self.run_id}-{outcome}"
            ledger = Ledger(pool)
            entered, go = threading.Event(), threading.Event()

            def slow() -> Any:
                entered.set()
                go.wait(30)
                if outcome == "refusal":
                    raise EffectDidNotHappen({"code": "content_policy"})
                return {"content": "first"}

            failure: List[BaseException] = []

            def first_worker() -> None:
                try:
                    with ledger.token_attempt(run, ttl=30):
                        ledger.record(run, "model", {"turn": 1}, slow)
                except BaseException as exc:  # noqa: BLE001 -- looked at below
                    failure.append(exc)

            worker = threading.Thread(target=first_worker)
            worker.start()
            self.assertTrue(entered.wait(30))
            self.admin.execute("SELECT durable_ledger.break_lease(%s, 'pytest')", (run,))
            other = Ledger(self.connect())
            with other.attempt(run):
                self.assertEqual(other.record(run, "model", {"turn": 1},
                                              lambda: {"content": "second"}),
                                 {"content": "second"})
            go.set()
            worker.join(30)
            self.assertEqual(len(failure), 1, outcome)
            self.assertIsInstance(failure[0], OutcomeNotRecorded, outcome)
            self.assertIn("superseded", str(failure[0]))
            self.assertNotIn("person", str(failure[0]))
            self.assertEqual(self.admin.execute(
                "SELECT event::text FROM durable_ledger.audit_log WHERE run = %s"
                " AND event = 'superseded_report'", (run,)).fetchall(), [("superseded_report",)])
            self.assertEqual(self.admin.execute(
                "SELECT count(*) FROM durable_ledger.unresolved WHERE run = %s",
                (run,)).fetchone()[0], 0)

    def test_the_readmes_quick_start_runs_as_written(self) -> None:
        # The block under "## Quick start" of the top README, copied as a newcomer copies
        # it, with only its DSN and stand-ins for the bank, the mailer and the model: the
        # model times out once after the payment, so the in-process retry loop runs a
        # second attempt on the same connection; then the whole program runs again (a
        # redelivered job).  Each effect happens once.
        readme = os.path.join(HERE, "..", "..", "..", "README.md")  # the repository's
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        section = text[text.index("\n## Quick start"):text.index("\n## Contents")]
        code = re.search(r"```python\n(.*?)```", section, re.S)
        assert code is not None, "no python block in the README's quick start"
        run = f"qs-{uuid.uuid4()}"
        example = code.group(1).replace('"ap-run-INV-9"', repr(run))
        self.assertNotEqual(example, code.group(1), "the quick start's run id changed")
        program = (
            "import json, os\n"
            "def log(name, *row):\n"
            "    with open(os.path.join(os.environ['LOGS'], name), 'a') as f:\n"
            "        f.write(json.dumps(row) + '\\n')\n"
            "class bank:\n"
            "    @staticmethod\n"
            "    def pay(invoice, amount, idempotency_key):\n"
            "        log('bank', invoice, amount, idempotency_key)\n"
            "        return {'payment_id': 'pay-' + idempotency_key[:8]}\n"
            "class mailer:\n"
            "    @staticmethod\n"
            "    def send(to, body, idempotency_key):\n"
            "        log('mail', to, idempotency_key)\n"
            "        return {'message_id': 'msg-' + idempotency_key[:8]}\n"
            "class llm:\n"
            "    @staticmethod\n"
            "    def write_note(receipt):\n"
            "        first = not os.path.exists(os.path.join(os.environ['LOGS'], 'llm'))\n"
            "        log('llm', receipt)\n"
            "        if first:\n"
            "            raise TimeoutError('the model did not answer')\n"
            "        return 'paid ' + receipt['payment_id']\n"
            f"dsn = {DSN!r}\n"
            + example)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "agent.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(program)
            env = dict(os.environ, LOGS=tmp, PYTHONPATH=os.path.dirname(HERE))
            for _ in range(2):  # the program, then the same job delivered again
                done = subprocess.run(["/usr/bin/python3", "-W", "default", path], env=env,
                                      capture_output=True, text=True, timeout=120)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                self.assertEqual(done.stderr, "", "the quick start warns")
                self.assertNotIn("needs a person", done.stdout)
            logs = {}
            for name in ("bank", "mail", "llm"):
                with open(os.path.join(tmp, name), encoding="utf-8") as f:
                    logs[name] = f.read().splitlines()
        self.assertEqual(len(logs["bank"]), 1, f"paid more than once: {logs['bank']}")
        self.assertEqual(len(logs["mail"]), 1, f"mailed more than once: {logs['mail']}")
        self.assertEqual(len(logs["llm"]), 2, "the model: timed out, answered on the retry "
                         "(the rerun replays its answer)")
        statuses = self.admin.execute(
            "SELECT tool, status, attempt FROM durable_ledger.effects WHERE run = %s ORDER BY tool",
            (run,)).fetchall()
        self.assertEqual(statuses, [("bank.pay", "completed", 1), ("llm.note", "completed", 2),
                                    ("mail.send", "completed", 1)])
        replays = self.admin.execute(
            "SELECT count(*) FROM durable_ledger.audit_log WHERE run = %s AND event = 'replay'",
            (run,)).fetchone()[0]
        self.assertEqual(replays, 4, "the retry replays the payment, the rerun all three calls")

    def test_the_client_readmes_first_run_runs_as_written(self) -> None:
        # The block under "## A first run" of the client's README, copied as a newcomer
        # copies it, with only its DSN, run id and a stand-in bank, run twice as a
        # program: the bank is paid once, and the rerun prints the recorded receipt.
        readme = os.path.join(HERE, "..", "README.md")
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        section = text[text.index("\n## A first run"):]
        code = re.search(r"```python\n(.*?)```", section, re.S)
        assert code is not None, "no python block in the README's first run"
        example = code.group(1)
        self.assertLessEqual(len([line for line in example.splitlines() if line.strip()]), 16,
                             "the first run is not a short program")
        program = (
            "import json, os\n"
            "class bank:\n"
            "    class Declined(Exception):\n"
            "        code = 'declined'\n"
            "    @staticmethod\n"
            "    def pay(invoice, amount, idempotency_key):\n"
            "        with open(os.environ['BANK_LOG'], 'a') as f:\n"
            "            f.write(json.dumps([invoice, amount, idempotency_key]) + '\\n')\n"
            "        return {'payment_id': 'pay-' + idempotency_key[:8]}\n"
            f"dsn = {DSN!r}\n"
            f"run_id = {self.run_id!r}\n"
            + example)
        outputs = []
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "first_run.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(program)
            env = dict(os.environ, BANK_LOG=os.path.join(tmp, "bank.log"),
                       PYTHONPATH=os.path.dirname(HERE))
            for _ in range(2):  # the program, then its rerun after a crash or redelivery
                done = subprocess.run(["/usr/bin/python3", "-W", "default", path], env=env,
                                      capture_output=True, text=True, timeout=120)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                self.assertEqual(done.stderr, "", "the first run warns")
                outputs.append(done.stdout)
            with open(env["BANK_LOG"], encoding="utf-8") as f:
                payments = f.read().splitlines()
        self.assertEqual(len(payments), 1, f"the rerun paid again: {payments}")
        self.assertIn("pay-", outputs[0])
        self.assertEqual(outputs[0], outputs[1], "the rerun printed another receipt")
        self.assertEqual(self.admin.execute(
            "SELECT tool, status::text FROM durable_ledger.effects WHERE run = %s",
            (self.run_id,)).fetchall(), [("bank.pay", "completed")])

    def test_the_readmes_agent_loop_killed_in_a_model_call(self) -> None:
        # The agent loop of the top README ("An agent loop: record each model turn"), as
        # written, with a scripted model and stand-ins for the tools.  The first worker is
        # killed (SIGKILL) while the model is answering its second turn; the rerun makes
        # that model call again (its attempt 2: no pause, no person) and replays the
        # first turn and the payment; a third run calls nothing at all.
        readme = os.path.join(HERE, "..", "..", "..", "README.md")
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        section = text[text.index("\n### An agent loop: record each model turn"):]
        code = re.search(r"```python\n(.*?)```", section, re.S)
        assert code is not None, "no python block in the README's agent loop"
        run = f"loop-{uuid.uuid4()}"
        program = (
            "import json, os, sys, time\n"
            "import psycopg\n"
            "from durable_ledger import Ledger\n"
            "def log(name, *row):\n"
            "    with open(os.path.join(os.environ['LOGS'], name), 'a') as f:\n"
            "        f.write(json.dumps(row) + '\\n')\n"
            f"conn = psycopg.connect({DSN!r}, autocommit=True)\n"
            "ledger = Ledger(conn)\n"
            "@ledger.tool('bank.pay')\n"
            "def pay_invoice(args, idempotency_key):\n"
            "    log('bank', args, idempotency_key)\n"
            "    return {'payment_id': 'pay-' + idempotency_key[:8]}\n"
            "@ledger.tool('mail.send')\n"
            "def send_email(args, idempotency_key):\n"
            "    log('mail', args, idempotency_key)\n"
            "    return {'message_id': 'msg-' + idempotency_key[:8]}\n"
            "class model:\n"
            "    @staticmethod\n"
            "    def complete(messages):\n"
            "        log('model', len(messages))\n"
            "        if len(messages) == 1:\n"
            "            return {'role': 'assistant', 'tool_calls': [{'name': 'pay_invoice',\n"
            "                    'args': {'invoice': 'INV-9', 'amount': 4200}}]}\n"
            "        if os.environ.get('HANG'):\n"
            "            time.sleep(3600)  # killed here\n"
            "        return {'role': 'assistant', 'content': 'paid ' + messages[-1]['content']['payment_id']}\n"
            + code.group(1)
            + f"with conn:\n    print(agent_loop({run!r}, 'pay INV-9'))\n")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "loop.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(program)
            env = dict(os.environ, LOGS=tmp, PYTHONPATH=os.path.dirname(HERE))

            def lines(name: str) -> List[Any]:
                try:
                    with open(os.path.join(tmp, name), encoding="utf-8") as f:
                        return [json.loads(line) for line in f]
                except FileNotFoundError:
                    return []

            worker = subprocess.Popen(["/usr/bin/python3", path], env=dict(env, HANG="1"),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                deadline = time.monotonic() + 60
                while len(lines("model")) < 2 and worker.poll() is None:
                    self.assertLess(time.monotonic(), deadline, "the worker never reached turn 2")
                    time.sleep(0.05)
                if worker.poll() is not None:
                    self.fail("the worker ended before it was killed: %r" % (worker.communicate(),))
            finally:
                worker.kill()
                worker.communicate()
            self.assertEqual(lines("model"), [[1], [3]])
            self.assertEqual(len(lines("bank")), 1)
            for _ in range(2):  # the rerun, then a third run
                done = subprocess.run(["/usr/bin/python3", "-W", "default", path], env=env,
                                      capture_output=True, text=True, timeout=120)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                self.assertEqual(done.stdout.strip(), "paid pay-" + lines("bank")[0][1][:8])
                self.assertEqual(done.stderr, "")
            self.assertEqual(lines("model"), [[1], [3], [3]],
                             "the lost model call is made again once; everything else replays")
            self.assertEqual(len(lines("bank")), 1, "paid more than once")
            self.assertEqual(lines("mail"), [])
        turns = self.admin.execute(
            "SELECT e.status, e.attempt, p.status FROM durable_ledger.effects e"
            "  LEFT JOIN durable_ledger.past_attempts p ON p.key = e.key"
            " WHERE e.run = %s AND e.tool = 'model' ORDER BY e.created_at", (run,)).fetchall()
        self.assertEqual(turns, [("completed", 1, None), ("completed", 2, "unknown")])
        self.assertEqual(self.admin.execute(
            "SELECT count(*) FROM durable_ledger.unresolved WHERE run = %s", (run,)).fetchone()[0],
            0, "a recorded call needs no person")


if __name__ == "__main__":
    unittest.main()
