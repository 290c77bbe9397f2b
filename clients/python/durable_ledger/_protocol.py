"""What the synchronous `Ledger` and the asynchronous `AsyncLedger` share: the reading of
the ledger's answers, the stops of an attempt, and the token attempt's own state.

Nothing here talks to the database: each client sends the statements its own way (a
blocking or an awaited connection, pool or factory) and hands the rows to these functions,
so that both decide alike what a decision, a report or a refusal means.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import logging
import re
import threading
from datetime import datetime, timedelta
from typing import (Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set,
                    Tuple, TypeVar, Union)

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from .outcomes import Finding, Happened, NotHappened
from .errors import (
    AttemptStopped,
    BusinessKeyConflict,
    ConcurrentChange,
    DivergencePaused,
    AwaitingApproval,
    BudgetExhausted,
    EffectDidNotHappen,
    EffectFailed,
    EffectPaused,
    EffectInProgress,
    InvalidArgument,
    LeaseLost,
    LedgerError,
    LedgerRefused,
    LedgerUsageError,
    NotFound,
    OutcomeNotRecorded,
    PermissionDenied,
    PoolerDetected,
    ReadOnlyLedger,
    RunAbandoned,
    RunBusy,
    RunExists,
    ToolRefused,
    TooManyLeases,
    WrongState,
)

log = logging.getLogger("durable_ledger")
log.addHandler(logging.NullHandler())  # a library logs only where the application says

R = TypeVar("R")

#: The SQLSTATE of a lost token lease (expired, released, superseded, unknown).
LEASE_LOST = "55L01"
#: The SQLSTATE of a call of a run that a person abandoned (begin_effect, acquire_run,
#: take_lease): `RunAbandoned`.
RUN_ABANDONED = "55L02"
#: The SQLSTATE of a call that would execute a retired tool, or one nobody registered
#: while `the ledger refuses tools nobody registered (`set_unregistered_tools('refuse', …)`)`: `ToolRefused`.
TOOL_REFUSED = "55L03"

#: The ledger's other SQLSTATEs (docs/reference.md, "Errors"), each a named exception.
REFUSALS: Dict[str, type] = {
    "22004": InvalidArgument, "22023": InvalidArgument, "23505": BusinessKeyConflict,
    "42704": NotFound, "42710": RunExists, "55000": WrongState, "40001": ConcurrentChange,
    "25006": ReadOnlyLedger, "53400": TooManyLeases, "42501": PermissionDenied,
}
LOCK_NOT_AVAILABLE = "55P03"
UNDEFINED_FUNCTION = "42883"


class ledger_errors:
    """``with ledger_errors():`` around a ledger statement: its errors with a SQLSTATE of
    the ledger's come out as the client's named exceptions (`named_error`), the psycopg
    error as ``__cause__``.  (A class, not a generator: it is around every statement.)"""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Optional[BaseException], tb: Any) -> None:
        if isinstance(exc, psycopg.Error):
            named = named_error(exc)
            if named is not None:
                raise named from exc


def named_error(exc: psycopg.Error) -> Optional[LedgerError]:
    """The named exception for an error of a ledger statement, or None: `RunBusy` for
    55P03 (the message carries the holder the server named), a `LedgerRefused` for the
    ledger's other SQLSTATEs.  55L01-55L03 are left to the callers, which know the run,
    tool and attempt they concern."""
    diag = exc.diag
    reason = diag.message_primary or str(exc)
    if exc.sqlstate == UNDEFINED_FUNCTION and "durable_ledger." in reason and any(
            name in reason for name in ("session_epoch", "release_attempt")):
        return LedgerUsageError(None, None, f"{reason}: a session attempt of this client needs "
                                            f"the extension at version 1.3 (ALTER EXTENSION "
                                            f"durable_ledger UPDATE); token attempts work from 1.1")
    if exc.sqlstate == LOCK_NOT_AVAILABLE:
        busy = RunBusy(None, None, " ".join(
            part for part in (reason + ".", diag.message_detail, diag.message_hint) if part))
        busy.sqlstate, busy.detail, busy.hint = exc.sqlstate, diag.message_detail, diag.message_hint
        return busy
    cls = REFUSALS.get(exc.sqlstate or "")
    if cls is None:
        return None
    hint = diag.message_hint
    if cls is PermissionDenied and not hint:  # the server's message names no role
        hint = GRANT_HINT
    refused: LedgerRefused = cls(exc.sqlstate, reason, detail=diag.message_detail, hint=hint)
    return refused


#: What a permission error of the ledger's functions needs (42501 names no role).
GRANT_HINT = ("The ledger's functions are granted to its roles: durable_ledger_worker "
              "(begin, complete, fail, effect_status, leases), durable_ledger_auditor "
              "(history, the tables and views), durable_ledger_admin (resolve, break_lease, "
              "the tools registry, purges); e.g. GRANT durable_ledger_worker TO "
              "your_login_role.")


#: Why a run is stopped in its current attempt: (key, reason, the exception to raise
#: instead of `EffectPaused` or None).  See `Ledger.guarded`.
_Halt = Tuple[Optional[str], str, Optional[Callable[[], LedgerError]]]

#: The token attempts the running code belongs to (innermost last).  `Ledger.token_attempt`
#: extends it for its body; a call finds its attempt here, never by looking its run up.
_ATTEMPTS: "contextvars.ContextVar[Tuple[TokenLease, ...]]" = contextvars.ContextVar(
    "durable_ledger_attempts", default=())


def _not_committed(exc: BaseException) -> bool:
    """Whether ``exc`` says that a ledger statement ran inside a transaction that something
    else opened on the Ledger's connection: it did not commit, it goes with that
    transaction (a `LedgerUsageError` raised by `_execute_on`)."""
    return isinstance(exc, LedgerUsageError) and getattr(exc, "_not_committed", False)


class _NotSent(psycopg.OperationalError):
    """The connection source handed out a connection already closed: nothing was sent."""


def borrow_tries(source: Any, fresh: bool) -> int:
    """How many connections a borrow takes from its source at the most: one; for a
    ``fresh`` one (checked by an empty query), one more than a pool holds, so that every
    connection that died while idle is given back (the pool discards it) before giving up."""
    if not fresh:
        return 1
    size = getattr(source, "max_size", None)
    return size + 1 if isinstance(size, int) and size > 0 else 5


def usable_lent(conn: Any, alive: bool, fresh: bool) -> bool:
    """Whether a connection a source handed out may take a ledger statement.  ``alive``: it
    is open, not broken, and (``fresh``) answered an empty query.  False: give it back and
    take the next (a fresh borrow's dead one); a dead one otherwise raises `_NotSent`, one
    inside a transaction `LedgerUsageError`."""
    if not alive:
        if fresh:
            return False
        raise _NotSent("the connection source handed out a closed connection")
    if conn.pgconn.transaction_status != TransactionStatus.IDLE:
        raise LedgerUsageError(None, None, "the connection source handed out a "
                                           "connection inside a transaction")
    return True


def _server_message(exc: "psycopg.Error") -> str:
    """The server's message and detail, as one sentence."""
    primary = exc.diag.message_primary or str(exc).strip()
    detail = exc.diag.message_detail
    return f"{primary}: {detail}" if detail else primary


def _abandoned(run: str, exc: "psycopg.Error") -> RunAbandoned:
    """`RunAbandoned` for a 55L02 refusal of a call of ``run``."""
    return RunAbandoned(run, f"{_server_message(exc)} (SQLSTATE 55L02).  This attempt stops "
                             f"here, and the run must not be retried: it is stopped for good")


def _json(value: Any) -> Optional[Jsonb]:
    """None becomes SQL NULL ("nothing"), anything else a jsonb parameter."""
    return None if value is None else Jsonb(value)


def _refused_cleanly(exc: BaseException, conn: Any) -> bool:
    """True when the server refused a statement with an ERROR and the session lives on.

    A statement run in its own transaction then wrote nothing.  Anything else (the
    connection broke, a FATAL, a client-side failure while the statement was out) leaves
    it unknown whether the statement committed; so does an ERROR of class 08 or 57, which
    a proxy of a sharded ledger raises when it lost the shard while the call ran or the
    call was canceled while the shard committed it (docs/scale-out.md).
    """
    if isinstance(exc, LedgerError) and getattr(exc, "sqlstate", None) is not None:
        exc = exc.__cause__ or exc  # a named refusal (named_error): the server's error
    return (isinstance(exc, psycopg.Error) and exc.sqlstate is not None
            and not exc.sqlstate.startswith(("08", "57"))
            and exc.diag.severity_nonlocalized == "ERROR"
            and not conn.closed and not conn.broken)



def note_uncertain(exc: BaseException, conn: Any, broke: List[BaseException],
                   on_uncertain: Optional[Callable[[BaseException], None]]) -> None:
    """A statement on ``conn`` failed with ``exc``: unless the server refused it cleanly
    or it was not committed, its outcome is unknown, noted in ``broke`` (what a retry on
    a fresh connection looks at) and given to ``on_uncertain``."""
    if not _refused_cleanly(exc, conn) and not _not_committed(exc):
        broke.append(exc)
        if on_uncertain is not None:
            on_uncertain(exc)


def warn_resend(what: str, exc: BaseException) -> None:
    """Logs that ``what`` is sent once more on a fresh connection after ``exc``."""
    text = str(exc).strip()
    log.warning("%s: the connection broke before the reply (%s: %s); sending it once more "
                "on a fresh connection", what, type(exc).__name__,
                text.splitlines()[0] if text else "")


class TokenLease:
    """One attempt at a run under a token lease: what `Ledger.token_attempt` yields.

    - ``run``, ``epoch`` (the attempt's lease epoch), ``holder``, ``ttl``;
    - ``expires_at``: the expiry as of the last renewal (the server's clock decides);
    - ``renewals``: how many renewals succeeded so far;
    - ``lost``: None while the lease is held, else the `LeaseLost` that says why not;
    - ``check()``: raises `LeaseLost` if the lease is known to be lost -- call it before
      a long step that does not go through the ledger (a model call);
    - ``bind(fn)``: ``fn`` wrapped so that it runs as part of this attempt in whatever
      thread calls it (``executor.submit(lease.bind(tool), run, args)``);
    - ``token``: the capability itself (whoever has it acts for the lease); it is never
      shown by ``repr`` nor written to the log.
    """

    def __init__(self, run: str, token: str, epoch: int, expires_at: datetime,
                 holder: Optional[str], ttl: timedelta, ledger: Any = None) -> None:
        self.run = run
        self.token = token
        self.epoch = epoch
        self.expires_at = expires_at
        self.holder = holder
        self.ttl = ttl
        self.renewals = 0
        self.lost: Optional[LeaseLost] = None
        self._mutex = threading.Lock()
        self._ledger = ledger
        # The attempt's own state: ended (its body is over: calls not yet begun are
        # refused), its calls in flight (the end waits for them), and its stop after an
        # unknown outcome, a pause, an abandoned run or a refused tool (key, reason, error).
        self._ended = False
        self._inflight = 0
        self._idle = threading.Condition(self._mutex)
        self._halted: Optional[_Halt] = None

    def check(self) -> None:
        """Raise `LeaseLost` when the lease is known to be lost; return otherwise."""
        lost = self.lost
        if lost is not None:
            raise LeaseLost(self.run, self.epoch, lost.reason) from lost

    def bind(self, fn: Callable[..., R]) -> Callable[..., R]:
        """``fn``, made a part of this attempt wherever it runs.

        A thread does not inherit the attempt of the code that started it (a
        ``ThreadPoolExecutor`` runs its tasks in contexts of its own), and a ledger call
        from such a thread is refused.  ``executor.submit(lease.bind(pay_invoice), run,
        args)`` runs ``pay_invoice`` in a copy of the context ``bind`` was called in, with
        this attempt in it.  Once the attempt has ended, its calls raise `LeaseLost` and
        perform nothing.  (``asyncio.to_thread`` and ``contextvars.copy_context().run``
        carry the attempt by themselves.)
        """
        context = contextvars.copy_context()

        def run_in_attempt(*args: Any, **kwargs: Any) -> R:
            def call() -> R:
                attempts = _ATTEMPTS.get()
                if not any(a is self for a in attempts):
                    _ATTEMPTS.set(attempts + (self,))
                return fn(*args, **kwargs)
            return context.copy().run(call)

        return functools.wraps(fn)(run_in_attempt)

    def _enter(self) -> None:
        """A call of the attempt starts (refused once the attempt has ended)."""
        with self._mutex:
            if self._ended:
                raise LeaseLost(
                    self.run, self.epoch,
                    f"run {self.run!r}: this call belongs to the token attempt of epoch "
                    f"{self.epoch}, which has ended (its block was left while this call's "
                    f"thread or task was still running); nothing was begun.  A call must not "
                    f"outlive its attempt: wait for every branch before leaving the block")
            self._inflight += 1

    def _leave(self) -> None:
        with self._mutex:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.notify_all()

    def _end(self) -> None:
        """The attempt's block is over: refuse new calls, wait for those in flight."""
        with self._mutex:
            self._ended = True
            if self._inflight:
                log.debug("token attempt at %s waits for %d call(s) in flight", self.run,
                          self._inflight)
            while self._inflight:
                self._idle.wait()

    def _lose(self, exc: BaseException) -> LeaseLost:
        with self._mutex:
            if self.lost is None:
                primary = detail = None
                if isinstance(exc, psycopg.Error):
                    primary, detail = exc.diag.message_primary, exc.diag.message_detail
                lost = LeaseLost(
                    self.run, self.epoch,
                    f"{primary or exc} (lease epoch {self.epoch})"
                    f"{': ' + detail.rstrip('.') if detail else ''}; this attempt stops here, "
                    f"and a new one (token_attempt) replays what it completed")
                lost.__cause__ = exc
                self.lost = lost
                log.warning("%s", lost.reason)
            return self.lost

    def __repr__(self) -> str:
        return (f"TokenLease(run={self.run!r}, epoch={self.epoch}, expires_at={self.expires_at!r}, "
                f"holder={self.holder!r}, renewals={self.renewals}, "
                f"lost={None if self.lost is None else self.lost.reason!r})")



# ---------------------------------------------------------------------------
# Reading the ledger's answers.  ``halt(key, reason, error)`` stops the call's run in its
# current attempt (see `Ledger._halt`); each function calls it where the attempt must stop.
# ---------------------------------------------------------------------------

#: ``halt(key, reason, error)``: stop the run in the current attempt.
HaltFn = Callable[[Optional[str], str, Optional[Callable[[], LedgerError]]], None]

TAKE_LEASE = "SELECT * FROM durable_ledger.take_lease(%s, %s, %s)"
RENEW_LEASE = "SELECT durable_ledger.renew_lease(%s) AS expires_at"
RELEASE_LEASE = "SELECT durable_ledger.release_lease(%s) AS released"
#: The start of a session attempt: the lease, and which epoch and server process hold it
#: (taken in the one statement, so on one server connection, whatever is in between).
ACQUIRE_RUN = ("SELECT a.acquired, durable_ledger.session_epoch(%s) AS epoch, "
               "pg_backend_pid() AS pid "
               "FROM (SELECT durable_ledger.acquire_run(%s, %s) AS acquired OFFSET 0) a")
#: release_run of a run whose attempt's epoch the client does not know.
RELEASE_RUN = "SELECT durable_ledger.release_run(%s) AS ok"
#: The end of a session attempt: release_run only where the statement reached the session
#: that holds the attempt's epoch (the epoch asked once; CASE calls release_run only then;
#: OFFSET 0: once).
RELEASE_GUARDED = ("SELECT s.pid, s.epoch, g.released "
                   "FROM (SELECT pg_backend_pid() AS pid, durable_ledger.session_epoch(%s) AS epoch "
                   "OFFSET 0) s, "
                   "LATERAL (SELECT CASE WHEN s.epoch = %s "
                   "THEN durable_ledger.release_run(%s) END AS released OFFSET 0) g")
#: The attempt's lease ended wherever it is held (the guarded release reached another
#: server connection): released here, or its holder terminated.
RELEASE_ATTEMPT = "SELECT durable_ledger.release_attempt(%s, %s)"
EFFECT_STATUS = "SELECT * FROM durable_ledger.effect_status(%s)"
HISTORY = "SELECT * FROM durable_ledger.history(%s)"


class Execute(NamedTuple):
    """begin_effect said ``execute``: perform the effect, giving the provider
    ``downstream_key`` (the key itself; a business key's names its attempt), then report
    on ``key`` and ``attempt``."""
    key: str
    attempt: int
    downstream_key: str


class Replayed(NamedTuple):
    """begin_effect replayed a completed effect: ``result`` is its recorded result."""
    result: Any


RECONCILE_EFFECT = "SELECT * FROM durable_ledger.reconcile_effect(%s, %s, %s, %s)"
# whether the grace has passed, by the server's clock: the lookup must come after it
RECONCILE_DUE = ("SELECT f AS reconcilable_from, f <= pg_catalog.clock_timestamp() AS due"
                 "  FROM durable_ledger.reconcilable_from(%s::text, %s::integer) f")


def routed(query: str, params: Tuple[Any, ...],
           run: Optional[str]) -> Tuple[str, Tuple[Any, ...]]:
    """A call about a key with ``run`` as its last argument, when given: through
    durable_ledger_proxy (``routed=True``) it then goes straight to the run's shard
    (docs/scale-out.md).  The call must be the query's last closing parenthesis."""
    if run is None:
        return query, params
    at = query.rindex(")")
    return query[:at] + ", run => %s" + query[at:], params + (run,)


def reconcile_due_statement(row: Any, run: Optional[str]) -> Tuple[str, Tuple[Any, ...]]:
    """reconcilable_from of the paused attempt (``run``: routed, see `routed`)."""
    query = RECONCILE_DUE.replace("%s::integer) f", "%s::integer, run => %s) f") if run else RECONCILE_DUE
    return query, (row["key"], row["attempt"]) + ((run,) if run else ())


def reconcile_due(row: Any, due: Any, run: str, tool: str) -> bool:
    """Whether reconcilable_from says the provider may be asked now; logged when not."""
    if due["reconcilable_from"] is None:
        log.warning("%s (run %s, key %s) is not reconciled by workers (its tool is not "
                    "reconcilable, or the effect changed): the pause is left for a person",
                    tool, run, row["key"])
        return False
    if not due["due"]:
        log.warning("%s (run %s, key %s) may be reconciled from %s (its tool's grace): the "
                    "pause stands until a later attempt", tool, run, row["key"],
                    due["reconcilable_from"])
        return False
    return True


def reconcilable(row: Any) -> bool:
    """A pause for an effect whose outcome is unknown: what a reconciler may settle."""
    return (row["decision"] == "pause" and row["status"] == "unknown"
            and row.get("downstream_key") is not None)


def checked_finding(found: Any, run: str, tool: str, key: str) -> Optional[Finding]:
    """What ``reconcile`` returned, if it is a finding; anything else (None: the provider
    cannot tell) leaves the pause for a person."""
    if found is None or isinstance(found, (Happened, NotHappened)):
        return found
    log.warning("reconcile of %s (run %s, key %s) returned %r, not Happened, NotHappened or "
                "None: the pause is left for a person", tool, run, key, found)
    return None


def reconcile_failed(run: str, tool: str, key: str, exc: BaseException) -> None:
    """``reconcile`` raised: the provider could not be asked; a person decides."""
    log.warning("reconcile of %s (run %s, key %s) raised %r: the pause is left for a person",
                tool, run, key, exc)


def reconcile_statement(row: Any, found: Finding,
                        run: Optional[str] = None) -> Tuple[str, Tuple[Any, ...]]:
    """reconcile_effect of the paused attempt, with what the provider said (``run``:
    routed, see `routed`)."""
    return routed(RECONCILE_EFFECT,
                  # evidence None is JSON null: the provider's answer, never "no answer"
                  (row["key"], row["attempt"], isinstance(found, Happened), Jsonb(found.evidence)),
                  run)


def reconcile_refused(run: str, tool: str, key: str, exc: WrongState) -> None:
    """reconcile_effect refused (55000: before the tool's grace, a tool not
    reconcilable, an effect that changed meanwhile): nothing was written; the pause
    stands, and the refusal is logged."""
    log.warning("reconcile of %s (run %s, key %s) not recorded: %s", tool, run, key,
                exc.reason)


class SessionHold(NamedTuple):
    """A session attempt's lease: its epoch, and the server process whose session holds it
    (what the attempt's every begin checks it reached)."""
    epoch: int
    pid: int


def acquire_params(run: str, wait: bool) -> Tuple[Any, ...]:
    return (run, run, wait)


def session_hold(row: Any, run: str) -> Optional[SessionHold]:
    """The hold that `ACQUIRE_RUN` took, or None when the run is held by another session."""
    if not row["acquired"]:
        return None
    if row["epoch"] is None:  # cannot be: the statement took the lease on that session
        raise LeaseLost(run, None, f"run {run!r}: acquire_run took the lease but the session "
                                   f"holds no epoch of it; nothing was begun")
    return SessionHold(int(row["epoch"]), int(row["pid"]))


def with_model(meta: Any, model: Optional[str]) -> Any:
    """meta with the attempt's model as ``meta.model`` (extension 1.3): a call's own
    ``model`` in meta is kept."""
    if model is None:
        return meta
    if meta is None:
        return {"model": model}
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a JSON object to carry the attempt's model, not "
                        f"{type(meta).__name__}")
    if "model" in meta:
        return meta
    return {**meta, "model": model}


