"""`Ledger`: the durable_ledger protocol around a side-effecting call, for psycopg 3.

The SQL contract (begin_effect / complete_effect / fail_effect, leases, decisions) is
fixed; this module only makes the right sequence of calls hard to get wrong:

    intent committed  ->  effect performed with the key  ->  outcome recorded

and turns every answer that is not "here is your result" into an exception, so that an
agent loop cannot mistake "do not perform this" for "nothing to do".
"""

from __future__ import annotations

import functools
import logging
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from .errors import (
    EffectDidNotHappen,
    EffectFailed,
    EffectInProgress,
    EffectPaused,
    LedgerError,
    LedgerUsageError,
    OutcomeNotRecorded,
    RunBusy,
)

__all__ = ["Ledger", "side_effect", "Perform", "ToolFunction"]

log = logging.getLogger("durable_ledger")
log.addHandler(logging.NullHandler())  # a library logs only where the application says

R = TypeVar("R")
#: ``perform(idempotency_key) -> result``: the side effect itself, given the key to pass
#: downstream.
Perform = Callable[[str], Any]
#: ``tool(args, idempotency_key) -> result``: a side-effecting tool, before decoration.
ToolFunction = Callable[[Any, str], Any]


def _json(value: Any) -> Optional[Jsonb]:
    """None becomes SQL NULL ("nothing"), anything else a jsonb parameter."""
    return None if value is None else Jsonb(value)


