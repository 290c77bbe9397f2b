"""`Ledger`: the durable_ledger protocol around a side-effecting call, for psycopg 3.

The SQL contract (begin_effect / complete_effect / fail_effect, leases, decisions) is
fixed; this module only makes the right sequence of calls hard to get wrong:

    intent committed  ->  effect performed with the key  ->  outcome recorded

and turns every answer that is not "here is your result" into an exception, so that an
agent loop cannot mistake "do not perform this" for "nothing to do".

Two kinds of lease keep two workers off one run (see `Ledger.attempt` and
`Ledger.token_attempt`): a session lease (an advisory lock of the one connection that makes
every call of the attempt), and a token lease (a row with an expiry, renewed in the
background, whose calls may each use another connection: a pool, or PgBouncer in
transaction mode).

A call made inside ``with ledger.token_attempt(run) as lease:`` belongs to that attempt
through the context it runs in (a `contextvars` variable, which asyncio tasks,
``asyncio.to_thread`` and ``lease.bind(fn)`` carry into other tasks and threads), not
through a lookup by run: a call of an attempt that has ended is refused, never made under
the next attempt's token nor under a session lease, and the attempt's end waits for its
calls in flight.
"""

from __future__ import annotations

import contextvars
import functools
import heapq
import itertools
import os
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import (Any, Callable, ContextManager, Dict, Iterator, List, Optional, Protocol,
                    Tuple, TypeVar, Union, cast)

import psycopg
from psycopg.pq import ConnStatus, ExecStatus, TransactionStatus
from psycopg.rows import dict_row

from . import _protocol as p
from .outcomes import Reconcile
from ._protocol import (
    LEASE_LOST,
    RUN_ABANDONED,
    TokenLease,
    _ATTEMPTS,
    _Halt,
    _NotSent,
    _abandoned,
    _not_committed,
    _refused_cleanly,
    log,
)
from .errors import (
    EffectDidNotHappen,
    LeaseLost,
    LedgerError,
    LedgerUsageError,
    PermissionDenied,
    RunBusy,
    WrongState,
)

__all__ = ["Ledger", "TokenLease", "side_effect", "Perform", "ToolFunction", "Tool"]

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
#: ``perform(idempotency_key) -> result``: the side effect itself, given the key to pass
#: downstream.
Perform = Callable[[str], Any]
#: ``tool(args, idempotency_key) -> result``: a side-effecting tool, before decoration.
ToolFunction = Callable[[Any, str], Any]


class Tool(Protocol[R_co]):
    """A tool decorated by `Ledger.tool`: ``tool(run, args, *, business_key=None,
    meta=None)`` returns what the function returned (``R_co``), as the ledger recorded it
    (a JSON round trip: a tuple comes back as a list).  ``tool.tool`` is its name,
    ``tool.perform`` the function decorated, ``tool.ledger`` the `Ledger`."""

    def __call__(self, run: str, args: Any, *, business_key: Optional[str] = None,
                 meta: Any = None) -> R_co: ...

    @property
    def tool(self) -> str: ...

    @property
    def perform(self) -> Callable[[Any, str], R_co]: ...

    @property
    def ledger(self) -> "Ledger": ...


#: What `Ledger` is given: one connection, a pool (anything with ``.connection()``, such
#: as ``psycopg_pool.ConnectionPool``) or a factory (``connect() -> Connection``, or a
#: context manager that yields one).
ConnectionSource = Union["psycopg.Connection[Any]", Any, Callable[[], Any]]


class _SessionAttempt:
    """One ``with ledger.attempt(run):`` block: the calls of it in flight, and its end.
    Its calls are those made in the block's context (a thread it starts carries it only
    through `Ledger.bind`); one that begins after the block was left raises `LeaseLost`."""

    def __init__(self, run: str, ledger: "Ledger") -> None:
        self.run = run
        self.ledger = ledger
        self.ended = False
        self.inflight = 0
        self.idle = threading.Condition()

    def enter(self) -> None:
        with self.idle:
            if self.ended:
                raise LeaseLost(
                    self.run, None,
                    f"run {self.run!r}: this call belongs to a session attempt that has ended "
                    f"(its block was left while this call's thread was still running); nothing "
                    f"was begun.  A call must not outlive its attempt: wait for every thread "
                    f"before leaving the block")
            self.inflight += 1

    def leave(self) -> None:
        with self.idle:
            self.inflight -= 1
            if self.inflight == 0:
                self.idle.notify_all()

    def end(self) -> None:
        """No new call begins; waits for those in flight (their outcome is reported)."""
        with self.idle:
            self.ended = True
            while self.inflight:
                self.idle.wait()


#: The session attempts the running code belongs to (see `Ledger.attempt`).
_SESSIONS: "contextvars.ContextVar[Tuple[_SessionAttempt, ...]]" = contextvars.ContextVar(
    "durable_ledger_sync_session_attempts", default=())