def check_model(model: Optional[str]) -> None:
    """An attempt's model: a non-empty name (or None)."""
    if model is not None and (not isinstance(model, str) or not model):
        raise TypeError("model must be a non-empty str naming the model that answers the "
                        "attempt")


class CallKey(str):
    """A business key that is a framework's id of one tool call (`call_key`): begun with
    ``call_id => true`` (extension 1.3), so that a new id of a later attempt whose call
    equals an earlier attempt's effect pauses as a divergence."""

    __slots__ = ()


def call_key(run: str, tool: str, call_id: str) -> CallKey:
    """The business key of a tool call a framework names by its own id (``guarded``'s
    ``call_id``): the run, the tool and the id as a JSON array after ``call:``, or its
    SHA-256 past 200 characters (room for the provider's ``#attempt``) -- the JavaScript
    client's ``callKey``, character for character."""
    if not isinstance(call_id, str) or not call_id:
        raise TypeError("call_id must be a non-empty str")
    triple = json.dumps([run, tool, call_id], ensure_ascii=False, separators=(",", ":"))
    try:
        material = triple.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no text PostgreSQL could store
        raise TypeError("call_key(): run, tool and call_id must be valid Unicode text") from None
    key = f"call:{triple}"
    # counted as JavaScript counts a string's length (UTF-16 units), as callKey does
    if len(key.encode("utf-16-le")) // 2 <= 200:
        return CallKey(key)
    return CallKey("call:sha256:" + hashlib.sha256(material).hexdigest())