class Ledger:
    """The ledger, seen through one psycopg connection.

    ``Ledger(conn)`` requires ``conn`` to be a synchronous ``psycopg.Connection`` in
    **autocommit** mode, and refuses (`LedgerUsageError`) every writing call made while
    the connection is inside a transaction.  Why: the whole point of the ledger is that
    the *intent* is durable before the effect is performed.  ``begin_effect`` run inside an
    open transaction only becomes durable at that transaction's COMMIT; a client that
    performed the payment before the COMMIT (and then crashed, or rolled back) would leave
    no trace of it, and the next attempt would pay again.  In autocommit mode each call is
    its own committed transaction, so an ``execute`` the client has seen is on disk.

    The lease (and with it the occurrence counters that make "again" differ from "twice")
    belongs to the database session, so use one `Ledger` per connection and one connection
    per worker at a time.  Pooled connections: wrap each attempt in `attempt`.
    """

    def __init__(self, conn: "psycopg.Connection[Any]") -> None:
        if not isinstance(conn, psycopg.Connection):
            raise TypeError("Ledger needs a synchronous psycopg.Connection (psycopg 3)")
        self.conn = conn
        # Runs that must not go on in this attempt: run -> (key, reason).  See guarded().
        self._halted: Dict[str, Tuple[str, str]] = {}
        self._check_writable()

    # ------------------------------------------------------------------ guarded

    def guarded(
        self,
        run: str,
        tool: str,
        args: Any,
        perform: Perform,
        *,
        business_key: Optional[str] = None,
        meta: Any = None,
    ) -> Any:
        """Perform one side effect at most once per logical action; return its result.

        ``run`` is the run's identity (a workflow or trajectory id, the same on every
        retry), ``tool`` the operation's name, ``args`` its JSON arguments (key order,
        white space and number spelling do not matter), ``perform(key)`` the effect
        itself: it must pass ``key`` downstream as the idempotency key where the API takes
        one, and return a JSON-serialisable result (None means "returned nothing").
        ``business_key`` names an operation that is one thing across all runs (an invoice
        number); ``meta`` is free JSON stored with the intent (model, prompt version,
        trace id).

        What happens, by the ledger's decision:

        - ``execute``: the intent is committed, then ``perform(key)`` runs, then
          ``complete_effect`` records its result, which is returned -- as the ledger
          recorded it (JSON round trip), so that the first run and every replay see the
          very same value.
        - ``execute`` and ``perform`` raises `EffectDidNotHappen`: the downstream refused
          before changing anything; ``fail_effect`` records the error and `EffectFailed`
          is raised.
        - ``execute`` and ``perform`` raises anything else (a time-out, a crash, a bug):
          nobody knows whether the effect happened, so nothing is recorded -- guessing
          "failed" could pay twice, guessing "completed" could lose a payment.  The
          exception propagates unchanged; the effect stays ``started`` and the run's next
          attempt gets ``pause`` until a person resolves it (``resolve_effect``).
        - ``replay`` of a completed effect: ``perform`` is not called; the recorded result
          is returned.
        - ``replay`` of a failed effect: ``perform`` is not called; `EffectFailed` with
          ``replayed=True``.  To try again, call again: that is the next occurrence.
        - ``pause``: `EffectPaused`; ``in_progress``: `EffectInProgress`.

        Both reports name the attempt of the effect that ``begin_effect`` executed
        (``complete_effect(key, result, attempt)``, ``fail_effect(key, error, attempt)``):
        a business key is executed again after a failure (attempt 2, 3, ...), and a report
        must decide the attempt it is about and no other.  It is applied to that attempt
        also when this connection no longer holds the lease that began it; a report on an
        attempt that a later one has replaced never changes the later one: a refusal the
        ledger already recorded for it raises `EffectFailed` as usual, anything else
        `OutcomeNotRecorded` (kept as a conflict for a person).

        After an unknown outcome or a pause, every further call on ``run`` through this
        `Ledger` raises `EffectPaused` without asking the database, until a new attempt
        starts (`acquire_run`, `release_run` or `attempt`).  Why: occurrences count
        identical calls within an attempt, so the same call retried in the same attempt
        would be occurrence 2, get a new key and ``execute`` -- a second payment.  A
        run whose outcome is unknown must stop, not improvise.
        """
        self._check_writable()
        halted = self._halted.get(run)
        if halted is not None:
            raise EffectPaused(halted[0], "pause", halted[1])

        row = self._one(
            "SELECT * FROM durable_ledger.begin_effect(%s, %s, %s, %s, %s)",
            (run, tool, Jsonb(args), business_key, _json(meta)),
        )
        key: str = row["key"]
        decision: str = row["decision"]
        reason: str = row["reason"] or ""
        log.debug("%s %s run=%s key=%s", decision, tool, run, key)

        if decision == "execute":
            return self._execute(run, tool, key, row["attempt"], perform)
        if decision == "replay":
            if row["status"] == "completed":
                return row["result"]
            if row["status"] == "failed":
                raise EffectFailed(key, decision, reason, row["error"], replayed=True)
        elif decision == "pause":
            log.warning("run %s paused at %s %s: %s", run, tool, key, reason)
            self._halt(run, key, f"run {run!r} is stopped in this attempt: effect {key} "
                                 f"({tool}) was paused: {reason}")
            raise EffectPaused(key, decision, reason)
        elif decision == "in_progress":
            raise EffectInProgress(key, decision, reason)
        raise LedgerError(key, decision, f"unexpected answer from begin_effect: decision "
                                         f"{decision!r}, status {row['status']!r}")

    def _execute(self, run: str, tool: str, key: str, attempt: int, perform: Perform) -> Any:
        try:
            result = perform(key)
        except EffectDidNotHappen as refusal:
            self._record(run, key, attempt, "fail_effect", "failed", refusal.error, result=None)
            raise EffectFailed(key, "execute", "the downstream refused the effect; its "
                               "failure is recorded", refusal.error, replayed=False) from refusal
        except BaseException as exc:
            log.warning("outcome of %s %s unknown: perform raised %s", tool, key, type(exc).__name__)
            self._halt(run, key, f"run {run!r} is stopped in this attempt: the outcome of "
                                 f"effect {key} ({tool}) is unknown (perform raised "
                                 f"{type(exc).__name__}); a person must resolve it, then "
                                 f"start a new attempt")
            raise
        recorded = self._record(run, key, attempt, "complete_effect", "completed", result,
                                result=result)
        return recorded["result"]

    def _record(self, run: str, key: str, attempt: int, function: str, expected: str,
                payload: Any, *, result: Any) -> Dict[str, Any]:
        """complete_effect / fail_effect on ``attempt``, the attempt begin_effect executed.

        The report always names its attempt: a business key is executed again after a
        failure (attempt 2, 3, ...), and a report that named none could land on another
        attempt than the one it is about -- or, when this connection no longer holds the
        lease that started the attempt, be kept as a conflict instead of applied.
        Anything but a clean record is `OutcomeNotRecorded`.
        """
        what = {"result": result} if function == "complete_effect" else {"error": payload}
        try:
            row = self._one(f"SELECT * FROM durable_ledger.{function}(%s, %s, %s)",
                            (key, _json(payload), attempt))
        except BaseException as exc:
            self._halt(run, key, f"run {run!r} is stopped in this attempt: the outcome of "
                                 f"effect {key} could not be recorded")
            if not isinstance(exc, Exception):
                raise
            raise OutcomeNotRecorded(
                key, f"the outcome ({expected}) could not be recorded "
                     f"({type(exc).__name__}: {exc}); the next attempt will pause until a "
                     f"person resolves the effect", **what) from exc
        if row["attempt"] == attempt:
            accepted = row["status"] == expected and not row["conflict"]
        else:
            # A later attempt replaced ours (someone else recorded our attempt as failed
            # meanwhile, and the key was executed again): the row is that later attempt's,
            # which the report never changes.  A failure the ledger already had for our
            # attempt is on record; anything else was kept as a conflict.
            accepted = function == "fail_effect" and not row["conflict"]
        if not accepted:
            self._halt(run, key, f"run {run!r} is stopped in this attempt: the report on "
                                 f"effect {key} contradicted the ledger")
            now = (f"{row['status']}" if row["attempt"] == attempt else
                   f"at attempt {row['attempt']} (this report was on attempt {attempt}), "
                   f"{row['status']}")
            raise OutcomeNotRecorded(
                key, f"the ledger did not accept the report ({expected}): the effect is "
                     f"{now}{' and flagged as a conflict' if row['conflict'] else ''}; "
                     f"a person must resolve it", **what)
        return row

    # ---------------------------------------------------------------- decorator

    def tool(
        self,
        name: str,
        *,
        business_key: Optional[Callable[[Any], Optional[str]]] = None,
    ) -> Callable[[ToolFunction], Callable[..., Any]]:
        """Decorator for a side-effecting tool ``fn(args, idempotency_key) -> result``.

        The decorated function is called as ``fn(run, args, *, business_key=None,
        meta=None)`` and goes through `guarded` under the tool name ``name``; the ledger's
        key reaches ``fn`` as its second argument, to be passed downstream as the
        idempotency key.  ``business_key``, if given, derives the business key from the
        args (``lambda a: a["invoice"]``); a ``business_key=`` at call time wins.
        Read-only tools are simply not decorated: reading twice changes nothing, and a
        recorded read would hand a replayed run stale data instead of the current state.
        """
        key_of = business_key  # the parameter name is reused by the decorated function

        def decorate(fn: ToolFunction) -> Callable[..., Any]:
            @functools.wraps(fn)
            def call(run: str, args: Any, *, business_key: Optional[str] = None,
                     meta: Any = None) -> Any:
                if business_key is None and key_of is not None:
                    business_key = key_of(args)
                return self.guarded(run, name, args, lambda key: fn(args, key),
                                    business_key=business_key, meta=meta)

            del call.__wrapped__  # type: ignore[attr-defined]  # its signature is not ours
            call.tool = name  # type: ignore[attr-defined]
            call.perform = fn  # type: ignore[attr-defined]
            call.ledger = self  # type: ignore[attr-defined]
            return call

        return decorate

    # ------------------------------------------------------------------ leases

    def acquire_run(self, run: str, wait: bool = True) -> bool:
        """Start a new attempt at ``run``: take its lease and start a new lease epoch.

        Returns False (only with ``wait=False``) when another session holds the run.
        Occurrence counters start again at 1, which is what lines a retried run up with
        the keys of its earlier attempt -- so call it at the start of every attempt on a
        connection that outlives attempts (a pool).  Also lifts this client's stop on
        ``run`` after a pause or an unknown outcome: the new attempt will meet the
        unresolved effect again in the ledger, at the same occurrence.
        """
        self._check_writable()
        row = self._one("SELECT durable_ledger.acquire_run(%s, %s) AS ok", (run, wait))
        if row["ok"]:
            self._halted.pop(run, None)
        return bool(row["ok"])

    def release_run(self, run: str) -> bool:
        """End this session's lease on ``run`` (False if it did not hold it).

        Effects still ``started`` under it become ``unknown`` for the next attempt.
        """
        self._check_writable()
        row = self._one("SELECT durable_ledger.release_run(%s) AS ok", (run,))
        self._halted.pop(run, None)
        return bool(row["ok"])

    @contextmanager
    def attempt(self, run: str, *, wait: bool = True) -> Iterator[str]:
        """``with ledger.attempt(run):`` -- one attempt at a run on a pooled connection.

        Acquires the lease (a new epoch) at entry and releases it at exit, also when the
        body raises, so that a connection going back to the pool carries no lease.
        ``wait=False`` raises `RunBusy` at once if another session holds the run.  If the
        connection broke, there is nothing to release: the lease ended with the session.
        """
        if not self.acquire_run(run, wait=wait):
            raise RunBusy(None, None, f"run {run!r} is held by another session")
        try:
            yield run
        except BaseException:
            self._halted.pop(run, None)
            if not (self.conn.closed or self.conn.broken):
                try:
                    self._one("SELECT durable_ledger.release_run(%s) AS ok", (run,))
                except Exception:  # the body's exception is the one that matters
                    log.warning("could not release run %s after an error", run, exc_info=True)
            raise
        else:
            self.release_run(run)

    # ------------------------------------------------------------------- reads

    def effect_status(self, key: str) -> Optional[Dict[str, Any]]:
        """The effect's row of ``durable_ledger.effects`` as a dict, or None if never seen.

        A ``started`` effect whose lease has ended is reported ``unknown``: the question
        is "may it still be in flight?".  Read-only, so allowed inside a transaction.
        """
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM durable_ledger.effect_status(%s)", (key,))
            return cur.fetchone()

    # ----------------------------------------------------------------- helpers

    def _check_writable(self) -> None:
        conn = self.conn
        if conn.closed:
            raise LedgerUsageError(None, None, "the connection is closed")
        if not conn.autocommit:
            raise LedgerUsageError(
                None, None, "the connection must be in autocommit mode "
                "(psycopg.connect(..., autocommit=True)): begin_effect's intent has to be "
                "committed before the effect is performed")
        if conn.info.transaction_status != TransactionStatus.IDLE:
            raise LedgerUsageError(
                None, None, "the connection is inside a transaction: begin_effect's intent "
                "would only be committed at COMMIT, after the effect; call the ledger "
                "outside transactions")

    def _halt(self, run: str, key: str, reason: str) -> None:
        self._halted.setdefault(run, (key, reason))

    def _one(self, query: str, params: Tuple[Any, ...]) -> Dict[str, Any]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)  # type: ignore[arg-type]
            row = cur.fetchone()
        assert row is not None, query
        return row


def side_effect(
    ledger: Ledger,
    name: str,
    *,
    business_key: Optional[Callable[[Any], Optional[str]]] = None,
) -> Callable[[ToolFunction], Callable[..., Any]]:
    """``@side_effect(ledger, "bank.pay")``: the same as ``@ledger.tool("bank.pay")``."""
    return ledger.tool(name, business_key=business_key)