class Ledger(p.LedgerCore):
    """The ledger, seen through one psycopg connection, a pool, or a connection factory.

    ``Ledger(conn)`` requires ``conn`` to be a synchronous ``psycopg.Connection`` in
    **autocommit** mode, and refuses (`LedgerUsageError`) every writing call made while
    the connection is inside a transaction.  Why: the whole point of the ledger is that
    the *intent* is durable before the effect is performed.  ``begin_effect`` run inside an
    open transaction only becomes durable at that transaction's COMMIT; a client that
    performed the payment before the COMMIT (and then crashed, or rolled back) would leave
    no trace of it, and the next attempt would pay again.  In autocommit mode each call is
    its own committed transaction, so an ``execute`` the client has seen is on disk.

    ``routed=True``: the database is a proxy of a sharded ledger (durable_ledger_proxy,
    docs/scale-out.md): every call about a key (its report, a reconciliation, a status)
    names its run, so that the proxy sends it straight to the run's shard.  Without it
    the client works there too, and the proxy asks every shard where the key is.

    A session lease (and with it the occurrence counters that make "again" differ from
    "twice") belongs to the database session, so use one `Ledger` per connection and one
    connection per worker at a time.  Pooled connections: wrap each attempt in `attempt`.

    ``Ledger(pool)`` (a ``psycopg_pool.ConnectionPool``, or anything whose
    ``.connection()`` yields a connection) and ``Ledger(connect)`` (a factory: ``connect()``
    returns a new ``psycopg.Connection``, closed after the call, or a context manager that
    yields one) are for **token leases** only: every call of an attempt is then made in
    its own short transaction on whatever connection the source hands out, which is what
    a pool, PgBouncer in transaction mode or a serverless endpoint needs -- see
    `token_attempt`.  Such a `Ledger` refuses session-lease calls (`LedgerUsageError`):
    a session lock on a pooled connection would outlive the attempt or vanish under it.
    A single connection serves both kinds of lease (a connection to PgBouncer in
    transaction mode only token leases).  It must be **dedicated** to the `Ledger`: a tool
    that runs its own transaction on it (``with conn.transaction():`` in another thread)
    would pull the ledger's statements into that transaction.  The `Ledger` runs its
    statements one at a time on it; one that would run inside another transaction is
    not sent (and one that ended inside one is refused after the fact): it raises
    `LedgerUsageError`, no effect is performed, and no report counts as recorded.  A pool is the
    recommended shape.  One `Ledger` may serve several threads, each with attempts at runs
    of its own.
    """

    def __init__(self, conn: ConnectionSource, *, routed: bool = False) -> None:
        # Through durable_ledger_proxy (docs/scale-out.md): every call about a key (a
        # report, a reconciliation, a status) names its run, so that the proxy sends it
        # straight to the run's shard instead of asking every shard where the key is.
        self._routed = routed
        # Runs that must not go on in their session-lease attempt: run -> (key, reason,
        # error).  A token attempt keeps its own (TokenLease._halted).  See guarded().
        self._halted: Dict[str, _Halt] = {}
        self._models: Dict[str, str] = {}  # the model of each attempt open, by run
        # The open token attempts of this Ledger: run -> its lease.  See token_attempt().
        self._leases: Dict[str, TokenLease] = {}
        self._opening: set[str] = set()  # runs whose token_attempt is taking its lease
        self._leases_lock = threading.Lock()
        # No implicit session lease: outside a token attempt, only runs this Ledger holds
        # by an explicit attempt() or acquire_run() are called (see guarded()).
        self._session_held: set[str] = set()
        # The epoch and server process of each session attempt's lease, which every begin
        # of the attempt checks it reached (a transaction pooler in between is caught).
        self._holds: Dict[str, p.SessionHold] = {}
        self._sessions: Dict[str, _SessionAttempt] = {}  # open attempt() blocks
        self._acquiring: set[str] = set()  # runs whose acquire_run is under way
        # One statement at a time on a single connection shared with the renewal threads.
        self._conn_lock = threading.RLock()
        self._source = conn
        # a psycopg_pool pool: borrowed with getconn/putconn straight (p.pool_methods)
        self._getconn, self._putconn = p.pool_methods(conn, False)
        # such a pool's statements are sent straight on an idle connection (p.plain_send)
        # without `_connection` around them (`_pooled_once_plain`)
        self._plain_path = self._getconn is not None and p.PLAIN_SEND
        self._borrow: Optional[Callable[[], ContextManager[Any]]]
        if isinstance(conn, psycopg.Connection):
            self.conn: Optional["psycopg.Connection[Any]"] = conn
            self._borrow = None
            self._check_writable()
        elif isinstance(conn, psycopg.AsyncConnection) or not (
                callable(getattr(conn, "connection", None)) or callable(conn)):
            raise TypeError("Ledger needs a synchronous psycopg.Connection (psycopg 3), a "
                            "psycopg_pool.ConnectionPool, or a function returning a connection")
        else:
            self.conn = None  # a pool or a factory: a connection per call
            borrow = getattr(conn, "connection", None)
            self._borrow = borrow if callable(borrow) else cast(Callable[[], ContextManager[Any]], conn)

    # ------------------------------------------------------------------ guarded

    def guarded(
        self,
        run: str,
        tool: str,
        args: Any,
        perform: Callable[[str], R],
        *,
        business_key: Optional[str] = None,
        meta: Any = None,
        reconcile: Optional[Reconcile] = None,
        call_id: Optional[str] = None,
    ) -> R:
        """Perform one side effect at most once per logical action; return its result.

        ``run`` is the run's identity (a workflow or trajectory id, the same on every
        retry), ``tool`` the operation's name, ``args`` its JSON arguments (key order,
        white space and number spelling do not matter), ``perform(key)`` the effect
        itself: it must pass ``key`` downstream as the idempotency key where the API takes
        one, and return a JSON-serialisable result (None means "returned nothing").  That
        key is the decision's ``downstream_key``: the effect's key, or for a business key
        the key and its attempt (``INV-9#2``), so that a provider that keeps its answers
        to a key (a cached decline) sees a business key's next attempt as a new request.
        ``business_key`` names an operation that is one thing across all runs (an invoice
        number); ``meta`` is free JSON stored with the intent (model, prompt version,
        trace id).  ``call_id``, instead of a business key, is a framework's own id of the
        tool call, kept across its resumes: the key is ``call_key(run, tool, call_id)``,
        and a new id in a later attempt whose call equals an effect an earlier attempt of
        the run recorded raises `DivergencePaused` (the model may have named that call
        anew after its answer was lost; extension 1.3).

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
        - ``pause`` of an effect whose outcome is unknown, given ``reconcile``
          (``reconcile(downstream_key, args)``, a lookup at the provider by the key the lost
          attempt gave it; `durable_ledger.outcomes`): its finding is recorded
          (``reconcile_effect``, for a tool an admin made reconcilable) and the call is
          asked again: a `Happened` replays its evidence as the result, a `NotHappened`
          executes the next attempt under a new provider key.  None, an exception of
          ``reconcile`` or a refusal (before the tool's grace; a tool nobody made
          reconcilable) leave the pause: `EffectPaused`, logged.
        - ``pause``: `EffectPaused`; a pause with no status (the call diverges from the
          run's earlier attempts, nothing was recorded for it): `DivergencePaused`, an
          `EffectPaused` too.  ``in_progress``: `EffectInProgress`.
        - the run was abandoned (SQLSTATE 55L02): `RunAbandoned`; the tool is retired, or
          not registered while `the ledger refuses tools nobody registered (`set_unregistered_tools('refuse', …)`)` (55L03):
          `ToolRefused`.  Nothing was recorded or performed; both stop the attempt (below):
          further calls raise `RunAbandoned` again, or `EffectPaused` after a refusal.

        Both reports name the attempt of the effect that ``begin_effect`` executed
        (``complete_effect(key, result, attempt)``, ``fail_effect(key, error, attempt)``):
        a business key is executed again after a failure (attempt 2, 3, ...), and a report
        must decide the attempt it is about and no other.  It is applied to that attempt
        also when this connection no longer holds the lease that began it; a report on an
        attempt that a later one has replaced never changes the later one: a refusal the
        ledger already recorded for it raises `EffectFailed` as usual, anything else
        `OutcomeNotRecorded` (kept as a conflict for a person).

        After an unknown outcome, a pause or a refused tool, every further call on ``run``
        in the same attempt through this `Ledger` raises `EffectPaused` (`RunAbandoned`
        once the run is known to be abandoned) without asking the database, until a new
        attempt starts (`acquire_run`, `release_run`, `attempt` or `token_attempt`).  Why: occurrences count identical calls within an attempt, so the
        same call retried in the same attempt would be occurrence 2, get a new key and
        ``execute`` -- a second payment.  A run whose outcome is unknown must stop, not
        improvise.

        Inside ``with ledger.token_attempt(run):`` the call belongs to that attempt: it
        passes the lease's token to ``begin_effect`` and runs each statement in its own
        transaction on whatever connection the `Ledger`'s source hands out.  The attempt
        is the one of the context the call runs in (the block's own thread, an asyncio
        task, ``asyncio.to_thread``, a function wrapped by ``lease.bind``); a call from a
        thread that does not carry it (a bare ``executor.submit``) is refused with
        `LedgerUsageError` while the attempt is open.  Once the attempt has ended, a call
        of it raises `LeaseLost` and performs nothing: a thread that outlives its attempt
        never acts under the next attempt nor under a session lease.  Once the lease is
        known to be lost, the call raises `LeaseLost` without asking the database; a
        ``begin_effect`` refused with 55L01 (the lease expired, was broken, released or
        superseded) wrote nothing and raises `LeaseLost`.  An effect that was in flight
        when the lease went has its outcome reported as usual (a report needs no lease):
        this call returns (or raises) as it would have, the next one raises `LeaseLost`.
        There is no implicit attempt: outside a token attempt, only a run this `Ledger`
        holds by ``attempt``/``acquire_run`` is called; any other call raises
        `LedgerUsageError` and records and performs nothing.  (Continuing an attempt it
        did not start -- an in-process retry of the run on the same connection -- would
        count the retried calls as new occurrences and perform them again.)
        """
        key = p.key_of_call(run, tool, business_key, call_id)
        return cast(R, self._call(run, tool, args, perform, key, meta,
                                  recorded=False, reconcile=reconcile))

    def record(self, run: str, tool: str, args: Any, call: Callable[[], R], *,
               meta: Any = None) -> R:
        """Make a call that is harmless to make again -- a model's turn, a read -- once per
        logical action, and return its result: recorded, and replayed like an effect.

        ``tool`` names it (``"model"``), ``args`` is its JSON input (the messages so far),
        ``call()`` makes it and returns a JSON-serialisable result; ``meta`` as in
        `guarded`.  On ``execute`` the result is recorded and returned (as recorded, so
        the first run and every replay see the same value); on ``replay`` ``call`` is not
        made and the recorded result is returned.  A replayed run so sees the very answers
        the model gave, and makes the same tool calls, which `guarded` then replays.

        Unlike `guarded`, an unknown outcome needs no person: if ``call`` raises (other
        than `EffectDidNotHappen`, which records a failure and raises `EffectFailed`,
        replayed as such), the exception propagates, nothing is recorded and the attempt
        stops (its further calls raise `AttemptStopped`, not an `EffectPaused`: no person
        is needed); the next attempt makes the call again (``begin_recorded`` executes it
        as the effect's attempt 2), as it does when the worker dies during the call.  (A
        retry inside the attempt would act on an answer that the replay, which makes the
        lost call again first, may not get.)  Never use it for a side effect: a tool
        registered as side-effecting is refused (`ToolRefused`).  Called inside an
        attempt, as `guarded` is.
        """
        return cast(R, self._call(run, tool, args, lambda _key: call(), None, meta,
                                  recorded=True))

    def local(self, run: str, tool: str, args: Any,
              write: Callable[["psycopg.Connection[Any]", str], R], *,
              business_key: Optional[str] = None, meta: Any = None) -> R:
        """Perform a local effect -- a write in the ledger's own database -- at most once per
        logical action, in one transaction with its intent and its outcome; its result.

        ``write(conn, key)`` makes the effect with SQL on ``conn`` (an order row, a balance
        moved) and returns a JSON-serialisable result; ``run``, ``tool``, ``args``,
        ``business_key`` and ``meta`` are `guarded`'s.  The call runs ``begin_local`` (the
        same decisions as ``begin_effect``), ``write`` in a savepoint, and the report in one
        transaction, committed at the end: the intent, the writes and the outcome are
        recorded together or not at all, so the effect is never unknown and never needs a
        person (docs/reference.md in the repository, "Local effects").

        - ``execute``: ``write`` runs; its result is recorded and returned (as recorded).
          ``write`` raises `EffectDidNotHappen`: its writes are rolled back to the
          savepoint, the failure is recorded and committed, `EffectFailed` is raised.
          ``write`` raises anything else: the whole transaction is rolled back, nothing is
          recorded, the exception propagates, and the attempt goes on (the same call
          again executes it again: nothing of it happened).
        - ``replay``, ``pause``, ``in_progress``: as `guarded` (``write`` is not called).
        - the COMMIT's answer is lost (the connection broke): it committed whole or not at
          all; the attempt stops (`AttemptStopped`: no person is needed) and the next one
          replays it or executes it.

        ``write`` must do nothing outside ``conn``'s transaction (no HTTP call, no other
        connection): only what commits with it is covered.  On a single connection the
        `Ledger` keeps it for the whole transaction; through a pool or a factory the
        transaction has a connection of its own.  Called inside an attempt, as `guarded` is.
        """
        lease = p.bound_lease(self, run)
        if lease is not None:
            p.enter_attempt(lease)
            try:
                return self._local(lease, run, tool, args, write, business_key, meta)
            finally:
                lease._leave()
        session = self._enter_session_call(run)
        try:
            return self._local(None, run, tool, args, write, business_key, meta)
        finally:
            if session is not None:
                session.leave()

    def _local(self, lease: Optional[TokenLease], run: str, tool: str, args: Any,
               write: Callable[["psycopg.Connection[Any]", str], R],
               business_key: Optional[str], meta: Any) -> R:
        """`local` in the attempt ``lease`` (None: the session's), on one connection."""
        halt = self._halter(run, lease)
        hold = self._holds.get(run) if lease is None else None
        query, params = p.begin_statement(run, tool, args, business_key, meta,
                                          lease.token if lease is not None else None,
                                          hold=hold, local=True, model=self._models.get(run))
        about = p.About(run, tool, from_row=True)
        answer: Optional[BaseException] = None  # raised once the transaction committed
        key: Optional[str] = None
        result: Any = None
        with self._connection(fresh=True) as conn:
            committing = False
            try:
                with conn.transaction():
                    row = self._local_begin(conn, lease, run, tool, query, params, halt, about)
                    key = begun = row["key"]
                    if hold is not None:
                        p.check_guard(row, run, hold, halt)
                    try:
                        decision = p.decision_of(row, run, tool, halt)
                    except LedgerError as exc:  # what begin_local wrote commits (a pause)
                        answer, decision = exc, None
                    if isinstance(decision, p.Replayed):
                        result = decision.result
                    elif decision is not None:
                        _, attempt, downstream_key = decision
                        result, answer = self._local_write(conn, run, begun, attempt, write,
                                                           downstream_key, halt, about)
                    committing = True
            except BaseException as exc:
                if committing and key is not None and not _refused_cleanly(exc, conn):
                    p.local_commit_unknown(run, tool, key, exc, halt)
                raise
        if answer is not None:
            raise answer
        return cast(R, result)

    def _local_begin(self, conn: "psycopg.Connection[Any]", lease: Optional[TokenLease],
                     run: str, tool: str, query: str, params: Tuple[Any, ...],
                     halt: p.HaltFn, about: p.About) -> Dict[str, Any]:
        """begin_local in the open transaction: its row, or the refusal as `guarded`'s."""
        try:
            rows = _execute_on(conn, query, params, shared=False,
                               what=f"begin_local of {tool}", about=about)
        except psycopg.Error as exc:
            refused = p.begin_refused(exc, lease, run, tool, halt)
            if refused is not None:
                raise refused from exc
            raise
        return rows[0]

    def _local_write(self, conn: "psycopg.Connection[Any]", run: str, key: str, attempt: int,
                     write: Callable[["psycopg.Connection[Any]", str], Any],
                     downstream_key: str, halt: p.HaltFn,
                     about: p.About) -> Tuple[Any, Optional[BaseException]]:
        """``write`` in a savepoint, then its report, in the open transaction: the result as
        recorded, and the `EffectFailed` to raise after the COMMIT when it refused."""
        refusal: Optional[EffectDidNotHappen] = None
        try:
            with conn.transaction():
                result = write(conn, downstream_key)
        except EffectDidNotHappen as exc:
            refusal = exc
        function, expected, payload = (("fail_effect", "failed", refusal.error) if refusal
                                       else ("complete_effect", "completed", result))
        query, params = p.report_statement(function, key, payload, attempt, self._route(run))
        row = _execute_on(conn, query, params, shared=False, what=f"{function} of {key}",
                          about=about)[0]
        p.judge_report(row, run, key, attempt, function, expected, payload, halt)
        if refusal is not None:
            return None, p.refusal_recorded(key, refusal)
        return row["result"], None

    def _call(self, run: str, tool: str, args: Any, perform: Perform,
              business_key: Optional[str], meta: Any, *, recorded: bool,
              reconcile: Optional[Reconcile] = None) -> Any:
        """`guarded` or `record`, in the attempt the call belongs to."""
        lease = p.bound_lease(self, run)
        if lease is not None:
            p.enter_attempt(lease)
            try:
                return self._guarded(lease, run, tool, args, perform, business_key, meta,
                                     recorded, reconcile)
            finally:
                lease._leave()
        session = self._enter_session_call(run)
        try:
            return self._guarded(None, run, tool, args, perform, business_key, meta,
                                 recorded, reconcile)
        finally:
            if session is not None:
                session.leave()

    def _bound_session(self, run: str) -> Optional[_SessionAttempt]:
        return p.bound_session(_SESSIONS, self, run)

    @staticmethod
    def bind(fn: Callable[..., R]) -> Callable[..., R]:
        """``fn`` to run in a copy of the calling context: submit ``ledger.bind(tool)``
        to a thread pool from inside an attempt (``attempt`` or ``token_attempt``), and its
        calls belong to that attempt.  (A thread does not inherit the attempt of the code
        that started it: its calls would be refused.)"""
        context = contextvars.copy_context()

        @functools.wraps(fn)
        def bound(*args: Any, **kwargs: Any) -> R:
            return context.copy().run(fn, *args, **kwargs)
        return bound

    def _guarded(self, lease: Optional[TokenLease], run: str, tool: str, args: Any,
                 perform: Perform, business_key: Optional[str], meta: Any,
                 recorded: bool, reconcile: Optional[Reconcile] = None) -> Any:
        halt = self._halter(run, lease)
        row = self._begin(lease, run, tool, args, business_key, meta, recorded, halt)
        if reconcile is not None and not recorded and p.reconcilable(row):
            try:
                settled = self._reconciled(lease, run, tool, args, row, reconcile)
            except BaseException:  # the pause stands: the attempt stops at it
                p.halt_at_pause(row, run, tool, halt)
                raise
            if settled:
                row = self._begin(lease, run, tool, args, business_key, meta, recorded, halt)
        decision = p.decision_of(row, run, tool, halt)
        if isinstance(decision, p.Replayed):
            return decision.result
        key, attempt, downstream_key = decision
        try:
            result = perform(downstream_key)
        except EffectDidNotHappen as refusal:
            self._record(run, key, attempt, "fail_effect", "failed", refusal.error, lease,
                         recorded)
            raise p.refusal_recorded(key, refusal) from refusal
        except BaseException as exc:
            if recorded:  # made again by the next attempt: nothing for a person
                p.recorded_call_raised(run, tool, key, exc, halt)
            else:
                p.outcome_unknown(run, tool, key, exc, halt)
            raise
        return self._record(run, key, attempt, "complete_effect", "completed", result,
                            lease, recorded)["result"]

    def _begin(self, lease: Optional[TokenLease], run: str, tool: str, args: Any,
               business_key: Optional[str], meta: Any, recorded: bool,
               halt: p.HaltFn) -> Dict[str, Any]:
        """begin_effect (begin_recorded) of the call, under the attempt's lease: its row."""
        about = p.About(run, tool, from_row=True)
        if lease is None:
            hold = self._holds.get(run)
            try:
                row = self._one(*p.begin_statement(run, tool, args, business_key, meta,
                                                   recorded=recorded, hold=hold,
                                                   model=self._models.get(run)),
                                what=f"begin_effect of {tool}", about=about)
            except LedgerUsageError as exc:
                if _not_committed(exc):
                    p.begin_not_committed(run, tool, halt, recorded)
                raise
            except psycopg.Error as exc:
                if not _refused_cleanly(exc, self.conn):  # (a proxy's 08/57: maybe committed)
                    p.begin_uncertain(run, tool, exc, halt, recorded)
                refused = p.refusal(exc, run, tool, halt)
                if refused is not None:
                    raise refused from exc
                raise
            if hold is not None:
                p.check_guard(row, run, hold, halt)  # PoolerDetected, LeaseLost
            return row
        return self._token_begin(lease, tool, args, business_key, meta, recorded)

    def _reconciled(self, lease: Optional[TokenLease], run: str, tool: str, args: Any,
                    row: Dict[str, Any], reconcile: Reconcile) -> bool:
        """Asks the provider about a paused effect whose outcome is unknown
        (``reconcile``), once ``reconcilable_from`` says the tool's grace has passed (a
        lookup made earlier may miss a request still in flight), and records its finding
        (``reconcile_effect``, idempotent: sent again on a fresh connection if the reply is
        lost); True when it was recorded, and the call is to be asked again."""
        key = row["key"]
        about = p.About(run, tool, key, from_row=True)
        due = self._leaseless_one(lease, *p.reconcile_due_statement(row, self._route(run)),
                                    what=f"reconcilable_from of {key}", about=about)
        if not p.reconcile_due(row, due, run, tool):
            return False
        try:
            found = p.checked_finding(reconcile(row["downstream_key"], args), run, tool, key)
        except Exception as exc:
            p.reconcile_failed(run, tool, key, exc)
            return False
        if found is None:
            return False
        query, params = p.reconcile_statement(row, found, self._route(run))
        try:
            self._leaseless_one(lease, query, params, what=f"reconcile_effect of {key}",
                                about=about)
        except WrongState as exc:
            p.reconcile_refused(run, tool, key, exc)
            return False
        return True

    def _token_begin(self, lease: TokenLease, tool: str, args: Any,
                     business_key: Optional[str], meta: Any, recorded: bool) -> Dict[str, Any]:
        """begin_effect (begin_recorded) in the token lease's epoch, in a transaction of its
        own."""
        run = lease.run
        halt = self._halter(run, lease)
        try:
            return self._pooled_one(
                *p.begin_statement(run, tool, args, business_key, meta, lease.token,
                                   recorded=recorded, model=self._models.get(run)),
                on_uncertain=lambda exc: p.begin_uncertain(run, tool, exc, halt, recorded),
                what=f"begin_effect of {tool}", about=p.About(run, tool, from_row=True))
        except LedgerUsageError as exc:
            if _not_committed(exc):
                p.begin_not_committed(run, tool, halt, recorded)
            raise
        except psycopg.Error as exc:
            refused = p.begin_refused(exc, lease, run, tool, halt)
            if refused is not None:
                raise refused from exc
            raise

    def _leaseless_one(self, lease: Optional[TokenLease], query: str, params: Tuple[Any, ...], *, what: str,
                        about: p.About) -> Dict[str, Any]:
        """A statement that needs no lease (a report, a reconciler's finding): for a token
        attempt or a pool, in a transaction of its own; for a session attempt, on the
        session's connection.  Through a pool or a factory it is sent once more on a fresh
        connection if its answer is lost or no connection could be had (each is
        idempotent); a single connection is never replaced."""
        if lease is not None or self.conn is None:
            return self._pooled_one(query, params, retry=True, what=what, about=about)
        return self._one(query, params, what=what, about=about)

    def _record(self, run: str, key: str, attempt: int, function: str, expected: str,
                payload: Any, lease: Optional[TokenLease], recorded: bool) -> Dict[str, Any]:
        """complete_effect / fail_effect on ``attempt`` (see `p.report_statement`);
        anything but a clean record is `OutcomeNotRecorded`.

        The way it goes out was decided when the call began: a call of a token attempt
        (``lease``) reports on any connection (a report needs no token), also after the
        attempt or its lease ended; one whose connection broke before the reply is sent
        once more on a fresh connection (a report is idempotent: the same payload on the
        same attempt changes nothing the second time).
        """
        halt = self._halter(run, lease)
        query, params = p.report_statement(function, key, payload, attempt, self._route(run))
        about = p.About(run, None, key, from_row=True)
        try:
            row = self._leaseless_one(lease, query, params, what=f"{function} of {key}",
                                      about=about)
        except BaseException as exc:
            failed = p.report_failed(run, key, function, expected, payload, exc, halt,
                                     recorded)
            if not isinstance(exc, Exception):
                raise
            raise failed from exc
        judged: Dict[str, Any] = p.judge_report(row, run, key, attempt, function, expected,
                                                payload, halt, recorded)
        return judged

    # ---------------------------------------------------------------- decorator

    def tool(
        self,
        name: str,
        *,
        business_key: Optional[Callable[[Any], Optional[str]]] = None,
        reconcile: Optional[Reconcile] = None,
    ) -> Callable[[Callable[[Any, str], R]], Tool[R]]:
        """Decorator for a side-effecting tool ``fn(args, idempotency_key) -> result``.

        The decorated function is called as ``fn(run, args, *, business_key=None,
        meta=None)`` and goes through `guarded` under the tool name ``name``; it returns
        what ``fn`` returns (typed: a `Tool` of ``fn``'s result type); the ledger's
        key reaches ``fn`` as its second argument, to be passed downstream as the
        idempotency key.  ``business_key``, if given, derives the business key from the
        args (``lambda a: a["invoice"]``); a ``business_key=`` at call time wins.
        A read needs no decorator, but if its result reaches the model (every tool result
        in an agent loop does) or decides which effects are made, record it with `record`:
        a replay must see what the first attempt saw, or a changed answer leads to other,
        reworded calls with new keys.  Only a read whose result decides nothing may stay
        unrecorded.  ``reconcile(downstream_key, args)``, if given, is asked about an
        effect of the tool whose outcome is unknown before `EffectPaused` is raised (see
        `guarded`; `durable_ledger.outcomes`).
        """
        key_of = business_key  # the parameter name is reused by the decorated function

        def decorate(fn: Callable[[Any, str], R]) -> Tool[R]:
            @functools.wraps(fn)
            def call(run: str, args: Any, *, business_key: Optional[str] = None,
                     meta: Any = None) -> R:
                if business_key is None and key_of is not None:
                    business_key = key_of(args)
                return self.guarded(run, name, args, lambda key: fn(args, key),
                                    business_key=business_key, meta=meta, reconcile=reconcile)

            del call.__wrapped__  # type: ignore[attr-defined]  # its signature is not ours
            call.tool = name  # type: ignore[attr-defined]
            call.perform = fn  # type: ignore[attr-defined]
            call.ledger = self  # type: ignore[attr-defined]
            return cast(Tool[R], call)

        return decorate

    # ------------------------------------------------------------------ leases

    def acquire_run(self, run: str, wait: bool = True) -> bool:
        """Start a new attempt at ``run``: take its lease and start a new lease epoch.

        Returns False (only with ``wait=False``) when another session holds the run; a
        wait that ends (``lock_timeout``, else ``durable_ledger.lease_wait_timeout``)
        raises `RunBusy` naming the holder, and a run this `Ledger` already holds (an open
        attempt) raises `LedgerUsageError`.
        Occurrence counters start again at 1, which is what lines a retried run up with
        the keys of its earlier attempt -- so call it at the start of every attempt on a
        connection that outlives attempts (a pool).  Also lifts this client's stop on
        ``run`` after a pause or an unknown outcome: the new attempt will meet the
        unresolved effect again in the ledger, at the same occurrence.  Raises
        `RunAbandoned` (nothing written) when a person abandoned the run.  The calls of
        the attempt are guarded as in `attempt` (`PoolerDetected`), and `release_run`
        ends its lease where it is held.
        """
        self._session_only("acquire_run()")
        self._reserve(run)
        try:
            return self._acquire(run, wait)
        finally:
            self._acquiring.discard(run)

    def _reserve(self, run: str) -> None:
        """Claims ``run`` for one attempt of this Ledger before its acquire_run goes out:
        two at once (a job delivered twice) would share one lease epoch."""
        with self._leases_lock:
            if run in self._sessions or run in self._session_held or run in self._acquiring:
                raise p.attempt_already_open(run)
            self._acquiring.add(run)

    def _acquire(self, run: str, wait: bool) -> bool:
        self._check_writable()
        try:
            row = self._one(p.ACQUIRE_RUN, p.acquire_params(run, wait),
                            what=f"acquire_run of {run}", about=p.About(run))
        except psycopg.Error as exc:
            if exc.sqlstate == RUN_ABANDONED:
                raise _abandoned(run, exc) from exc
            raise
        hold = p.session_hold(row, run)
        if hold is None:
            return False
        self._halted.pop(run, None)
        self._holds[run] = hold
        self._session_held.add(run)
        return True

    def release_run(self, run: str) -> bool:
        """End this session's lease on ``run`` (False if it did not hold it).

        For a run held by `acquire_run` of this `Ledger`, the lease of that attempt's
        epoch: released where the statement reaches its session, else ended by
        ``release_attempt`` wherever it is held (True when it was ended; False, with a
        WARNING, when the role may not terminate the server connection that holds it).

        Effects still ``started`` under it become ``unknown`` for the next attempt.  Not
        inside the run's ``attempt()`` block, which releases it at its end (the block's
        calls would go on under an implicit lease, in a new epoch): `LedgerUsageError`.
        """
        self._session_only("release_run()")
        if run in self._sessions:
            raise p.release_inside_attempt(run)
        self._check_writable()
        self._session_held.discard(run)
        try:
            return self._release(run)
        finally:
            self._halted.pop(run, None)

    def _release(self, run: str) -> bool:
        """release_run of ``run`` where its attempt's lease is (see `Ledger.release_run`)."""
        hold = self._holds.pop(run, None)
        if hold is None:  # not an attempt of this Ledger: its epoch is not known
            return bool(self._one(p.RELEASE_RUN, (run,), what=f"release_run of {run}",
                                  about=p.About(run))["ok"])
        row = self._one(p.RELEASE_GUARDED, p.release_params(run, hold),
                        what=f"release_run of {run}", about=p.About(run))
        if row["released"] is not None:
            return bool(row["released"])
        # The statement did not reach the attempt's session: end the attempt's lease where
        # it is held, so that the lock is not left on a pooled server connection.
        try:
            ended = self._one(p.RELEASE_ATTEMPT, (run, hold.epoch),
                              what=f"release_attempt of {run}",
                              about=p.About(run))["release_attempt"]
        except PermissionDenied as exc:
            p.release_refused(run, hold, row, exc)
            return False
        p.released_elsewhere(run, hold, row, bool(ended))
        return bool(ended)

    @contextmanager
    def attempt(self, run: str, *, wait: bool = True,
                model: Optional[str] = None) -> Iterator[str]:
        """``with ledger.attempt(run):`` -- one attempt at a run on a pooled connection.

        Acquires the lease (a new epoch) at entry and releases it at exit, also when the
        body raises, so that a connection going back to the pool carries no lease.
        ``wait=False`` raises `RunBusy` at once if another session holds the run;
        `RunAbandoned` when a person abandoned it (do not retry it).  If the
        connection broke, there is nothing to release: the lease ended with the session.

        The entry reads the lease's epoch and server process in the statement that takes
        it, and every call of the attempt is made only where its statement reached that
        session (extension 1.3): through a transaction pooler (PgBouncer in transaction
        mode) a call that lands on another server connection raises `PoolerDetected`
        before anything is performed, and one whose session lost the lease `LeaseLost`;
        either stops the attempt.  The exit releases the lease where the statement
        reaches the attempt's session, else ends it with ``release_attempt`` (the holding
        server connection is terminated when the role may do so; if not, a WARNING says
        where the lease stays and until when).
        """
        self._session_only("attempt()")
        p.check_model(model)
        self._reserve(run)
        session = _SessionAttempt(run, self)
        self._sessions[run] = session
        try:
            if not self._acquire(run, wait):
                raise RunBusy(None, None, f"run {run!r} is held by another session")
        except BaseException:
            self._sessions.pop(run, None)
            raise
        finally:
            self._acquiring.discard(run)
        assert self.conn is not None
        bound = _SESSIONS.set(_SESSIONS.get() + (session,))
        if model is not None:
            self._models[run] = model
        body_failed = False
        try:
            yield run
        except BaseException:
            body_failed = True
            raise
        finally:
            try:
                self._end_session(bound, session)  # may be interrupted (a job's time-out)
            finally:
                self._release_at_end(run, body_failed)

    def _release_at_end(self, run: str, body_failed: bool) -> None:
        """release_run at the end of an attempt() block, however it ended."""
        assert self.conn is not None
        if self.conn.closed or self.conn.broken:
            self._holds.pop(run, None)
            return  # the lease ended with the session
        try:
            self._release(run)
        except Exception:
            if not body_failed:
                raise
            # the body's exception is the one that matters
            log.warning("could not release run %s after an error", run, exc_info=True)

    def _end_session(self, bound: "contextvars.Token[Tuple[_SessionAttempt, ...]]",
                     session: _SessionAttempt) -> None:
        """The end of an attempt() block: no new call of it; those in flight finish."""
        try:
            _SESSIONS.reset(bound)
        except ValueError:  # left in another context than it was entered in
            _SESSIONS.set(tuple(s for s in _SESSIONS.get() if s is not session))
        try:
            session.end()
        finally:  # also when the wait is interrupted: the run is not held for good
            session.ended = True
            self._sessions.pop(session.run, None)
            self._session_held.discard(session.run)
            self._halted.pop(session.run, None)
            self._models.pop(session.run, None)

    # ------------------------------------------------------------ token leases

    @contextmanager
    def token_attempt(
        self,
        run: str,
        *,
        ttl: Union[float, timedelta] = timedelta(minutes=5),
        holder: Optional[str] = None,
        model: Optional[str] = None,
    ) -> Iterator[TokenLease]:
        """``with ledger.token_attempt(run, ttl=60) as lease:`` -- one attempt at a run
        under a token lease, on a pool of connections or a pooled one.

        At entry ``take_lease(run, ttl, holder)`` starts a new attempt (a new lease epoch:
        occurrence counters start again at 1, so the attempt replays what earlier attempts
        completed) and hands out a token; `RunBusy` when a live lease of either kind holds
        the run (``take_lease`` never waits); `RunAbandoned` when a person abandoned the
        run (do not retry it).  ``ttl`` (seconds, or a ``timedelta``; 1 s to
        1 day) is how long the lease lives without renewal; ``holder`` names the worker in
        ``durable_ledger.leases``.

        Inside, every `guarded` call (and every decorated tool) on ``run`` through this
        `Ledger` made in the block's context passes the token to ``begin_effect``, and
        every statement -- intent, report, renewal -- runs in its own short transaction on
        whatever connection the source hands out, so that consecutive calls may land on
        different backends (psycopg_pool, PgBouncer ``pool_mode = transaction``).  No
        session lock is taken.  The block's context is what makes a call part of the
        attempt: asyncio tasks and ``asyncio.to_thread`` inherit it; a thread of a
        ``ThreadPoolExecutor`` does not, so submit ``lease.bind(fn)`` to it (a call from a
        thread without the attempt is refused).

        When the block is left (normally or by an exception), the attempt ends: its calls
        that have not begun yet raise `LeaseLost` and perform nothing (a thread that
        outlives the block never acts under the next attempt), and the exit waits for
        the calls in flight in other threads to finish, their outcome reported.

        A background thread renews the lease every ``ttl / 3`` until then, also while a
        tool or a model call is running; a renewal that fails for another reason than a
        lost lease (the database unreachable for a moment) is retried within a second,
        and the log says so.  At exit the renewal stops and ``release_lease`` ends the
        lease, also when the body raises.  Reports, renewals and the release whose
        connection broke before the reply (a stale pooled connection) are sent once more
        on a fresh one; a ``begin_effect`` never is.

        A lost lease (expired, broken by an admin, superseded: SQLSTATE 55L01 from
        ``begin_effect`` or from a renewal) stops the attempt: the next `guarded` call on
        ``run`` raises `LeaseLost` without asking the database, ``lease.check()`` raises
        it (call it before long steps that do not go through the ledger), and so does the
        end of the ``with`` block if the body itself did not raise.  A call that was in
        flight is not cut short: its outcome is reported, since a report needs no lease.
        """
        ttl = p.as_ttl(ttl)
        with self._leases_lock:
            if run in self._leases or run in self._opening:
                raise p.attempt_already_open(run)
            self._opening.add(run)
        try:
            # Sent again on a fresh connection if the first one broke: a take_lease that
            # did commit unseen leaves the run held until its ttl, and the second answers
            # NULL (RunBusy) -- no worse than the error.
            try:
                row = self._pooled_one(p.TAKE_LEASE, (run, ttl, holder), retry=True,
                                       what=f"take_lease of {run}")
            except psycopg.Error as exc:
                if exc.sqlstate == RUN_ABANDONED:
                    raise _abandoned(run, exc) from exc
                raise
            lease = p.new_lease(row, run, ttl, self, TokenLease)
            self._halted.pop(run, None)  # a new attempt
            self._leases[run] = lease
            if model is not None:
                self._models[run] = model
        finally:
            self._opening.discard(run)
        renewer = _Renewal(self, lease)
        log.debug("token attempt at %s: epoch %s, ttl %s", run, lease.epoch, ttl)
        bound = _ATTEMPTS.set(_ATTEMPTS.get() + (lease,))
        try:
            yield lease
        except BaseException:
            p.unbind(bound, lease)
            self._end_token_attempt(lease, renewer, body_failed=True)
            raise
        p.unbind(bound, lease)
        self._end_token_attempt(lease, renewer, body_failed=False)
        lease.check()

    def _renew(self, lease: TokenLease, stop: threading.Event, first: float) -> None:
        """The renewal thread of a token attempt: renew_lease after ``first`` seconds, then
        every ttl / 3, until stopped."""
        every = lease.ttl.total_seconds() / 3
        wait = first
        while not stop.wait(wait):
            if self.conn is not None and self.conn.closed:
                return
            try:
                row = self._pooled_one(p.RENEW_LEASE, (lease.token,), retry=True,
                                       what=f"renew_lease of {lease.run}")
            except Exception as exc:
                if stop.is_set():
                    return
                if isinstance(exc, psycopg.Error) and exc.sqlstate == LEASE_LOST:
                    lease._lose(exc)
                    return
                log.warning("could not renew the token lease on run %s (retrying): %s: %s",
                            lease.run, type(exc).__name__, exc)
                wait = min(every, 1.0)
                continue
            lease.expires_at = row["expires_at"]
            lease.renewals += 1
            wait = every

    def _end_token_attempt(self, lease: TokenLease, renewer: "_Renewal", *,
                           body_failed: bool) -> None:
        # Calls of the attempt not begun yet are refused from now on; those in flight in
        # other threads finish first (the lease is still renewed meanwhile).
        lease._end()
        renewer.end()  # a renewal in flight finishes first
        self._leases.pop(lease.run, None)
        self._halted.pop(lease.run, None)
        self._models.pop(lease.run, None)
        if lease.lost is not None:
            return  # nothing to release
        try:
            rows, resent = self._pooled_rows(p.RELEASE_LEASE, (lease.token,), retry=True,
                                             what=f"release_lease of {lease.run}")
        except Exception:
            if not body_failed:
                raise
            # the body's exception is the one that matters; the lease expires by itself
            log.warning("could not release the token lease on run %s after an error",
                        lease.run, exc_info=True)
            return
        p.released(lease, rows[0]["released"], resent)

    # ------------------------------------------------------------------- reads

    def effect_status(self, key: str, run: Optional[str] = None) -> Optional[Dict[str, Any]]:
        """The effect's row of ``durable_ledger.effects`` as a dict, or None if never seen.

        A ``started`` effect whose lease has ended is reported ``unknown``: the question
        is "may it still be in flight?".  Read-only, so allowed inside a transaction.
        ``run``: the effect's run, which a ``routed`` ledger passes on (the proxy then asks
        only its shard); ignored otherwise.
        """
        about = p.About(key=key, from_row=True)
        query, params = p.routed(p.EFFECT_STATUS, (key,), self._route(run))
        if self.conn is None:
            rows = self._pooled_all(query, params, about=about)
        else:
            rows = self._read(query, params, about)
        return rows[0] if rows else None

    def history(self, run: str) -> List[Dict[str, Any]]:
        """The run's timeline: the rows of ``durable_ledger.history(run)``, in order.

        One dict per audit event, oldest first, with the columns ``id``, ``logged_at``,
        ``lease_epoch`` (the attempt), ``event`` (``lease_acquired``, ``intent``,
        ``replay``, ``pause``, ``completed``, ``failed``, ``divergence``,
        ``divergence_resolved``, ``run_abandoned``, ...), ``key``, ``tool``, ``args``,
        ``attempt``, ``outcome`` (the result or error the event concerns), ``detail``,
        ``role_name`` and ``application_name``.  An empty list for a run the ledger never
        saw.

        Needs the ``durable_ledger_auditor`` role (or admin): a worker role alone gets
        `PermissionDenied`.  Needs the extension at version 1.2.
        Read-only: on a single connection it may run inside a transaction; on a pool (or a
        factory) it uses a connection of its own, like any call.
        """
        if self.conn is None:
            return self._pooled_all(p.HISTORY, (run,), what=f"history of {run}",
                                    about=p.About(run))
        return self._read(p.HISTORY, (run,), p.About(run))

    # ----------------------------------------------------------------- helpers

    def _read(self, query: str, params: Tuple[Any, ...], about: p.About) -> List[Dict[str, Any]]:
        """A read on the single connection, also inside a transaction (it writes nothing)."""
        assert self.conn is not None
        notices: List[Any] = []
        rows: Optional[List[Dict[str, Any]]] = None
        try:
            with self._conn_lock, p.notices_of(self.conn, notices), p.ledger_errors(), \
                    self.conn.cursor(row_factory=dict_row) as cur:
                cur.execute(query, params)
                rows = cur.fetchall()
        finally:
            p.log_notices(notices, about, rows)
        return rows

    def _one(self, query: str, params: Tuple[Any, ...], *, what: str = "a ledger statement",
             about: p.About = p.NOWHERE) -> Dict[str, Any]:
        """A statement on the single connection (session leases), checked to have committed."""
        assert self.conn is not None
        with self._conn_lock:
            rows = _execute_on(self.conn, query, params, shared=True, what=what, about=about)
        assert len(rows) == 1, query
        return rows[0]

    @contextmanager
    def _connection(self, *, fresh: bool = False) -> Iterator["psycopg.Connection[Any]"]:
        """A connection for one statement of a token attempt (or of a pooled Ledger).

        The single connection, serialised with the renewal threads; or one from the pool or
        the factory, given back (or closed) right after the statement.  ``fresh``: one that
        answered an empty query just now (a pool may hand out a connection that died while
        idle: psycopg_pool 3.1 does not check them); the dead ones are given back (the pool
        discards them) and the next one is tried.
        """
        if self._borrow is None:
            with self._conn_lock:
                self._check_writable()
                yield self.conn  # type: ignore[misc]
            return
        tries = p.borrow_tries(self._source, fresh)
        if self._getconn is not None:
            for _ in range(tries):
                try:
                    conn = self._getconn()
                except psycopg.OperationalError as exc:  # (a PoolTimeout) nothing was sent
                    raise _NotSent(f"the connection source handed out no connection ({exc})") from exc
                try:
                    alive = not (conn.closed or conn.broken or (fresh and not _answers(conn)))
                    if not p.usable_lent(conn, alive, fresh):
                        continue  # given back broken: the pool discards it
                    try:
                        yield conn
                    except BaseException:
                        # as the pool's connection() does: what is left open rolled back
                        if not conn.closed and conn.pgconn.transaction_status != TransactionStatus.IDLE:
                            conn.rollback()
                        raise
                    if not conn.closed and conn.pgconn.transaction_status != TransactionStatus.IDLE:
                        conn.commit()
                    return
                finally:
                    self._putconn(conn)
            raise psycopg.OperationalError(f"the connection source handed out no working "
                                           f"connection in {tries} tries")
        for _ in range(tries):
            # the connection source's connection, given back at the end; one that cannot be
            # had (it cannot connect; a pool's PoolTimeout) raises `_NotSent`: nothing was
            # sent, so an idempotent statement may be sent on the next one
            try:
                source = self._borrow()
            except psycopg.OperationalError as exc:
                raise _NotSent(f"the connection source handed out no connection ({exc})") from exc
            if not hasattr(source, "__enter__"):
                raise TypeError("the connection source must hand out synchronous psycopg "
                                "connections (a psycopg_pool.ConnectionPool, or a function "
                                "returning a psycopg.Connection)")
            handed_out = False
            try:
                with source as conn:
                    handed_out = True
                    if not isinstance(conn, psycopg.Connection):
                        raise TypeError(f"the connection source handed out {type(conn).__name__}, "
                                        f"not a psycopg.Connection")
                    alive = not (conn.closed or conn.broken or (fresh and not _answers(conn)))
                    if not p.usable_lent(conn, alive, fresh):
                        continue  # given back broken: the pool discards it
                    yield conn
                    return
            except psycopg.OperationalError as exc:
                if handed_out:
                    raise
                raise _NotSent(f"the connection source handed out no connection ({exc})") from exc
        raise psycopg.OperationalError(f"the connection source handed out no working "
                                       f"connection in {tries} tries")

    def _pooled_rows(self, query: str, params: Tuple[Any, ...], *,
                     on_uncertain: Optional[Callable[[BaseException], None]] = None,
                     retry: bool = False, what: str = "a ledger statement",
                     about: p.About = p.NOWHERE) -> Tuple[List[Dict[str, Any]], bool]:
        """One statement in a transaction of its own, committed before this returns; and
        whether it was sent a second time.

        Never a prepared statement: through PgBouncer in transaction mode the next call
        may land on a backend that never saw it.  ``on_uncertain(exc)`` is called when the
        statement went out and it is unknown whether it committed.  ``retry``: the
        statement is idempotent (a report, a renewal, a release), and one whose connection
        broke before its reply (an OperationalError: a pooled connection that died while
        idle, a restarted PgBouncer) is sent once more, on a fresh connection of a pool or
        a factory.  A begin_effect is never retried.
        """
        broke: List[BaseException] = []
        try:
            return (self._pooled_once(query, params, on_uncertain, broke, what, about,
                                      fresh=False), False)
        except psycopg.OperationalError as exc:
            if not (retry and self._borrow is not None and (broke or isinstance(exc, _NotSent))):
                raise
            p.warn_resend(what, exc)
            first = exc
        try:
            return self._pooled_once(query, params, None, [], what, about, fresh=True), True
        except BaseException as again:
            if again.__context__ is None:
                again.__context__ = first
            raise

    def _pooled_once(self, query: str, params: Tuple[Any, ...],
                     on_uncertain: Optional[Callable[[BaseException], None]],
                     broke: List[BaseException], what: str, about: p.About, *, fresh: bool,
                     ) -> List[Dict[str, Any]]:
        if self._plain_path and not fresh:
            return self._pooled_once_plain(query, params, on_uncertain, broke, what, about)
        with self._connection(fresh=fresh) as conn:
            try:
                return _execute_on(conn, query, params, shared=self._borrow is None, what=what,
                                   about=about)
            except BaseException as exc:
                p.note_uncertain(exc, conn, broke, on_uncertain)
                raise

    def _pooled_once_plain(self, query: str, params: Tuple[Any, ...],
                           on_uncertain: Optional[Callable[[BaseException], None]],
                           broke: List[BaseException], what: str,
                           about: p.About) -> List[Dict[str, Any]]:
        """`_pooled_once` on a psycopg_pool pool, not fresh: what `_connection` and
        `_execute_on` do for it, the connection's state read once (issue 34): an idle
        one (`p.plain_ready`: open, idle, in no pipeline, so usable) takes the statement
        sent straight; any other goes `_connection`'s way."""
        assert self._getconn is not None and self._putconn is not None
        try:
            conn = self._getconn()
        except psycopg.OperationalError as exc:  # (a PoolTimeout) nothing was sent
            raise _NotSent(f"the connection source handed out no connection ({exc})") from exc
        sent = False  # the statement went out (what it left open is rolled back)
        try:
            with conn.lock:
                plain = p.plain_ready(conn)
                if plain:
                    sent = True
                    rows = _sent_once(conn, lambda: _send_plain(conn, query, params, what, about),
                                      on_uncertain, broke)
            if not plain:
                p.usable_lent(conn, not (conn.closed or conn.broken), False)
                sent = True
                rows = _sent_once(conn, lambda: _execute_on(conn, query, params, shared=False,
                                                            what=what, about=about),
                                  on_uncertain, broke)
                if not conn.closed and conn.pgconn.transaction_status != TransactionStatus.IDLE:
                    conn.commit()
            return rows
        except BaseException:
            # as the pool's connection() does: what the statement left open rolled back
            if (sent and not conn.closed
                    and conn.pgconn.transaction_status != TransactionStatus.IDLE):
                conn.rollback()
            raise
        finally:
            self._putconn(conn)

    def _pooled_all(self, query: str, params: Tuple[Any, ...], *,
                    on_uncertain: Optional[Callable[[BaseException], None]] = None,
                    retry: bool = False, what: str = "a ledger statement",
                    about: p.About = p.NOWHERE) -> List[Dict[str, Any]]:
        return self._pooled_rows(query, params, on_uncertain=on_uncertain, retry=retry,
                                 what=what, about=about)[0]

    def _pooled_one(self, query: str, params: Tuple[Any, ...], *,
                    on_uncertain: Optional[Callable[[BaseException], None]] = None,
                    retry: bool = False, what: str = "a ledger statement",
                    about: p.About = p.NOWHERE) -> Dict[str, Any]:
        rows = self._pooled_all(query, params, on_uncertain=on_uncertain, retry=retry,
                                what=what, about=about)
        assert len(rows) == 1, query
        return rows[0]