def key_of_call(run: str, tool: str, business_key: Optional[str],
                call_id: Optional[str]) -> Optional[str]:
    """``guarded``'s key: its business key, or the key of its call id (`call_key`)."""
    if call_id is None:
        return business_key
    if business_key is not None:
        raise TypeError("a call has a business_key or a call_id, not both")
    return call_key(run, tool, call_id)


def begin_statement(run: str, tool: str, args: Any, business_key: Optional[str], meta: Any,
                    token: Optional[str] = None, *, recorded: bool = False,
                    hold: Optional[SessionHold] = None,
                    local: bool = False, model: Optional[str] = None) -> Tuple[str, Tuple[Any, ...]]:
    """The statement that begins a call: ``begin_effect``, for a call recorded as safe
    to redo (`Ledger.record`, never with a business key) ``begin_recorded``, for a local
    effect (`Ledger.local`) ``begin_local``; with the
    token of a token lease, or, for a session attempt (``hold``), guarded: the call is
    made only where the statement reached the session that holds the attempt's epoch, and
    the row says which server process and epoch it reached (`check_guard`).  ``model``,
    the attempt's, goes into meta (`with_model`)."""
    meta = with_model(meta, model)
    if recorded:
        function = "begin_recorded"
        params: Tuple[Any, ...] = (run, tool, Jsonb(args), _json(meta))
    else:
        function = "begin_local" if local else "begin_effect"
        params = (run, tool, Jsonb(args), business_key, _json(meta))
    if token is not None:
        params += (token,)
    placeholders = ", ".join(["%s"] * len(params))
    if isinstance(business_key, CallKey) and function == "begin_effect":
        # named, and only for a call id: any other call is the statement it was before 1.3
        placeholders += ", call_id => true"
    call = f"durable_ledger.{function}({placeholders})"
    if hold is None:
        return f"SELECT * FROM {call}", params
    return ("SELECT s.pid AS guard_pid, s.epoch AS guard_epoch, (g.d).* "
            "FROM (SELECT pg_backend_pid() AS pid, durable_ledger.session_epoch(%s) AS epoch "
            "OFFSET 0) s, "
            f"LATERAL (SELECT CASE WHEN s.epoch = %s THEN {call} END AS d OFFSET 0) g",
            (run, hold.epoch) + params)


#: What a session attempt needs, and what to use behind a transaction pooler.
_USE_TOKEN_ATTEMPT = (
    "a transaction pooler (PgBouncer with pool_mode = transaction, or a pooled endpoint such "
    "as Supabase's or Neon's) is between this client and the database.  Nothing was called, "
    "recorded or performed, and this attempt stops here.  A session lease (attempt(), "
    "acquire_run()) belongs to one server connection for the whole attempt: behind a "
    "transaction pooler, run the attempt with token_attempt() (on this connection or on a "
    "pool), or connect directly (or through PgBouncer's pool_mode = session)")


def pooler_detected(run: str, hold: SessionHold, reached_pid: Optional[int],
                    reached_epoch: Optional[int], what: str = "this call") -> PoolerDetected:
    """`PoolerDetected` for a statement of the attempt ``hold`` that reached server process
    ``reached_pid``, whose session holds epoch ``reached_epoch`` of the run (or none)."""
    if reached_pid != hold.pid:
        other = ("" if reached_epoch is None else
                 f", whose session holds another attempt's lease of the run (epoch "
                 f"{reached_epoch}),")
        where = (f"{what} reached another server connection (backend {reached_pid}){other} "
                 f"than the one whose session holds the attempt's lease (backend {hold.pid}, "
                 f"lease epoch {hold.epoch})")
    else:
        where = (f"{what} reached the attempt's server connection (backend {hold.pid}), but "
                 f"another attempt took its session over (another client of the same server "
                 f"connection acquired the run: its session holds lease epoch {reached_epoch}, "
                 f"this attempt's is {hold.epoch})")
    return PoolerDetected(run, hold.epoch, f"run {run!r}: {where}: {_USE_TOKEN_ATTEMPT}",
                          pid=hold.pid, reached_pid=reached_pid, reached_epoch=reached_epoch)


def lost_on_its_connection(run: str, hold: SessionHold) -> LeaseLost:
    return LeaseLost(run, hold.epoch,
                     f"run {run!r}: the session lease of this attempt (epoch {hold.epoch}) is "
                     f"gone from its own connection (backend {hold.pid}): something dropped it "
                     f"behind the ledger's back (DISCARD ALL, pg_advisory_unlock_all(), a "
                     f"pooler's reset).  Nothing was called or performed, and this attempt "
                     f"stops here; a new attempt replays what this one completed")


def check_guard(row: Any, run: str, hold: SessionHold, halt: HaltFn) -> None:
    """The guarded begin of a session attempt (`begin_statement` with ``hold``): returns
    when the call was made; else nothing was called nor written, and the attempt stops with
    `PoolerDetected` (the statement reached another server connection than the attempt's,
    or one whose session another attempt took over) or `LeaseLost` (the attempt's own
    session lost the lease)."""
    if row["key"] is not None:
        return
    reached_pid, reached_epoch = row["guard_pid"], row["guard_epoch"]
    error: Callable[[], LedgerError]
    if reached_pid == hold.pid and reached_epoch is None:
        def error() -> LedgerError:
            return lost_on_its_connection(run, hold)
    elif reached_pid != hold.pid or reached_epoch != hold.epoch:
        def error() -> LedgerError:
            return pooler_detected(run, hold, reached_pid, reached_epoch)
    else:
        raise LedgerError(None, None, f"unexpected answer to the begin of a call of run {run!r}: "
                                      f"no decision, although its session holds the attempt's "
                                      f"lease")
    raised = error()
    log.warning("%s", raised.reason)
    halt(None, raised.reason, error)
    raise raised


def release_params(run: str, hold: SessionHold) -> Tuple[Any, ...]:
    return (run, hold.epoch, run)


def released_elsewhere(run: str, hold: SessionHold, row: Any, ended: bool) -> None:
    """What release_attempt's answer means after a guarded release that did not reach the
    attempt's session (``row``: the server process and epoch it reached)."""
    if not ended:
        log.debug("run %s: the lease of the attempt's epoch %s was over already (released, "
                  "lost, or a later attempt took the run)", run, hold.epoch)
        return
    if row["pid"] == hold.pid:
        return
    log.warning("run %s: the end of the attempt reached another server connection (backend "
                "%s) than the one whose session held its lease (backend %s, epoch %s): a "
                "transaction pooler is between this client and the database; release_attempt "
                "ended the lease by terminating that server connection, so no other client "
                "meets the lock.  Behind a transaction pooler use token_attempt()",
                run, row["pid"], hold.pid, hold.epoch)


def release_refused(run: str, hold: SessionHold, row: Any, exc: BaseException) -> None:
    """release_attempt was refused (42501: this role may not terminate the backend that
    holds the attempt's lease): say exactly what happens to the lease."""
    log.warning("run %s: the end of the attempt reached another server connection (backend "
                "%s) than the one whose session holds its lease (backend %s, epoch %s), and "
                "this role may not end that backend (release_attempt: %s).  The lease stays "
                "held by server connection %s until that connection closes (PgBouncer closes "
                "it after server_lifetime, or server_idle_timeout while it is idle), or an "
                "admin runs durable_ledger.break_lease(%r, ...); until then the run is busy "
                "for every other worker.  Behind a transaction pooler use token_attempt()",
                run, row["pid"], hold.pid, hold.epoch, getattr(exc, "reason", exc), hold.pid,
                run, extra={"durable_ledger": {"event": "lease_left_held", "run": run,
                                               "epoch": hold.epoch, "pid": hold.pid,
                                               "sqlstate": "42501"}})


# ---------------------------------------------------------------------------
# The server's notices: every WARNING and NOTICE a ledger statement gets is logged
# (logger ``durable_ledger``), the ledger's own warnings (01L01-01L04) as structured
# records.
# ---------------------------------------------------------------------------

#: The ledger's warnings, by SQLSTATE: the ``event`` of their log records.
NOTICE_EVENTS = {"01L01": "divergence", "01L02": "unregistered_tool", "01L03": "conflict",
                 "01L04": "superseded_report"}
_MAY_DUPLICATE = re.compile(r'may duplicate effect "([0-9a-f]{64})"')
_LEVELS = {"WARNING": logging.WARNING, "NOTICE": logging.INFO, "INFO": logging.INFO,
           "LOG": logging.DEBUG, "DEBUG": logging.DEBUG}


class Notice(NamedTuple):
    """A notice of the server, as its handler saw it."""
    severity: Optional[str]
    sqlstate: Optional[str]
    message_primary: Optional[str]
    message_detail: Optional[str]
    message_hint: Optional[str]