class _Renewal:
    """The renewal of one token attempt's lease: a thread of its own ("durable_ledger
    renewal of RUN") that renews it every ttl / 3, started by the clock (`_CLOCK`) when the
    first renewal is due.  An attempt shorter than ttl / 3 -- the common one -- starts no
    thread at all (issue 34: a thread started and joined per attempt was a tenth of a
    guarded call's CPU)."""

    def __init__(self, ledger: "Ledger", lease: TokenLease) -> None:
        self.ledger: Optional[Ledger] = ledger
        self.lease: Optional[TokenLease] = lease
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ended = False
        self.thread: Optional[threading.Thread] = None
        _CLOCK.add(time.monotonic() + lease.ttl.total_seconds() / 3, self)

    def start(self) -> None:
        """The first renewal is due: the renewal thread starts (unless the attempt ended)."""
        with self.lock:
            if self.ended or self.ledger is None or self.lease is None:
                return
            self.thread = threading.Thread(
                target=self.ledger._renew, args=(self.lease, self.stop, 0.0), daemon=True,
                name=f"durable_ledger renewal of {self.lease.run}")
            self.thread.start()

    def end(self) -> None:
        """No renewal starts from now on; one in flight finishes first."""
        with self.lock:
            self.ended = True
            thread, self.ledger, self.lease = self.thread, None, None
        self.stop.set()
        if thread is None:
            _CLOCK.ended()  # still in its schedule
        if thread is not None:
            thread.join(timeout=30)