class About(NamedTuple):
    """What a statement concerns, for the log records of its notices: the run, the tool
    and the key where the caller knows them; ``from_row``: the statement's row names the
    effect (a begin's decision, a report's effect row) and fills in what is missing."""
    run: Optional[str] = None
    tool: Optional[str] = None
    key: Optional[str] = None
    from_row: bool = False


NOWHERE = About()


class notices_of:
    """``with notices_of(conn, got):`` appends to ``got`` the notices (`Notice`) ``conn``
    gets while the block runs: a handler of this block alone, removed at its end (a pooled
    connection keeps none).  (A class, not a generator: it is around every statement.)"""

    __slots__ = ("conn", "handler")

    def __init__(self, conn: Any, got: List[Any]) -> None:
        def handler(diag: Any) -> None:
            # a Diagnostic reads the server's result, which lives only during this callback
            got.append(Notice(diag.severity_nonlocalized or diag.severity, diag.sqlstate,
                              diag.message_primary, diag.message_detail, diag.message_hint))

        self.conn = conn
        self.handler = handler

    def __enter__(self) -> None:
        self.conn.add_notice_handler(self.handler)

    def __exit__(self, kind: Any, exc: Optional[BaseException], tb: Any) -> None:
        try:
            self.conn.remove_notice_handler(self.handler)
        except ValueError:
            pass


def log_notices(notices: Sequence[Any], about: About, rows: Optional[Sequence[Any]]) -> None:
    """Logs the notices of one ledger statement: a WARNING at logging.WARNING, a NOTICE at
    logging.INFO, each record with ``extra={"durable_ledger": {...}}``: ``event``
    (``divergence`` 01L01, ``unregistered_tool`` 01L02, ``conflict`` 01L03,
    ``superseded_report`` 01L04, else ``notice``), ``sqlstate``, ``severity``, ``run``,
    ``tool``, ``key``, ``message``, ``detail``, ``hint``; for a divergence also
    ``may_duplicate``, the key of the earlier effect the call may duplicate."""
    first: Dict[str, Any] = {}
    if about.from_row and rows and isinstance(rows[0], dict):
        first = rows[0]
    for diag in notices:
        severity = diag.severity or "NOTICE"
        sqlstate = diag.sqlstate
        record: Dict[str, Any] = {
            "event": NOTICE_EVENTS.get(sqlstate or "", "notice"),
            "sqlstate": sqlstate,
            "severity": severity,
            "run": about.run or first.get("run"),
            "tool": about.tool or first.get("tool"),
            "key": about.key or first.get("key"),
            "message": diag.message_primary,
            "detail": diag.message_detail,
            "hint": diag.message_hint,
        }
        if sqlstate == "01L01":
            found = _MAY_DUPLICATE.search(diag.message_detail or "")
            record["may_duplicate"] = found.group(1) if found else None
        where = ", ".join(f"{name} {record[name]}" for name in ("run", "tool", "key")
                          if record[name] is not None)
        text = " ".join(part for part in (
            f"{diag.message_primary} (SQLSTATE {sqlstate}{'; ' + where if where else ''}).",
            diag.message_detail, diag.message_hint) if part)
        log.log(_LEVELS.get(severity, logging.INFO), "%s", text,
                extra={"durable_ledger": record})


# A budget's pause says so first (docs/reference.md, "Budgets").
BUDGET_REASON = "budget:"


def decision_of(row: Any, run: str, tool: str, halt: HaltFn) -> Union[Execute, Replayed]:
    """What begin_effect's row tells the caller: `Execute`, `Replayed`, or an exception
    (a replayed failure, a pause -- which stops the attempt --, work in progress)."""
    key: str = row["key"]
    decision: str = row["decision"]
    reason: str = row["reason"] or ""
    log.debug("%s %s run=%s key=%s", decision, tool, run, key)
    if decision == "execute":
        return Execute(key, row["attempt"], row.get("downstream_key") or key)
    if decision == "replay":
        if row["status"] == "completed":
            return Replayed(row["result"])
        if row["status"] == "failed":
            raise EffectFailed(key, decision, reason, row["error"], replayed=True)
    elif decision == "pause":
        log.warning("run %s paused at %s %s: %s", run, tool, key, reason)
        if reason.startswith(BUDGET_REASON):
            # a budget stops the call (extension 1.3): nothing was performed
            halt(key, f"run {run!r} is stopped in this attempt: the call of {tool} (key "
                      f"{key}) was paused by a budget: {reason}", None)
            raise BudgetExhausted(key, reason, run=run, tool=tool)
        if row["status"] is None:
            # Nothing was recorded for the call: it diverges from the run's earlier
            # attempts, and waits for resolve_divergence.  It stops the attempt like any
            # pause.
            halt(key, f"run {run!r} is stopped in this attempt: the call of {tool} (key "
                      f"{key}) diverges from the run's earlier attempts and was paused: "
                      f"{reason}", None)
            raise DivergencePaused(key, reason, run=run, tool=tool)
        halt_at_pause(row, run, tool, halt)
        if row["status"] == "awaiting_approval":
            raise AwaitingApproval(key, decision, reason)
        paused = EffectPaused(key, decision, reason)
        paused.downstream_key = row.get("downstream_key")  # what to ask the provider about
        raise paused
    elif decision == "in_progress":
        raise EffectInProgress(key, decision, reason)
    raise LedgerError(key, decision, f"unexpected answer from begin_effect: decision "
                                     f"{decision!r}, status {row['status']!r}")


def halt_at_pause(row: Any, run: str, tool: str, halt: HaltFn) -> None:
    """Stops the attempt at a pause of an effect (``row``, begin_effect's): also when the
    pause is not raised as `EffectPaused` because asking a reconciler about it failed
    (a lost connection, an error of ``reconcile_effect``), so that the attempt's next
    call does not go on past it."""
    key = row["key"]
    halt(key, f"run {run!r} is stopped in this attempt: effect {key} ({tool}) was "
              f"paused: {row['reason'] or ''}", None)


def stop(halt: HaltFn, key: Optional[str], reason: str, recorded: bool) -> None:
    """Stops the attempt (``halt``).  For a recorded call (`Ledger.record`) no person is
    needed -- the next attempt makes the call again --, so its further calls raise
    `AttemptStopped`, which says so; for a side effect, `EffectPaused`."""
    if recorded:
        reason += ("; no person is needed: the next attempt replays the recorded call, or "
                   "makes it again")
        halt(key, reason, lambda: AttemptStopped(key, None, reason))
    else:
        halt(key, reason, None)


def begin_not_committed(run: str, tool: str, halt: HaltFn, recorded: bool = False) -> None:
    """begin_effect ran inside a transaction something else opened on the connection:
    whether its intent is recorded is up to that transaction; the attempt stops."""
    stop(halt, None, f"run {run!r} is stopped in this attempt: begin_effect of {tool} ran "
                     f"inside another transaction on the Ledger's connection", recorded)


def begin_uncertain(run: str, tool: str, exc: BaseException, halt: HaltFn,
                    recorded: bool = False) -> None:
    """A token begin_effect went out and nobody knows whether it committed: its intent may
    be recorded under this still-live lease, and the same call again would be the next
    occurrence.  The attempt stops; the next one finds out.  (Never sent again: a
    begin_effect is not idempotent.)"""
    stop(halt, None, f"run {run!r} is stopped in this attempt: begin_effect of {tool} failed "
                     f"with the outcome of the statement unknown ({type(exc).__name__}: {exc}); "
                     f"a new attempt finds out whether its intent was recorded", recorded)


def refusal(exc: BaseException, run: str, tool: str, halt: HaltFn) -> Optional[LedgerError]:
    """The exception for a begin_effect that the ledger refused because the run is
    abandoned (55L02) or the tool may not execute (55L03), with the run stopped in this
    attempt; None for any other error.  Either refusal wrote nothing."""
    if not isinstance(exc, psycopg.Error) or exc.sqlstate not in (RUN_ABANDONED, TOOL_REFUSED):
        return None
    if exc.sqlstate == RUN_ABANDONED:
        abandoned = _abandoned(run, exc)
        log.warning("run %s was abandoned: %s", run, abandoned.reason)
        halt(None, abandoned.reason, lambda: RunAbandoned(run, abandoned.reason))
        return abandoned
    message = _server_message(exc)
    log.warning("run %s: the ledger refused tool %s: %s", run, tool, message)
    halt(None, f"run {run!r} is stopped in this attempt: the ledger refused tool {tool!r} "
               f"({message}); nothing was performed", None)
    return ToolRefused(run, tool, f"{message} (SQLSTATE 55L03).  Nothing was recorded or "
                                  f"performed; this attempt stops here (the run cannot make "
                                  f"this call): an admin registers the tool, then a new "
                                  f"attempt may go on")


def begin_refused(exc: BaseException, lease: Optional[TokenLease], run: str, tool: str,
                  halt: HaltFn) -> Optional[BaseException]:
    """What to raise for a begin the ledger refused: `LeaseLost` for a token lease's lost
    lease (55L01: it is lost from now on), else `refusal`'s; None for any other error."""
    if lease is not None and isinstance(exc, psycopg.Error) and exc.sqlstate == LEASE_LOST:
        return lease._lose(exc)
    return refusal(exc, run, tool, halt)


def outcome_unknown(run: str, tool: str, key: str, exc: BaseException, halt: HaltFn) -> None:
    """``perform`` raised something that does not say the effect did not happen: nothing is
    recorded, the attempt stops, a person resolves the effect."""
    log.warning("outcome of %s %s unknown: perform raised %s", tool, key, type(exc).__name__)
    halt(key, f"run {run!r} is stopped in this attempt: the outcome of effect {key} ({tool}) "
              f"is unknown (perform raised {type(exc).__name__}); a person must resolve it, "
              f"then start a new attempt", None)


def recorded_call_raised(run: str, tool: str, key: str, exc: BaseException,
                         halt: HaltFn) -> None:
    """``call`` of `record` raised something other than `EffectDidNotHappen`: nothing is
    recorded, and the attempt stops.  Not for a person: the next attempt makes the call
    again.  But this one must not go on -- what it did next (with a retried call's other
    answer) would not be what a replay sees, which makes the lost call again first."""
    log.info("recorded call %s %s raised %s", tool, key, type(exc).__name__)
    stop(halt, key, f"run {run!r} is stopped in this attempt: the recorded call {key} ({tool}) "
                    f"raised {type(exc).__name__} and nothing was recorded", True)


def local_commit_unknown(run: str, tool: str, key: str, exc: BaseException,
                         halt: HaltFn) -> None:
    """The COMMIT of a local effect's transaction went out and its answer was lost: the
    effect, its writes and its outcome committed together or not at all, and which one only
    the ledger knows.  Not for a person: the next attempt replays it or executes it.  This
    attempt stops (the same call again in it would be the next occurrence)."""
    log.warning("local effect %s %s: the commit's answer was lost (%s)", tool, key,
                type(exc).__name__)
    stop(halt, key, f"run {run!r} is stopped in this attempt: the commit of local effect "
                    f"{key} ({tool}) was sent and its answer lost ({type(exc).__name__}); it "
                    f"committed whole or not at all, and the next attempt replays or "
                    f"executes it", True)


def refusal_recorded(key: str, refusal: EffectDidNotHappen) -> EffectFailed:
    return EffectFailed(key, "execute", "the downstream refused the effect; its failure is "
                        "recorded", refusal.error, replayed=False)


def report_statement(function: str, key: str, payload: Any, attempt: int,
                     run: Optional[str] = None) -> Tuple[str, Tuple[Any, ...]]:
    """complete_effect / fail_effect on ``attempt``, the attempt begin_effect executed.

    The report always names its attempt: a business key is executed again after a failure
    (attempt 2, 3, ...), and a report that named none could land on another attempt than
    the one it is about -- or, when the connection no longer holds the lease that started
    the attempt, be kept as a conflict instead of applied.  ``run``: routed (see
    `routed`).  Only the columns `judge_report`, the caller and the notices' log records
    read: each column of a row costs the client its conversion."""
    return routed(f"SELECT key, run, tool, status, attempt, result, conflict "
                  f"FROM durable_ledger.{function}(%s, %s, %s)",
                  (key, _json(payload), attempt), run)


def report_failed(run: str, key: str, function: str, expected: str, payload: Any,
                  exc: BaseException, halt: HaltFn, recorded: bool = False) -> OutcomeNotRecorded:
    """The report could not be sent or its reply was lost: `OutcomeNotRecorded`."""
    stop(halt, key, f"run {run!r} is stopped in this attempt: the outcome of effect {key} "
                    f"could not be recorded", recorded)
    what = {"result": payload} if function == "complete_effect" else {"error": payload}
    after = ("the next attempt makes the recorded call again" if recorded else
             "the next attempt will pause until a person resolves the effect")
    return OutcomeNotRecorded(
        key, f"the outcome ({expected}) could not be recorded ({type(exc).__name__}: {exc}); "
             f"{after}", **what)


def judge_report(row: Any, run: str, key: str, attempt: int, function: str, expected: str,
                 payload: Any, halt: HaltFn, recorded: bool = False) -> Any:
    """The report's row if the ledger recorded the report; else `OutcomeNotRecorded`."""
    if row["attempt"] == attempt:
        accepted = row["status"] == expected and not row["conflict"]
    elif recorded:
        # a recorded call made again by a later attempt: the ledger kept ours as
        # superseded, whatever it said (its failures are never replaced by a retry)
        accepted = False
    else:
        # A later attempt replaced ours (someone else recorded our attempt as failed
        # meanwhile, and the key was executed again): the row is that later attempt's,
        # which the report never changes.  A failure the ledger already had for our
        # attempt is on record; anything else was kept as a conflict.
        accepted = function == "fail_effect" and not row["conflict"]
    if accepted:
        return row
    if recorded and row["attempt"] != attempt and not row["conflict"]:
        stop(halt, key, f"run {run!r} is stopped in this attempt: a later attempt made the "
                        f"recorded call {key} again", True)
    else:
        halt(key, f"run {run!r} is stopped in this attempt: the report on effect {key} "
                  f"contradicted the ledger", None)
    now = (f"{row['status']}" if row["attempt"] == attempt else
           f"at attempt {row['attempt']} (this report was on attempt {attempt}), "
           f"{row['status']}")
    what = {"result": payload} if function == "complete_effect" else {"error": payload}
    if recorded and row["attempt"] != attempt and not row["conflict"]:
        # a recorded call made again by a later attempt (ours lost its lease): the ledger
        # kept our report as superseded; nothing for a person
        raise OutcomeNotRecorded(
            key, f"a later attempt made the recorded call again (this attempt's lease "
                 f"ended): the effect is {now}; this report was kept in the audit log as "
                 f"superseded, and this attempt stops", **what)
    raise OutcomeNotRecorded(
        key, f"the ledger did not accept the report ({expected}): the effect is {now}"
             f"{' and flagged as a conflict' if row['conflict'] else ''}; a person must "
             f"resolve it", **what)


# ---------------------------------------------------------------------------
# Which attempt a call belongs to, and what a connection may be used for.
# ---------------------------------------------------------------------------

def bound_lease(ledger: Any, run: str) -> Optional[TokenLease]:
    """The token attempt of ``ledger`` at ``run`` that the running code belongs to."""
    for lease in reversed(_ATTEMPTS.get()):
        if lease._ledger is ledger and lease.run == run:
            return lease
    return None


A = TypeVar("A")


def bound_session(sessions: "contextvars.ContextVar[Tuple[A, ...]]", ledger: Any,
                  run: str) -> Optional[A]:
    """The session attempt (``attempt()``) of ``ledger`` at ``run`` among those the
    running code carries in ``sessions`` (the sync and the async client keep their own)."""
    for session in reversed(sessions.get()):
        if getattr(session, "ledger") is ledger and getattr(session, "run") == run:
            return session
    return None