class _RenewalClock:
    """One daemon thread ("durable_ledger lease clock", started with the first token
    attempt) that starts each attempt's renewal when it is due.  An attempt that ended is
    dropped from its schedule (at once from its head; the rest when they are half of it)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """An empty schedule.  Also in a child a fork() made: the parent's attempts (and the
        connections their renewals would use, the parent's sockets) are not the child's."""
        self.cond = threading.Condition()
        self.due: List[Tuple[float, int, _Renewal]] = []  # a heap, by time
        self.seq = itertools.count()
        self.dropped = 0  # renewals in self.due whose attempt has ended
        self.thread: Optional[threading.Thread] = None

    def add(self, when: float, renewal: _Renewal) -> None:
        with self.cond:
            heapq.heappush(self.due, (when, next(self.seq), renewal))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, daemon=True,
                                               name="durable_ledger lease clock")
                self.thread.start()
            elif self.due[0][2] is renewal:
                self.cond.notify()

    def ended(self) -> None:
        with self.cond:
            self.dropped += 1
            if self.due and self.due[0][2].ended:
                self.cond.notify()  # the clock drops it from the head at once
            if self.dropped > 64 and self.dropped * 2 > len(self.due):
                self.due = [entry for entry in self.due if not entry[2].ended]
                heapq.heapify(self.due)
                self.dropped = 0

    def _run(self) -> None:
        with self.cond:
            while True:
                while self.due and self.due[0][2].ended:
                    heapq.heappop(self.due)
                    self.dropped = max(0, self.dropped - 1)
                if not self.due:
                    self.cond.wait()
                    continue
                wait = self.due[0][0] - time.monotonic()
                if wait > 0:
                    self.cond.wait(wait)
                    continue
                renewal = heapq.heappop(self.due)[2]
                try:
                    renewal.start()
                except Exception:  # (no thread could be started) the lease is not renewed
                    log.warning("could not start the renewal of a token lease", exc_info=True)


_CLOCK = _RenewalClock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_CLOCK.reset)


def _answers(conn: "psycopg.Connection[Any]") -> bool:
    """Whether the connection answers an empty query (nothing of the ledger is sent)."""
    try:
        with conn.lock:
            res = conn.pgconn.exec_(b"")
    except Exception:
        return False
    return conn.pgconn.status == ConnStatus.OK and res.status == ExecStatus.EMPTY_QUERY


def _execute_on(conn: "psycopg.Connection[Any]", query: str, params: Tuple[Any, ...], *,
                shared: bool, what: str, about: p.About = p.NOWHERE) -> List[Dict[str, Any]]:
    """`_execute_raw`, its errors with a SQLSTATE of the ledger's as named exceptions, and
    the notices the server sent meanwhile logged (`p.log_notices`, with ``about``)."""
    notices: List[Any] = []
    rows: Optional[List[Dict[str, Any]]] = None
    try:
        with p.ledger_errors(), p.notices_of(conn, notices):
            rows = _execute_raw(conn, query, params, shared=shared, what=what)
    finally:
        p.log_notices(notices, about, rows)
    return rows


def _sent_once(conn: "psycopg.Connection[Any]", send: Callable[[], List[Dict[str, Any]]],
               on_uncertain: Optional[Callable[[BaseException], None]],
               broke: List[BaseException]) -> List[Dict[str, Any]]:
    """``send()``, a statement on a lent connection, its failure noted as `_pooled_once`
    notes it: one whose outcome is unknown in ``broke`` and given to ``on_uncertain``."""
    try:
        return send()
    except BaseException as exc:
        p.note_uncertain(exc, conn, broke, on_uncertain)
        raise


def _send_plain(conn: "psycopg.Connection[Any]", query: str, params: Tuple[Any, ...],
                what: str, about: p.About) -> List[Dict[str, Any]]:
    """`_execute_on` of an idle pooled connection whose lock the caller holds: the
    statement sent straight (`p.plain_send`)."""
    notices: List[Any] = []
    rows: Optional[List[Dict[str, Any]]] = None
    try:
        with p.ledger_errors(), p.notices_of(conn, notices):
            sent = p.plain_send(conn, query, params)
            rows = p.plain_rows(conn, sent, conn.wait(sent.gen), what)
    finally:
        p.log_notices(notices, about, rows)
    return rows


def _execute_raw(conn: "psycopg.Connection[Any]", query: str, params: Tuple[Any, ...], *,
                 shared: bool, what: str) -> List[Dict[str, Any]]:
    """Run one ledger statement on ``conn`` in a transaction of its own; its rows.

    ``shared``: the Ledger's single connection, which other code (a tool in another
    thread) may use too.  A statement queued behind someone else's BEGIN would run inside
    that transaction and commit or roll back with it: the connection's transaction status
    is read together with the statement's own reply (under psycopg's connection lock, so
    that no other thread's statement comes in between), and a statement that did not end
    idle raises `LedgerUsageError` (`_not_committed`).
    """
    if not shared:
        with conn.lock:
            if p.plain_ready(conn):  # idle: the statement alone, sent straight (p.plain_send)
                sent = p.plain_send(conn, query, params)
                return p.plain_rows(conn, sent, conn.wait(sent.gen), what)
    with conn.cursor(row_factory=dict_row) as cur:
        if shared:
            status = _execute_and_status(conn, cur, query, params, what)
            if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                raise p.in_foreign_transaction(what, status)
            return cur.fetchall()
        if conn.autocommit:
            cur.execute(query, params, prepare=False)
            return cur.fetchall()
        if conn.info.transaction_status == TransactionStatus.IDLE:
            return _alone(conn, cur, query, params)
        with conn.transaction():  # a savepoint in the caller's transaction (a local effect's)
            cur.execute(query, params, prepare=False)
            rows = cur.fetchall()
        return rows


def _alone(conn: "psycopg.Connection[Any]", cur: Any, query: str,
           params: Tuple[Any, ...]) -> List[Dict[str, Any]]:
    """One statement as a transaction of its own on an idle connection that is not in
    autocommit mode (a pool's): switched to autocommit for it, a flag of psycopg's (nothing
    is sent), so that the server commits the statement alone -- one round trip where BEGIN,
    the statement and COMMIT took three -- then switched back; a connection that cannot be
    switched back is closed, so that a pool never hands its next user a connection in a mode
    its owner did not choose (the pool discards a closed connection)."""
    conn.autocommit = True
    try:
        cur.execute(query, params, prepare=False)
        rows: List[Dict[str, Any]] = cur.fetchall()
        return rows
    finally:
        try:
            conn.autocommit = False
        except Exception:
            conn.close()


def _execute_and_status(conn: "psycopg.Connection[Any]", cur: Any, query: str,
                        params: Tuple[Any, ...], what: str) -> int:
    """``cur.execute(query, params)`` and the transaction status right after its reply.
    A connection already in a transaction (another thread's BEGIN) gets nothing: the
    statement would go with that transaction, so it is refused unsent (`_not_committed`
    still, for the callers' sake)."""
    execute_gen = getattr(cur, "_execute_gen", None)
    lock = getattr(conn, "lock", None)
    if execute_gen is None or lock is None:  # not psycopg 3.1/3.2: no atomic read
        _refuse_if_in_transaction(conn.info.transaction_status, what)
        cur.execute(query, params, prepare=False)
        return conn.info.transaction_status
    try:
        with lock:
            _refuse_if_in_transaction(conn.pgconn.transaction_status, what)
            conn.wait(execute_gen(query, params, prepare=False))
            return conn.pgconn.transaction_status
    except psycopg.Error as exc:
        raise exc.with_traceback(None)


def _refuse_if_in_transaction(status: int, what: str) -> None:
    """The statement is not sent on a connection inside someone else's transaction (a
    lost connection is left to the send, which reports it as such)."""
    if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        raise p.in_foreign_transaction(what, status, sent=False)


def side_effect(
    ledger: Ledger,
    name: str,
    *,
    business_key: Optional[Callable[[Any], Optional[str]]] = None,
) -> Callable[[Callable[[Any, str], R]], Tool[R]]:
    """``@side_effect(ledger, "bank.pay")``: the same as ``@ledger.tool("bank.pay")``."""
    return ledger.tool(name, business_key=business_key)