def enter_attempt(lease: TokenLease) -> None:
    """A call of ``lease``'s attempt starts: refused once the attempt has ended, the lease
    is lost or the attempt is stopped.  The caller calls ``lease._leave()`` after it."""
    lease._enter()  # LeaseLost once the attempt has ended
    try:
        lease.check()
        if lease._halted is not None:
            raise _stopped(lease._halted)
    except BaseException:
        lease._leave()
        raise


def not_carried(run: str) -> LedgerUsageError:
    return LedgerUsageError(
        None, None, f"guarded() on run {run!r} was called from a thread or task that does "
        f"not carry the attempt this Ledger holds on it, so it is not performed: a thread "
        f"started inside the attempt does not inherit it.  Submit ledger.bind(fn) (or a "
        f"token lease's lease.bind(fn)) to the executor (or contextvars.copy_context().run, "
        f"fn; asyncio.to_thread and asyncio tasks carry it)")


def release_inside_attempt(run: str, *, awaited: bool = False) -> LedgerUsageError:
    """release_run of a run whose attempt() block is open: its calls would go on under
    an implicit lease, in a new epoch (``awaited``: of an AsyncLedger)."""
    block = "async with" if awaited else "with"
    return LedgerUsageError(None, None, f"release_run({run!r}) inside its `{block} "
                                        f"ledger.attempt(run):` block: the block releases "
                                        f"the run at its end")


def no_implicit_session(run: str, *, awaited: bool = False) -> LedgerUsageError:
    """A call outside any attempt (``awaited``: of an AsyncLedger)."""
    block = "async with" if awaited else "with"
    return LedgerUsageError(
        None, None, f"guarded() on run {run!r} outside an attempt: nothing was recorded or "
        f"performed.  Start each attempt at a run (the first, a retry, a redelivery) with "
        f"`{block} ledger.attempt(run):` (or `{block} ledger.token_attempt(run):` on a "
        f"pool, or acquire_run()): a new attempt replays what an earlier one did, where "
        f"continuing an attempt it did not start would count the retried calls as new ones "
        f"and perform them again")


def session_only(what: str) -> LedgerUsageError:
    return LedgerUsageError(
        None, None, f"{what} needs a session lease, which belongs to one connection for the "
        "whole attempt; this Ledger was given a pool (or a connection factory): run the "
        "attempt in `with ledger.token_attempt(run):`")


def attempt_already_open(run: str) -> LedgerUsageError:
    return LedgerUsageError(None, None, f"an attempt at run {run!r} is already open in this "
                                        f"Ledger")


def unwritable(conn: Any) -> Optional[LedgerUsageError]:
    """Why ``conn`` (sync or async) cannot carry a ledger write, or None.

    A statement in flight on it (another thread's or task's ledger call) is no reason:
    only an open transaction is, since an intent written inside it would commit with it,
    after the effect."""
    if conn.closed:
        return LedgerUsageError(None, None, "the connection is closed")
    if not conn.autocommit:
        return LedgerUsageError(
            None, None, "the connection must be in autocommit mode (psycopg.connect(..., "
            "autocommit=True)): begin_effect's intent has to be committed before the effect "
            "is performed")
    if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        return LedgerUsageError(
            None, None, "the connection is inside a transaction: begin_effect's intent would "
            "only be committed at COMMIT, after the effect; call the ledger outside "
            "transactions")
    return None


def in_foreign_transaction(what: str, status: int, *, sent: bool = True) -> LedgerUsageError:
    """A statement on the Ledger's single connection found (``sent=False``: it was not
    sent) or ended inside someone else's transaction: it is not committed
    (`_not_committed`)."""
    if sent:
        happened = "ran inside a transaction that something else opened"
        fate = "it is not committed, it goes with that transaction"
    else:
        happened = "was not sent: it would have run inside a transaction that something else opened"
        fate = "nothing of it reached the ledger"
    refused = LedgerUsageError(
        None, None,
        f"{what} {happened} on the Ledger's "
        f"connection (transaction status {TransactionStatus(status).name}): {fate}.  The connection given to a Ledger must "
        f"be dedicated to it: tools must not run their own transactions on it (give the "
        f"Ledger a pool, or the tools a connection of their own)")
    refused._not_committed = True  # type: ignore[attr-defined]
    return refused


def new_lease(row: Any, run: str, ttl: timedelta, ledger: Any,
              cls: "type[TokenLease]") -> TokenLease:
    """The lease take_lease handed out, or `RunBusy` when a live lease holds the run."""
    if row["token"] is None:
        raise RunBusy(None, None, f"run {run!r} is held by a live lease (another worker's "
                                  f"attempt)")
    return cls(run, row["token"], row["epoch"], row["expires_at"], row["holder"], ttl, ledger)


def released(lease: TokenLease, was_live: bool, resent: bool) -> None:
    """What release_lease's answer means at the end of a token attempt."""
    if not was_live and resent:
        # The first release may have committed before its connection broke: the second one
        # then finds the lease released already.
        log.warning("the release of the token lease on run %s was sent twice (the first "
                    "connection broke) and the second found it no longer live: released by "
                    "the first, or expired", lease.run)
    elif not was_live:
        # It was no longer live: it expired (or was broken) after the last call.
        with lease._mutex:
            if lease.lost is None:
                lease.lost = LeaseLost(
                    lease.run, lease.epoch,
                    f"the token lease on run {lease.run!r} (epoch {lease.epoch}) was no "
                    f"longer live at the end of the attempt (it expired or was broken); a new "
                    f"attempt (token_attempt) replays what this one completed")
                log.warning("%s", lease.lost.reason)


def _stopped(halted: _Halt) -> LedgerError:
    """The exception a call of a stopped attempt raises (without asking the database)."""
    key, reason, error = halted
    return error() if error is not None else EffectPaused(key, "pause", reason)


def unbind(bound: "contextvars.Token[Tuple[TokenLease, ...]]", lease: TokenLease) -> None:
    """The block's context leaves the attempt (its copies taken meanwhile keep it)."""
    try:
        _ATTEMPTS.reset(bound)
    except ValueError:  # left in another context than it was entered in
        _ATTEMPTS.set(tuple(a for a in _ATTEMPTS.get() if a is not lease))


def as_ttl(ttl: Union[float, timedelta]) -> timedelta:
    return ttl if isinstance(ttl, timedelta) else timedelta(seconds=ttl)


class LedgerCore:
    """What `Ledger` and `AsyncLedger` keep alike, apart from talking to the database: the
    stops of their attempts and the checks of their connection (``conn`` is the single
    connection, or None for a pool or a factory)."""

    conn: Any
    _halted: Dict[str, _Halt]
    _holds: Dict[str, SessionHold]  # run -> its session attempt's epoch and server process
    _leases: Dict[str, Any]  # run -> its open token attempt's lease
    _sessions: Dict[str, Any]  # run -> its open attempt() block
    _session_held: Set[str]  # runs held by attempt() or acquire_run()
    _routed: bool  # through durable_ledger_proxy: calls about a key name their run

    def _route(self, run: Optional[str]) -> Optional[str]:
        """The run to name in a call about a key: through a proxy only (`routed`)."""
        return run if self._routed else None

    def _bound_session(self, run: str) -> Any:
        """The session attempt at ``run`` of this ledger that the caller's context carries."""
        raise NotImplementedError

    def _enter_session_call(self, run: str, *, awaited: bool = False) -> Any:
        """The checks of a call (`guarded`, `record`) outside a token attempt: refused when
        the run is held by an attempt the caller's context does not carry, by no attempt
        at all, or stopped in its attempt.  Returns the session attempt it belongs to,
        entered (``leave()`` it after the call), or None for a run held by
        ``acquire_run``."""
        if run in self._leases:
            raise not_carried(run)
        self._session_only("guarded() outside token_attempt()")
        session = self._bound_session(run)
        if session is None and run in self._sessions:
            raise not_carried(run)
        if session is None and run not in self._session_held:
            raise no_implicit_session(run, awaited=awaited)
        if session is not None:
            session.enter()  # LeaseLost once the attempt has ended
        try:
            self._check_writable()
            halted = self._halted.get(run)
            if halted is not None:
                raise _stopped(halted)
        except BaseException:
            if session is not None:
                session.leave()
            raise
        return session

    def _halter(self, run: str, lease: Optional[TokenLease]) -> HaltFn:
        """``halt(key, reason, error)`` for calls of ``run`` in its current attempt."""
        return lambda key, reason, error: self._halt(run, key, reason, lease, error=error)

    def _halt(self, run: str, key: Optional[str], reason: str,
              lease: Optional[TokenLease] = None, *,
              error: Optional[Callable[[], LedgerError]] = None) -> None:
        """Stop ``run`` in its current attempt: the token attempt ``lease``, or the session's.

        Its further calls raise `EffectPaused` (``key``, ``reason``), or ``error()``.
        """
        if lease is not None:
            with lease._mutex:
                if lease._halted is None:
                    lease._halted = (key, reason, error)
        else:
            self._halted.setdefault(run, (key, reason, error))

    def _session_only(self, what: str) -> None:
        if self.conn is None:
            raise session_only(what)

    def _check_writable(self) -> None:
        assert self.conn is not None
        problem = unwritable(self.conn)
        if problem is not None:
            raise problem


# ---------------------------------------------------------------------------
# One statement as a transaction of its own, sent straight on the connection's libpq
# handle (issue 34: the clients' CPU per call).  A pooled connection is idle and, as a
# pool hands it out, not in autocommit mode; a cursor's ``execute`` would send BEGIN first
# (psycopg's autocommit flag decides that, nothing else).  Sent with PQsendQueryParams and
# no BEGIN, the statement is a transaction of its own on the server, the connection's
# autocommit flag is never touched (the connection goes back exactly as it was lent), and
# the cursor's machinery (a cursor and its transformer, the prepared-statement manager, a
# row factory, two switches of the autocommit flag under the connection's lock) is not
# paid for.  The parameters and the rows go through the same adapters (a `Transformer` of
# the connection) as a cursor's: the same types both ways.  Never a prepared statement
# (an unnamed one, as ``prepare=False``): through PgBouncer in transaction mode the next
# call may land on a backend that never saw it.
# ---------------------------------------------------------------------------

try:
    from psycopg import errors as _pg_errors
    from psycopg import pq as _pq
    from psycopg._encodings import pgconn_encoding as _pgconn_encoding
    from psycopg._queries import PostgresQuery as _PostgresQuery
    from psycopg.adapt import Transformer as _Transformer
    from psycopg.generators import execute as _execute_gen
    _error_from_result = getattr(_pg_errors, "error_from_result")
    PLAIN_SEND = True
except (ImportError, AttributeError):  # pragma: no cover -- another psycopg: the cursor
    PLAIN_SEND = False


def plain_ready(conn: Any) -> bool:
    """Whether ``conn`` (its lock held) may take a statement sent straight: idle, open, in
    no pipeline, and of a class whose ``wait`` is psycopg's own (the straight way waits
    for the reply itself: a class's own ``wait``, a deadline in it, is honoured by the
    cursor's way only).  Anything else goes the cursor's way."""
    pgconn = conn.pgconn
    own: Any = (psycopg.AsyncConnection if isinstance(conn, psycopg.AsyncConnection)
                else psycopg.Connection)
    return (PLAIN_SEND and pgconn.transaction_status == TransactionStatus.IDLE
            and pgconn.status == _pq.ConnStatus.OK
            and getattr(conn, "_pipeline", None) is None
            and getattr(type(conn), "wait", None) is own.wait)


class Sent(NamedTuple):
    """A statement `plain_send` sent: its transformer, the connection's encoding it was
    converted with (its rows and errors are read with the same: issue 34, the encoding
    is read from libpq once a statement), and the generator to wait for."""
    tx: Any
    encoding: str
    gen: Any


def plain_send(conn: Any, query: str, params: Tuple[Any, ...]) -> Sent:
    """Converts and sends the statement (the caller holds the connection's lock and waits
    for ``sent.gen``, ``_execute_gen(pgconn)``): what `plain_rows` reads the reply with."""
    tx = _Transformer(conn)
    pgq = _PostgresQuery(tx)
    pgq.convert(query, params)
    pgconn = conn.pgconn
    pgconn.send_query_params(pgq.query, pgq.params, param_formats=pgq.formats,
                             param_types=pgq.types, result_format=_pq.Format.TEXT)
    encoding = getattr(pgq, "_encoding", None) or _pgconn_encoding(pgconn)
    return Sent(tx, encoding, _execute_gen(pgconn))


def plain_rows(conn: Any, sent: Sent, results: Sequence[Any], what: str) -> List[Dict[str, Any]]:
    """The rows of a statement sent by `plain_send` as dicts (a cursor's ``dict_row``), or
    its error (psycopg's, as a cursor raises it).  A statement that did not end idle (it
    cannot: a ledger statement opens no transaction) is refused as not committed."""
    pgconn = conn.pgconn
    tx, encoding = sent.tx, sent.encoding
    if len(results) != 1:
        for res in results:
            if res.status == _pq.ExecStatus.FATAL_ERROR:
                raise _error_from_result(res, encoding=encoding)
        raise psycopg.InternalError(f"{len(results)} results for one ledger statement")
    res = results[0]
    if res.status != _pq.ExecStatus.TUPLES_OK:
        if res.status == _pq.ExecStatus.FATAL_ERROR:
            raise _error_from_result(res, encoding=encoding)
        raise psycopg.InternalError(f"unexpected result status of a ledger statement: "
                                    f"{_pq.ExecStatus(res.status).name}")
    status = pgconn.transaction_status
    if status != TransactionStatus.IDLE:
        raise in_foreign_transaction(what, status)
    tx.set_pgresult(res)
    names = [(res.fname(i) or b"").decode(encoding) for i in range(res.nfields)]

    def make_row(values: Sequence[Any]) -> Dict[str, Any]:
        return dict(zip(names, values))

    rows: List[Dict[str, Any]] = tx.load_rows(0, res.ntuples, make_row)
    return rows


def pool_methods(source: Any, asynchronous: bool) -> Tuple[Any, Any]:
    """``(getconn, putconn)`` of a psycopg_pool pool whose ``connection()`` is psycopg_pool's
    own (not a subclass's, which may do more), else ``(None, None)``.  The client then
    borrows with these two directly, doing what ``connection()`` does (a transaction left
    open committed, or rolled back on an error; the connection given back) without its two
    context managers and its commit under the connection's lock when there is nothing to
    commit (issue 34).  Only the pool's usage statistics (``usage_ms``) miss the time."""
    try:
        import psycopg_pool
    except ImportError:  # pragma: no cover -- a factory or another pool
        return None, None
    base: Any = psycopg_pool.AsyncConnectionPool if asynchronous else psycopg_pool.ConnectionPool
    if isinstance(source, base) and getattr(type(source), "connection", None) is base.connection:
        return source.getconn, source.putconn
    return None, None


def pool_methods_own(source: Any) -> bool:
    """Whether an async pool's ``getconn`` and ``putconn`` run nothing but psycopg's and
    psycopg_pool's own code, so that they may be stepped in the caller's task
    (`aio._Held.step`): psycopg_pool's ``AsyncConnectionPool`` itself (a subclass may
    override any of its methods, private ones included), connections whose ``rollback``
    and ``close`` (which ``putconn`` may call) are psycopg's own, and no callback of the
    application's that either would run (psycopg_pool 3.2's ``check``, a ``reset``).
    Code of anyone else's may enter something bound to the task it runs in before its
    first wait (``asyncio.timeout``, which cancels that task): it runs in a task of its
    own instead."""
    try:
        import psycopg_pool
    except ImportError:  # pragma: no cover
        return False
    if type(source) is not psycopg_pool.AsyncConnectionPool:
        return False
    kind = getattr(source, "connection_class", None)
    own = psycopg.AsyncConnection
    return (isinstance(kind, type) and issubclass(kind, own)
            and getattr(kind, "rollback", None) is own.rollback
            and getattr(kind, "close", None) is own.close
            and getattr(source, "_check", None) is None
            and getattr(source, "_reset", None) is None)