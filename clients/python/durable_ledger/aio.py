"""`AsyncLedger`: the durable_ledger protocol for asyncio, on psycopg 3's `AsyncConnection`
and `psycopg_pool.AsyncConnectionPool`.

The same names and the same semantics as the synchronous `Ledger` (read its docstrings:
every decision, exception and stop is the same, and both read the ledger's answers with
the same code, `durable_ledger._protocol`); every call is awaited::

    ledger = AsyncLedger(pool)                  # an AsyncConnectionPool, autocommit

    @ledger.tool("bank.pay")
    async def pay(args, idempotency_key):
        return await bank.pay(args["invoice"], args["amount"], idempotency_key=idempotency_key)

    async with ledger.token_attempt(run_id, ttl=60):
        receipt = await pay(run_id, {"invoice": "INV-9", "amount": 4200})

What differs, because of asyncio:

- ``perform`` (and a decorated tool) may be a coroutine function or a plain one.
- The token lease is renewed by a task of the event loop, so it is renewed while a tool or
  a model call is *awaited*; code that blocks the loop (a synchronous HTTP call) blocks the
  renewal too: run such code with ``asyncio.to_thread``.
- Tasks started inside ``async with ledger.token_attempt(run):`` (``asyncio.gather``,
  ``create_task``, a ``TaskGroup``) carry the attempt: a model's parallel tool calls run
  as tasks of one attempt, on as many pooled connections at once.  The end of the block
  waits for those still in flight.
- A session attempt (``async with ledger.attempt(run):``) is bound to its tasks the same
  way: its calls are those made in the block's context, the end of the block waits for
  those in flight, and a call of it that begins after the end raises `LeaseLost`.  An
  `AsyncLedger` never takes a session lease implicitly: outside an attempt, a call on a
  single connection needs the run held by ``acquire_run``.
- Cancellation: a ledger statement not sent yet is not sent; one that is out is finished
  before the cancellation goes on (an intent or a wait for a run's lease is cancelled on
  the server; a report runs to its end), so the connection stays usable and the ledger's
  answer is known; a call that was under way stops the attempt (the same call again would
  be the next occurrence, a second effect); a refusal that came back meanwhile stops it as
  a refusal.  Cancelled while ``perform`` runs, the outcome is unknown: nothing is
  recorded, and the run pauses at its next attempt until a person resolves the effect.
  The end of an attempt is finished even when cancelled.  (README, "Async".)
- An `AsyncLedger` belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import (Any, AsyncIterator, Awaitable, Callable, Coroutine, Dict, List, Mapping,
                    Optional, Protocol, Sequence, Tuple, TypeVar, Union, cast, overload)

import psycopg
from psycopg import generators
from psycopg.pq import ConnStatus, ExecStatus, TransactionStatus
from psycopg.rows import dict_row
from psycopg.waiting import READY_R, READY_W, WAIT_R, WAIT_W

from . import _protocol as p
from .outcomes import AsyncReconcile
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
from .errors import (EffectDidNotHappen, LeaseLost, LedgerError, LedgerRefused, LedgerUsageError,
                     PermissionDenied, RunBusy, WrongState)

__all__ = ["AsyncLedger", "AsyncTokenLease", "AsyncPerform", "AsyncToolFunction", "AsyncTool",
           "AsyncToolDecorator"]

#: ``perform(idempotency_key) -> result``, or a coroutine function returning it.
AsyncPerform = Callable[[str], Union[Any, Awaitable[Any]]]
#: ``tool(args, idempotency_key) -> result`` (a coroutine function, or a plain one).
AsyncToolFunction = Callable[[Any, str], Union[Any, Awaitable[Any]]]

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
#: The result of a plain (not async) function given to the AsyncLedger: a JSON value, which
#: is what the ledger records.  (Bound so that a coroutine function matches only the
#: overloads for awaitables: with both matching, mypy would type the result Any.)
J = TypeVar("J", bound=Union[None, bool, int, float, str, Mapping[str, Any], Sequence[Any]])


class AsyncTool(Protocol[R_co]):
    """A tool decorated by `AsyncLedger.tool`: a coroutine function, ``await tool(run, args,
    *, business_key=None, meta=None)`` gives what the function decorated returned (or what
    its awaitable gave: ``R_co``), as the ledger recorded it (a JSON round trip).
    ``tool.tool`` is its name, ``tool.perform`` the function decorated, ``tool.ledger`` the
    `AsyncLedger`."""

    def __call__(self, run: str, args: Any, *, business_key: Optional[str] = None,
                 meta: Any = None) -> Coroutine[Any, Any, R_co]: ...

    @property
    def tool(self) -> str: ...

    @property
    def perform(self) -> Callable[[Any, str], Any]: ...

    @property
    def ledger(self) -> "AsyncLedger": ...


class AsyncToolDecorator(Protocol):
    """What ``AsyncLedger.tool(name)`` returns: it decorates a coroutine function (its
    awaited result is the tool's) or a plain function (its result is the tool's)."""

    @overload
    def __call__(self, fn: Callable[[Any, str], Awaitable[R]]) -> AsyncTool[R]: ...

    @overload
    def __call__(self, fn: Callable[[Any, str], J]) -> AsyncTool[J]: ...


class AsyncTokenLease(TokenLease):
    """One attempt at a run under a token lease, in asyncio: what
    `AsyncLedger.token_attempt` yields.  The same attributes as `TokenLease`
    (``run``, ``epoch``, ``expires_at``, ``renewals``, ``lost``, ``check()``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle_event = asyncio.Event()
        self._idle_event.set()

    def _enter(self) -> None:
        super()._enter()
        self._idle_event.clear()

    def _leave(self) -> None:
        super()._leave()
        if self._inflight == 0:
            self._idle_event.set()

    async def _end_async(self) -> None:
        """The attempt's block is over: refuse new calls, await those in flight."""
        with self._mutex:
            self._ended = True
            inflight = self._inflight
        if inflight:
            log.debug("token attempt at %s waits for %d call(s) in flight", self.run, inflight)
        await self._idle_event.wait()


class _SessionAttempt:
    """One ``async with ledger.attempt(run):`` block: its calls in flight, and its end."""

    def __init__(self, run: str, ledger: "AsyncLedger") -> None:
        self.run = run
        self.ledger = ledger
        self.ended = False
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def enter(self) -> None:
        if self.ended:
            raise LeaseLost(
                self.run, None,
                f"run {self.run!r}: this call belongs to a session attempt that has ended (its "
                f"block was left while this call's task was still running); nothing was begun.  "
                f"A call must not outlive its attempt: wait for every task before leaving the "
                f"block")
        self.inflight += 1
        self.idle.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.idle.set()


#: The session attempts the running code belongs to (see `AsyncLedger.attempt`).
_SESSIONS: "contextvars.ContextVar[Tuple[_SessionAttempt, ...]]" = contextvars.ContextVar(
    "durable_ledger_session_attempts", default=())

T = TypeVar("T")


def _cancelled(*, result: Any = None, unsent: bool = False) -> asyncio.CancelledError:
    """The cancellation `_finish` raises: a plain CancelledError (asyncio.timeout turns only
    that very type into TimeoutError), which says whether its statement was not sent at all
    (``unsent``) or, when it was finished, carries its ``result`` for a caller that must undo
    it (a lease it took)."""
    error = asyncio.CancelledError()
    error.ledger_unsent = unsent  # type: ignore[attr-defined]
    error.ledger_result = result  # type: ignore[attr-defined]
    return error


def _unsent(exc: BaseException) -> bool:
    return bool(getattr(exc, "ledger_unsent", False))


def _finished_result(exc: BaseException) -> Any:
    return getattr(exc, "ledger_result", None)


class _Out:
    """Where a statement stands, for a cancellation of its caller: not sent yet (waiting
    for the connection), then sent on ``conn``.  ``cancellable``: it writes nothing when it
    fails (an intent, a wait for a run's lease), so a cancellation that comes while it is
    out may cancel it on the server."""

    def __init__(self, cancellable: bool) -> None:
        self.cancellable = cancellable
        self.conn: Optional["psycopg.AsyncConnection[Any]"] = None
        self.sent = False
        self.abandoned = False  # cancelled before it was sent: it is not sent at all
        self.cancel_requested = False

    def send(self, conn: "psycopg.AsyncConnection[Any]") -> None:
        """The statement goes out now on conn, unless its caller gave up meanwhile."""
        if self.abandoned:
            raise asyncio.CancelledError()
        self.conn = conn
        self.sent = True


def _cancel_on_server(conn: "psycopg.AsyncConnection[Any]") -> None:
    """conn.cancel() (a blocking PQcancel in psycopg 3.1) in a thread of the loop's
    executor, so that the loop goes on meanwhile; a cancel that fails is only logged: the
    statement then runs to its end."""
    def cancel() -> None:
        try:
            conn.cancel()
        except Exception as exc:  # noqa: BLE001 -- the statement runs to its end instead
            log.warning("could not cancel a ledger statement on the server (%s: %s); it runs "
                        "to its end", type(exc).__name__, exc)

    asyncio.get_running_loop().run_in_executor(None, cancel)


async def _finish(work: "Coroutine[Any, Any, T]", out: Optional[_Out] = None) -> T:
    """``await work`` (a ledger statement, or a step made of them), run to its end even
    when the awaiting task is cancelled meanwhile; then the cancellation goes on, raised
    here (`_cancelled`: with the work's result when it succeeded, with its error as the
    cause when it failed).  A statement abandoned half way would leave a connection with a
    reply nobody reads (psycopg 3.1 does not recover it), a pooled connection lost
    (psycopg_pool before 3.1.7), or an answer unknown that could have been known.  With
    ``out`` (a single statement): cancelled before it was sent, it is not sent at all;
    once out, a cancellable one is cancelled on the server."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
            if out is not None and not out.sent:
                out.abandoned = True  # checked when the connection is there (out.send)
            elif (out is not None and out.cancellable and out.conn is not None
                  and not out.cancel_requested):
                out.cancel_requested = True
                _cancel_on_server(out.conn)
        except BaseException:
            break  # the work failed: its error is raised below
    if task.cancelled():
        raise _cancelled(unsent=out is not None and out.abandoned and not out.sent)
    if cancelled:
        error = task.exception()
        if error is None:
            raise _cancelled(result=task.result())
        raise _cancelled() from error
    return task.result()


class _Held:
    """The cancellations of a caller held back while a step of the ledger runs in the
    caller's own task (issue 34: no task, shield and loop turns a statement on a
    psycopg_pool pool), which `_held` then raises at the step's end exactly as `_finish`
    raises them.  Every await of such a step goes through it: `wait_reply` (the reply of a
    statement sent), `step` (a coroutine of the pool or a lock, run here as long as it does
    not wait) and `task` (anything else, in a task of its own behind a shield, as
    `_finish` runs it).  ``out``: the step is one statement (see `_Out`): cancelled before
    it was sent, it is not sent; once out, a cancellable one is cancelled on the server."""

    __slots__ = ("cancelled", "out")

    def __init__(self, out: Optional[_Out] = None) -> None:
        self.cancelled = False
        self.out = out

    def cancel(self) -> None:
        """The caller was cancelled: remembered, and the statement's fate decided as
        `_finish` decides it."""
        self.cancelled = True
        out = self.out
        if out is None:
            return
        if not out.sent:
            out.abandoned = True  # checked when the connection is there (out.send)
        elif out.cancellable and out.conn is not None and not out.cancel_requested:
            out.cancel_requested = True
            _cancel_on_server(out.conn)

    async def task(self, work: "Coroutine[Any, Any, T]") -> T:
        """``await work`` in a task of its own, run to its end whatever happens to the
        caller (`_finish`'s way): the caller's cancellations meanwhile are held."""
        task = asyncio.ensure_future(work)
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                self.cancel()
            except BaseException:
                break  # the work failed: its error is raised below
        return task.result()

    async def step(self, work: "Coroutine[Any, Any, T]") -> T:
        """``await work`` (the pool's getconn or putconn, a lock, an event), run in the
        caller's task up to its first wait: one that does not wait (the common case: a
        connection idle in the pool, a lock free) costs no task; one that waits goes on
        in a task of its own (`task`), where no cancellation of the caller reaches it and
        whatever it starts from then on (a timeout) is its own."""
        try:
            waiting = work.send(None)
        except StopIteration as done:
            return cast(T, done.value)
        return await self.task(_resume(work, waiting))

    async def wait_reply(self, conn: "psycopg.AsyncConnection[Any]", gen: Any) -> Any:
        """``await conn.wait(gen)`` (psycopg's generator of a statement sent: its results),
        in the caller's task, finished whatever happens to the caller: a cancellation that
        comes while the reply is awaited is held, and the wait goes on (the socket is
        polled level-triggered: a reply that came meanwhile is not missed)."""
        loop = asyncio.get_running_loop()
        fileno = conn.pgconn.socket
        try:
            state = next(gen)
            while True:
                waiter = loop.create_future()
                reader, writer = state & WAIT_R, state & WAIT_W
                if reader:
                    loop.add_reader(fileno, _wake, waiter, READY_R)
                if writer:
                    loop.add_writer(fileno, _wake, waiter, READY_W)
                try:
                    ready = await waiter
                except asyncio.CancelledError:
                    self.cancel()
                    continue  # the same wait again
                finally:
                    if reader:
                        loop.remove_reader(fileno)
                    if writer:
                        loop.remove_writer(fileno)
                state = gen.send(ready)
        except StopIteration as done:
            return done.value


def _wake(waiter: "asyncio.Future[Any]", ready: Any) -> None:
    if not waiter.done():
        waiter.set_result(ready)


async def _resume(work: "Coroutine[Any, Any, T]", waiting: Any) -> T:
    """Goes on with ``work``, a coroutine started in another task that now waits for
    ``waiting`` (a future, or None: a bare yield), as the task running it would: what
    the future gives (its result, its error, a cancellation of this task) is passed in."""
    while True:
        try:
            if waiting is None:
                await asyncio.sleep(0)
            else:
                waiting._asyncio_future_blocking = False  # taken over, as a task takes it
                await waiting
        except BaseException as exc:  # noqa: B036 -- passed to the coroutine, as a task does
            try:
                waiting = work.throw(exc)
            except StopIteration as done:
                return cast(T, done.value)
            continue
        try:
            waiting = work.send(None)
        except StopIteration as done:
            return cast(T, done.value)


async def _held(start: "Callable[[_Held], Coroutine[Any, Any, T]]",
                out: Optional[_Out] = None) -> T:
    """``await start(held)``, a step of the ledger whose awaits all go through ``held``,
    run in the caller's task to its end; a cancellation of the caller meanwhile is raised
    at the end as `_finish` raises it (`_cancelled`: not sent, with the result, or with
    the error as the cause)."""
    held = _Held(out)
    try:
        result = await start(held)
    except asyncio.CancelledError:
        if not held.cancelled:
            raise
        raise _cancelled(unsent=out is not None and out.abandoned and not out.sent) from None
    except BaseException as error:
        if not held.cancelled:
            raise
        raise _cancelled() from error
    if held.cancelled:
        raise _cancelled(result=result)
    return result


def _idle_in(pool: Any) -> bool:
    """Whether psycopg_pool's pool has a connection idle (its getconn then hands it out
    without waiting, so without entering a timeout of the caller's task first)."""
    idle = getattr(pool, "_pool", None)
    try:
        return len(idle) > 0  # type: ignore[arg-type]
    except TypeError:
        return False


class AsyncLedger(p.LedgerCore):
    """The ledger, seen through one ``psycopg.AsyncConnection``, an async pool, or an async
    connection factory.  The asyncio twin of `Ledger`: see its docstring for the rules.

    ``AsyncLedger(conn)``: ``conn`` an ``AsyncConnection`` in **autocommit** mode,
    dedicated to the ledger; it serves session leases (`attempt`) and token leases
    (`token_attempt`); concurrent tasks' statements on it are sent one at a time.

    ``AsyncLedger(pool)`` (a ``psycopg_pool.AsyncConnectionPool``, or anything whose
    ``.connection()`` is an async context manager yielding an ``AsyncConnection``) and
    ``AsyncLedger(connect)`` (``connect()`` returns, or is a coroutine returning, an
    ``AsyncConnection``, closed after the statement) serve **token leases** only: every
    statement in a short transaction of its own on whatever connection comes out, which is
    what a pool, PgBouncer in transaction mode or a serverless endpoint needs.
    """

    def __init__(self, conn: Any, *, routed: bool = False) -> None:
        self._routed = routed  # through durable_ledger_proxy: see Ledger
        self._halted: Dict[str, _Halt] = {}
        self._models: Dict[str, str] = {}  # the model of each attempt open, by run
        self._leases: Dict[str, AsyncTokenLease] = {}
        self._opening: set[str] = set()
        self._session_held: set[str] = set()
        self._holds: Dict[str, p.SessionHold] = {}  # each session attempt's epoch and backend
        self._sessions: Dict[str, _SessionAttempt] = {}  # open attempt() blocks
        self._acquiring: set[str] = set()  # runs an explicit acquire_run is taking
        self._conn_lock = asyncio.Lock()
        self._source = conn
        # a psycopg_pool pool: borrowed with getconn/putconn straight (p.pool_methods)
        self._getconn, self._putconn = p.pool_methods(conn, True)
        # a statement on such a pool runs in the caller's task, its cancellations held
        # (`_Held`), where any other source's runs in a task of its own (`_finish`)
        self._held_path = self._getconn is not None and p.PLAIN_SEND
        # ... where getconn and putconn run in the caller's task up to their first wait
        # only when they are psycopg_pool's own; a subclass's always in a task of its own
        self._pool_steps = p.pool_methods_own(conn)
        self._borrow: Optional[Callable[[], Any]]
        if isinstance(conn, psycopg.AsyncConnection):
            self.conn: Optional["psycopg.AsyncConnection[Any]"] = conn
            self._borrow = None
            self._check_writable()
        elif isinstance(conn, psycopg.Connection) or not (
                callable(getattr(conn, "connection", None)) or callable(conn)):
            raise TypeError("AsyncLedger needs a psycopg.AsyncConnection, a "
                            "psycopg_pool.AsyncConnectionPool, or a function returning an "
                            "AsyncConnection (for a synchronous connection, use Ledger)")
        else:
            self.conn = None
            borrow = getattr(conn, "connection", None)
            self._borrow = borrow if callable(borrow) else cast(Callable[[], Any], conn)

    # ------------------------------------------------------------------ guarded

    @overload
    async def guarded(self, run: str, tool: str, args: Any,
                      perform: Callable[[str], Awaitable[R]], *,
                      business_key: Optional[str] = None, meta: Any = None,
                      reconcile: Optional[AsyncReconcile] = None, call_id: Optional[str] = None) -> R: ...

    @overload
    async def guarded(self, run: str, tool: str, args: Any, perform: Callable[[str], J], *,
                      business_key: Optional[str] = None, meta: Any = None,
                      reconcile: Optional[AsyncReconcile] = None, call_id: Optional[str] = None) -> J: ...

    async def guarded(self, run: str, tool: str, args: Any, perform: AsyncPerform, *,
                      business_key: Optional[str] = None, meta: Any = None,
                      reconcile: Optional[AsyncReconcile] = None, call_id: Optional[str] = None) -> Any:
        """Perform one side effect at most once per logical action; return its result.

        `Ledger.guarded`, awaited: ``perform(key)`` and ``reconcile(downstream_key, args)``
        may return an awaitable (typed: the result is what ``perform`` returns, or what its
        awaitable gives)."""
        return await self._call(run, tool, args, perform,
                                p.key_of_call(run, tool, business_key, call_id), meta,
                                recorded=False, reconcile=reconcile)

    @overload
    async def record(self, run: str, tool: str, args: Any, call: Callable[[], Awaitable[R]], *,
                     meta: Any = None) -> R: ...

    @overload
    async def record(self, run: str, tool: str, args: Any, call: Callable[[], J], *,
                     meta: Any = None) -> J: ...

    async def record(self, run: str, tool: str, args: Any, call: Callable[[], Any], *,
                     meta: Any = None) -> Any:
        """Make a call that is harmless to make again (a model's turn, a read) once per
        logical action; return its result, recorded and replayed like an effect.

        `Ledger.record`, awaited: ``call()`` may return an awaitable.  If ``call`` raises
        (or is cancelled), nothing is recorded and the attempt stops; the next attempt
        makes the call again instead of pausing, as when the worker dies during it."""
        return await self._call(run, tool, args, lambda _key: call(), None, meta,
                                recorded=True)

    async def local(self, run: str, tool: str, args: Any,
                    write: Callable[["psycopg.AsyncConnection[Any]", str], Any], *,
                    business_key: Optional[str] = None, meta: Any = None) -> Any:
        """Perform a local effect -- a write in the ledger's own database -- at most once per
        logical action, in one transaction with its intent and its outcome; its result.

        `Ledger.local`, awaited: ``write(conn, key)`` makes the effect on the
        ``psycopg.AsyncConnection`` and may return an awaitable.  Cancelled while ``write``
        runs, the transaction is rolled back and nothing is recorded; cancelled while the
        COMMIT is out, the attempt stops as when its answer is lost."""
        lease = p.bound_lease(self, run)
        if lease is not None:
            p.enter_attempt(lease)
            try:
                return await self._local(cast(AsyncTokenLease, lease), run, tool, args, write,
                                         business_key, meta)
            finally:
                lease._leave()
        session = self._enter_session_call(run, awaited=True)
        try:
            return await self._local(None, run, tool, args, write, business_key, meta)
        finally:
            if session is not None:
                session.leave()

    async def _local(self, lease: Optional[AsyncTokenLease], run: str, tool: str, args: Any,
                     write: Callable[["psycopg.AsyncConnection[Any]", str], Any],
                     business_key: Optional[str], meta: Any) -> Any:
        """`local` in the attempt ``lease`` (None: the session's), on one connection (see
        `Ledger._local`)."""
        halt = self._halter(run, lease)
        hold = self._holds.get(run) if lease is None else None
        query, params = p.begin_statement(run, tool, args, business_key, meta,
                                          lease.token if lease is not None else None,
                                          hold=hold, local=True, model=self._models.get(run))
        about = p.About(run, tool, from_row=True)
        answer: Optional[BaseException] = None  # raised once the transaction committed
        key: Optional[str] = None
        result: Any = None
        async with self._connection(fresh=True) as conn:
            committing = False
            try:
                async with conn.transaction():
                    row = await self._local_begin(conn, lease, run, tool, query, params, halt,
                                                  about)
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
                        result, answer = await self._local_write(
                            conn, run, begun, attempt, write, downstream_key, halt, about)
                    committing = True
            except BaseException as exc:
                if committing and key is not None and not _refused_cleanly(exc, conn):
                    p.local_commit_unknown(run, tool, key, exc, halt)
                raise
        if answer is not None:
            raise answer
        return result

    async def _local_begin(self, conn: "psycopg.AsyncConnection[Any]",
                           lease: Optional[AsyncTokenLease], run: str, tool: str, query: str,
                           params: Tuple[Any, ...], halt: p.HaltFn,
                           about: p.About) -> Dict[str, Any]:
        """begin_local in the open transaction: its row, or the refusal as `guarded`'s."""
        try:
            rows = await _execute_on(conn, query, params, shared=False,
                                     what=f"begin_local of {tool}", about=about)
        except psycopg.Error as exc:
            refused = p.begin_refused(exc, lease, run, tool, halt)
            if refused is not None:
                raise refused from exc
            raise
        return rows[0]

    async def _local_write(self, conn: "psycopg.AsyncConnection[Any]", run: str, key: str,
                           attempt: int,
                           write: Callable[["psycopg.AsyncConnection[Any]", str], Any],
                           downstream_key: str, halt: p.HaltFn,
                           about: p.About) -> Tuple[Any, Optional[BaseException]]:
        """``write`` in a savepoint, then its report (see `Ledger._local_write`)."""
        refusal: Optional[EffectDidNotHappen] = None
        result: Any = None
        try:
            async with conn.transaction():
                result = write(conn, downstream_key)
                if inspect.isawaitable(result):
                    result = await result
        except EffectDidNotHappen as exc:
            refusal = exc
        function, expected, payload = (("fail_effect", "failed", refusal.error) if refusal
                                       else ("complete_effect", "completed", result))
        query, params = p.report_statement(function, key, payload, attempt, self._route(run))
        row = (await _execute_on(conn, query, params, shared=False,
                                 what=f"{function} of {key}", about=about))[0]
        p.judge_report(row, run, key, attempt, function, expected, payload, halt)
        if refusal is not None:
            return None, p.refusal_recorded(key, refusal)
        return row["result"], None

    async def _call(self, run: str, tool: str, args: Any, perform: AsyncPerform,
                    business_key: Optional[str], meta: Any, *, recorded: bool,
                    reconcile: Optional[AsyncReconcile] = None) -> Any:
        """`guarded` or `record`, in the attempt the call belongs to."""
        lease = p.bound_lease(self, run)
        if lease is not None:
            p.enter_attempt(lease)
            try:
                return await self._guarded(cast(AsyncTokenLease, lease), run, tool, args,
                                           perform, business_key, meta, recorded, reconcile)
            finally:
                lease._leave()
        session = self._enter_session_call(run, awaited=True)
        try:
            return await self._guarded(None, run, tool, args, perform, business_key, meta,
                                       recorded, reconcile)
        finally:
            if session is not None:
                session.leave()

    def _bound_session(self, run: str) -> Optional[_SessionAttempt]:
        return p.bound_session(_SESSIONS, self, run)

    async def _guarded(self, lease: Optional[AsyncTokenLease], run: str, tool: str, args: Any,
                       perform: AsyncPerform, business_key: Optional[str], meta: Any,
                       recorded: bool, reconcile: Optional[AsyncReconcile] = None) -> Any:
        halt = self._halter(run, lease)
        row = await self._begin(lease, run, tool, args, business_key, meta, recorded, halt)
        if reconcile is not None and not recorded and p.reconcilable(row):
            try:
                settled = await self._reconciled(lease, run, tool, args, row, reconcile)
            except BaseException:  # the pause stands: the attempt stops at it
                p.halt_at_pause(row, run, tool, halt)
                raise
            if settled:
                row = await self._begin(lease, run, tool, args, business_key, meta, recorded,
                                        halt)
        decision = p.decision_of(row, run, tool, halt)
        if isinstance(decision, p.Replayed):
            return decision.result
        key, attempt, downstream_key = decision
        try:
            result = perform(downstream_key)
            if inspect.isawaitable(result):
                result = await result
        except EffectDidNotHappen as refusal:
            await self._record(run, key, attempt, "fail_effect", "failed", refusal.error, lease,
                               recorded)
            raise p.refusal_recorded(key, refusal) from refusal
        except BaseException as exc:
            if recorded:  # made again by the next attempt: nothing for a person
                p.recorded_call_raised(run, tool, key, exc, halt)
            else:
                p.outcome_unknown(run, tool, key, exc, halt)
            raise
        row = await self._record(run, key, attempt, "complete_effect", "completed", result,
                                 lease, recorded)
        return row["result"]

    async def _begin(self, lease: Optional[AsyncTokenLease], run: str, tool: str, args: Any,
                     business_key: Optional[str], meta: Any, recorded: bool,
                     halt: p.HaltFn) -> Dict[str, Any]:
        """begin_effect (begin_recorded) of the call, under the attempt's lease: its row."""
        hold = self._holds.get(run) if lease is None else None
        query, params = p.begin_statement(run, tool, args, business_key, meta,
                                          None if lease is None else lease.token,
                                          recorded=recorded, hold=hold,
                                          model=self._models.get(run))
        about = p.About(run, tool, from_row=True)

        def uncertain(exc: BaseException) -> None:
            p.begin_uncertain(run, tool, exc, halt, recorded)

        try:
            if lease is None:
                row = await self._one(query, params, what=f"begin_effect of {tool}",
                                      cancellable=True, about=about)
            else:
                row = await self._pooled_one(query, params, on_uncertain=uncertain,
                                             cancellable=True, what=f"begin_effect of {tool}",
                                             about=about)
        except LedgerUsageError as exc:
            if _not_committed(exc):
                p.begin_not_committed(run, tool, halt, recorded)
            raise
        except psycopg.Error as exc:
            refused = p.begin_refused(exc, lease, run, tool, halt)
            if refused is not None:
                raise refused from exc
            if lease is None and self.conn is not None and not _refused_cleanly(exc, self.conn):
                uncertain(exc)
            raise
        except (LedgerRefused, RunBusy):  # the server refused it cleanly: nothing written
            raise
        except BaseException as exc:
            if not _unsent(exc):  # (cancelled before the intent went out: nothing written)
                self._begin_cancelled(exc, lease, run, tool, halt, recorded, hold)
            raise
        if hold is not None:
            p.check_guard(row, run, hold, halt)  # PoolerDetected, LeaseLost
        return row

    async def _reconciled(self, lease: Optional[AsyncTokenLease], run: str, tool: str,
                          args: Any, row: Dict[str, Any], reconcile: AsyncReconcile) -> bool:
        """`Ledger._reconciled`, awaited: ``reconcile`` may return an awaitable."""
        key = row["key"]
        about = p.About(run, tool, key, from_row=True)
        due = await self._leaseless_one(lease, *p.reconcile_due_statement(row, self._route(run)),
                                    what=f"reconcilable_from of {key}", about=about)
        if not p.reconcile_due(row, due, run, tool):
            return False
        try:
            found = reconcile(row["downstream_key"], args)
            if inspect.isawaitable(found):
                found = await found
            finding = p.checked_finding(found, run, tool, key)
        except Exception as exc:
            p.reconcile_failed(run, tool, key, exc)
            return False
        if finding is None:
            return False
        query, params = p.reconcile_statement(row, finding, self._route(run))
        try:
            await self._leaseless_one(lease, query, params, what=f"reconcile_effect of {key}",
                                      about=about)
        except WrongState as exc:
            p.reconcile_refused(run, tool, key, exc)
            return False
        return True

    def _begin_cancelled(self, exc: BaseException, lease: Optional[AsyncTokenLease], run: str,
                         tool: str, halt: p.HaltFn, recorded: bool,
                         hold: Optional[p.SessionHold] = None) -> None:
        """A begin_effect whose caller was cancelled while it was out (or that failed in a
        way that leaves its fate unknown) stops the attempt as its answer says: a refusal as
        a refusal (an abandoned run is not to be retried), a lost lease as lost; an intent
        recorded but never performed, or one whose fate is unknown, as a call the same call
        again would duplicate (it would be the next occurrence)."""
        cause = exc.__cause__
        result = _finished_result(exc)
        if result is not None:
            rows = result[0] if isinstance(result, tuple) else result
            if hold is not None and rows and rows[0]["key"] is None:
                try:  # the guard found another server connection, or the lease lost
                    p.check_guard(rows[0], run, hold, halt)
                except LedgerError:
                    pass  # the attempt is stopped as the guard says; the cancellation goes on
                return
            if rows and rows[0]["decision"] == "execute":
                key = rows[0]["key"]
                p.stop(halt, key, f"run {run!r} is stopped in this attempt: the call of {tool} was "
                                  f"cancelled after its intent (key {key}) was recorded, before "
                                  f"it was performed"
                                  + ("" if recorded else "; the next attempt pauses on it"),
                       recorded)
            return
        if isinstance(cause, psycopg.Error):
            if lease is not None and cause.sqlstate == LEASE_LOST:
                lease._lose(cause)
                return
            if p.refusal(cause, run, tool, halt) is not None:
                return
        p.begin_uncertain(run, tool, exc, halt, recorded)

    async def _leaseless_one(self, lease: Optional[TokenLease], query: str, params: Tuple[Any, ...], *, what: str,
                        about: p.About, shielded: bool = False,
                        held: Optional[_Held] = None) -> Dict[str, Any]:
        """A statement that needs no lease (a report, a reconciler's finding): for a token
        attempt or a pool, in a transaction of its own; for a session attempt, on the
        session's connection.  Through a pool or a factory it is sent once more on a fresh
        connection if its answer is lost or no connection could be had (each is
        idempotent); a single connection is never replaced.  ``shielded``: see
        `_pooled_rows`; ``held``: the caller's (`_Held`)."""
        if lease is not None or self.conn is None:
            return await self._pooled_one(query, params, retry=True, what=what, about=about,
                                          shielded=shielded, held=held)
        return await self._one(query, params, what=what, about=about, shielded=shielded)

    async def _record(self, run: str, key: str, attempt: int, function: str, expected: str,
                      payload: Any, lease: Optional[TokenLease],
                      recorded: bool) -> Dict[str, Any]:
        """`Ledger._record`, awaited, and finished also when the caller is cancelled
        meanwhile: the report is sent and judged, the attempt stops (its caller never saw
        the answer, and the same call again would be the next occurrence), then the
        cancellation goes on.  A new attempt replays what was recorded."""
        try:
            if self._held_path:  # in this task, its cancellations held (`_held`)
                return await _held(lambda held: self._record_now(
                    run, key, attempt, function, expected, payload, lease, recorded, held))
            return await _finish(self._record_now(run, key, attempt, function, expected,
                                                  payload, lease, recorded))
        except asyncio.CancelledError as exc:
            p.stop(self._halter(run, lease), key,
                   f"run {run!r} is stopped in this attempt: the call of effect {key} was "
                   f"cancelled while its outcome was being recorded; a new attempt replays what "
                   f"the ledger recorded", recorded)
            if isinstance(exc.__cause__, LedgerError):
                # Its caller is gone: the log is the one place left that says what happened.
                log.warning("effect %s of run %s was performed but its outcome was not "
                            "recorded, and its caller was cancelled meanwhile (%s): %s", key,
                            run, "result" if function == "complete_effect" else "error",
                            payload)
            raise

    async def _record_now(self, run: str, key: str, attempt: int, function: str,
                          expected: str, payload: Any, lease: Optional[TokenLease],
                          recorded: bool, held: Optional[_Held] = None) -> Dict[str, Any]:
        halt = self._halter(run, lease)
        query, params = p.report_statement(function, key, payload, attempt, self._route(run))
        about = p.About(run, None, key, from_row=True)
        try:
            # shielded: _record runs this in a _finish of its own, or holds (`_held`)
            row = await self._leaseless_one(lease, query, params, what=f"{function} of {key}",
                                            about=about, shielded=True, held=held)
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

    def tool(self, name: str, *, business_key: Optional[Callable[[Any], Optional[str]]] = None,
             reconcile: Optional[AsyncReconcile] = None) -> AsyncToolDecorator:
        """Decorator for a side-effecting tool ``fn(args, idempotency_key) -> result`` (a
        coroutine function or a plain one); the decorated tool is a coroutine function
        ``await fn(run, args, *, business_key=None, meta=None)`` (typed: an `AsyncTool` of
        ``fn``'s result, awaited).  See `Ledger.tool`."""
        key_of = business_key

        def decorate(fn: AsyncToolFunction) -> AsyncTool[Any]:
            @functools.wraps(fn)
            async def call(run: str, args: Any, *, business_key: Optional[str] = None,
                           meta: Any = None) -> Any:
                if business_key is None and key_of is not None:
                    business_key = key_of(args)
                return await self.guarded(run, name, args, lambda key: fn(args, key),
                                          business_key=business_key, meta=meta,
                                          reconcile=reconcile)

            del call.__wrapped__  # type: ignore[attr-defined]  # its signature is not ours
            call.tool = name  # type: ignore[attr-defined]
            call.perform = fn  # type: ignore[attr-defined]
            call.ledger = self  # type: ignore[attr-defined]
            return cast(AsyncTool[Any], call)

        return cast(AsyncToolDecorator, decorate)

    # ------------------------------------------------------------ session leases

    async def acquire_run(self, run: str, wait: bool = True) -> bool:
        """`Ledger.acquire_run`, awaited (a wait for the lease does not block the loop)."""
        self._session_only("acquire_run()")
        if run in self._sessions or run in self._session_held or run in self._acquiring:
            raise p.attempt_already_open(run)
        self._acquiring.add(run)
        try:
            return await self._acquire(run, wait)
        finally:
            self._acquiring.discard(run)

    async def _acquire(self, run: str, wait: bool) -> bool:
        self._check_writable()
        conn = self.conn
        assert conn is not None
        try:
            row = await self._one(p.ACQUIRE_RUN, p.acquire_params(run, wait),
                                  what=f"acquire_run of {run}", cancellable=True,
                                  about=p.About(run))
        except psycopg.Error as exc:
            if exc.sqlstate == RUN_ABANDONED:
                raise _abandoned(run, exc) from exc
            raise
        except asyncio.CancelledError as cancelled:
            # The server's wait was cancelled; if the lease was granted first, the caller
            # that gave up must not keep it (released where it was taken, if it is known).
            taken = _finished_result(cancelled)
            if not (conn.closed or conn.broken):
                try:
                    hold = p.session_hold(taken[0], run) if taken else None
                    if hold is not None:
                        self._holds[run] = hold
                    await _finish(self._release(run))
                except Exception:
                    log.warning("could not release run %s after a cancelled acquire_run", run,
                                exc_info=True)
            raise
        hold = p.session_hold(row, run)
        if hold is None:
            return False
        self._halted.pop(run, None)
        self._holds[run] = hold
        self._session_held.add(run)
        return True

    async def release_run(self, run: str) -> bool:
        """`Ledger.release_run`, awaited."""
        self._session_only("release_run()")
        if run in self._sessions:
            raise p.release_inside_attempt(run, awaited=True)
        self._check_writable()
        self._session_held.discard(run)
        try:
            return await self._release(run)
        finally:
            self._halted.pop(run, None)

    async def _release(self, run: str) -> bool:
        """release_run of ``run`` where its attempt's lease is (see `Ledger._release`)."""
        hold = self._holds.pop(run, None)
        if hold is None:  # not an attempt of this AsyncLedger: its epoch is not known
            return bool((await self._one(p.RELEASE_RUN, (run,), what=f"release_run of {run}",
                                         about=p.About(run)))["ok"])
        row = await self._one(p.RELEASE_GUARDED, p.release_params(run, hold),
                              what=f"release_run of {run}", about=p.About(run))
        if row["released"] is not None:
            return bool(row["released"])
        # The statement did not reach the attempt's session: end the attempt's lease where
        # it is held, so that the lock is not left on a pooled server connection.
        try:
            ended = (await self._one(p.RELEASE_ATTEMPT, (run, hold.epoch),
                                     what=f"release_attempt of {run}",
                                     about=p.About(run)))["release_attempt"]
        except PermissionDenied as exc:
            p.release_refused(run, hold, row, exc)
            return False
        p.released_elsewhere(run, hold, row, bool(ended))
        return bool(ended)

    @asynccontextmanager
    async def attempt(self, run: str, *, wait: bool = True,
                      model: Optional[str] = None) -> AsyncIterator[str]:
        """``async with ledger.attempt(run):`` -- one attempt under a session lease on the
        AsyncLedger's connection.  See `Ledger.attempt`.

        The calls of the attempt are those made in the block's context (its own task and
        the tasks it starts); a call from another task is refused while the block is open,
        and one of the attempt that begins after the block was left raises `LeaseLost`
        and performs nothing.  The end of the block waits for the calls in flight, then
        releases the run.  A second attempt at the same run on this AsyncLedger while one
        is open is refused (`LedgerUsageError`): the lease belongs to the one connection,
        and would not keep the two apart.
        """
        self._session_only("attempt()")
        p.check_model(model)
        if (run in self._sessions or run in self._session_held or run in self._acquiring
                or run in self._leases or run in self._opening):
            raise p.attempt_already_open(run)
        session = _SessionAttempt(run, self)
        self._sessions[run] = session
        try:
            if not await self._acquire(run, wait):
                raise RunBusy(None, None, f"run {run!r} is held by another session")
        except BaseException:
            self._sessions.pop(run, None)
            raise
        bound = _SESSIONS.set(_SESSIONS.get() + (session,))
        if model is not None:
            self._models[run] = model
        try:
            yield run
        except BaseException:
            self._unbind_session(bound, session)
            await _finish(self._end_session(session, body_failed=True))
            raise
        self._unbind_session(bound, session)
        await _finish(self._end_session(session, body_failed=False))

    @staticmethod
    def _unbind_session(bound: "contextvars.Token[Tuple[_SessionAttempt, ...]]",
                        session: _SessionAttempt) -> None:
        try:
            _SESSIONS.reset(bound)
        except ValueError:  # left in another context than it was entered in
            _SESSIONS.set(tuple(s for s in _SESSIONS.get() if s is not session))

    async def _end_session(self, session: _SessionAttempt, *, body_failed: bool) -> None:
        """The end of an attempt() block: refuse new calls, await those in flight, release."""
        run = session.run
        session.ended = True
        try:
            await session.idle.wait()
        finally:
            self._sessions.pop(run, None)
            self._session_held.discard(run)
            self._halted.pop(run, None)
            self._models.pop(run, None)
        assert self.conn is not None
        if self.conn.closed or self.conn.broken:
            self._holds.pop(run, None)
            return  # the lease ended with the session
        try:
            await self._release(run)
        except Exception:
            if not body_failed:
                raise
            log.warning("could not release run %s after an error", run, exc_info=True)

    # ------------------------------------------------------------ token leases

    @asynccontextmanager
    async def token_attempt(self, run: str, *, ttl: Union[float, timedelta] = timedelta(minutes=5),
                            holder: Optional[str] = None,
                            model: Optional[str] = None) -> AsyncIterator[AsyncTokenLease]:
        """``async with ledger.token_attempt(run, ttl=60) as lease:`` -- one attempt at a
        run under a token lease.  See `Ledger.token_attempt`; here the renewal is a task of
        the event loop (every ``ttl / 3``), and the tasks started in the block carry the
        attempt."""
        ttl = p.as_ttl(ttl)
        p.check_model(model)
        if run in self._leases or run in self._opening:
            raise p.attempt_already_open(run)
        self._opening.add(run)
        try:
            try:
                row = await self._pooled_one(p.TAKE_LEASE, (run, ttl, holder), retry=True,
                                             what=f"take_lease of {run}")
            except psycopg.Error as exc:
                if exc.sqlstate == RUN_ABANDONED:
                    raise _abandoned(run, exc) from exc
                raise
            except asyncio.CancelledError as cancelled:
                # Cancelled while take_lease was out: a lease it took is let go at once
                # (else the run would stay held until its ttl).
                taken = _finished_result(cancelled)
                token = taken[0][0]["token"] if taken is not None else None
                if token is not None:
                    await _finish(self._pooled_rows(p.RELEASE_LEASE, (token,), retry=True,
                                                    what=f"release_lease of {run}"))
                raise
            lease = cast(AsyncTokenLease, p.new_lease(row, run, ttl, self, AsyncTokenLease))
            self._halted.pop(run, None)
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
            await self._end_attempt(lease, renewer, body_failed=True)
            raise
        p.unbind(bound, lease)
        await self._end_attempt(lease, renewer, body_failed=False)
        lease.check()

    async def _renew(self, lease: AsyncTokenLease, stop: asyncio.Event, first: float) -> None:
        """The renewal task of a token attempt: renew_lease after ``first`` seconds, then
        every ttl / 3, until stopped."""
        every = lease.ttl.total_seconds() / 3
        wait = first
        while True:
            if stop.is_set():
                return
            if wait > 0:
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                    return
                except asyncio.TimeoutError:
                    pass
            if self.conn is not None and self.conn.closed:
                return
            try:
                row = await self._pooled_one(p.RENEW_LEASE, (lease.token,), retry=True,
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

    async def _end_attempt(self, lease: AsyncTokenLease, renewer: "_Renewal", *,
                           body_failed: bool) -> None:
        """The end of a token attempt, finished also when the caller is cancelled
        meanwhile: in this task, its cancellations held, on a psycopg_pool pool (`_held`);
        else in a task of its own (`_finish`)."""
        if self._held_path:
            await _held(lambda held: self._end_token_attempt(lease, renewer,
                                                             body_failed=body_failed, held=held))
        else:
            await _finish(self._end_token_attempt(lease, renewer, body_failed=body_failed))

    async def _end_token_attempt(self, lease: AsyncTokenLease, renewer: "_Renewal", *,
                                 body_failed: bool, held: Optional[_Held] = None) -> None:
        # Calls of the attempt not begun yet are refused from now on; those in flight in
        # other tasks finish first (the lease is still renewed meanwhile).
        try:
            await (lease._end_async() if held is None else held.step(lease._end_async()))
        finally:
            # a renewal in flight finishes first
            await (renewer.end() if held is None else held.step(renewer.end()))
            self._leases.pop(lease.run, None)
            self._halted.pop(lease.run, None)
            self._models.pop(lease.run, None)
        if lease.lost is not None:
            return  # nothing to release
        try:
            rows, resent = await self._pooled_rows(p.RELEASE_LEASE, (lease.token,), retry=True,
                                                   what=f"release_lease of {lease.run}",
                                                   shielded=True,  # in _end_attempt's _finish
                                                   held=held)  # or held by it
        except Exception:
            if not body_failed:
                raise
            log.warning("could not release the token lease on run %s after an error",
                        lease.run, exc_info=True)
            return
        p.released(lease, rows[0]["released"], resent)

    # ------------------------------------------------------------------- reads

    async def effect_status(self, key: str, run: Optional[str] = None) -> Optional[Dict[str, Any]]:
        """`Ledger.effect_status`, awaited."""
        rows = await self._read(*p.routed(p.EFFECT_STATUS, (key,), self._route(run)),
                                what=f"effect_status of {key}",
                                about=p.About(key=key, from_row=True))
        return rows[0] if rows else None

    async def history(self, run: str) -> List[Dict[str, Any]]:
        """`Ledger.history`, awaited (needs durable_ledger_auditor)."""
        return await self._read(p.HISTORY, (run,), what=f"history of {run}",
                                about=p.About(run))

    async def _read(self, query: str, params: Tuple[Any, ...], *,
                    what: str, about: p.About) -> List[Dict[str, Any]]:
        if self.conn is None:
            return (await self._pooled_rows(query, params, what=what, about=about))[0]
        return await _finish(self._read_now(query, params, about))

    async def _read_now(self, query: str, params: Tuple[Any, ...],
                        about: p.About) -> List[Dict[str, Any]]:
        assert self.conn is not None
        notices: List[Any] = []
        rows: Optional[List[Dict[str, Any]]] = None
        try:
            async with self._conn_lock:
                with p.ledger_errors(), p.notices_of(self.conn, notices):
                    async with self.conn.cursor(row_factory=dict_row) as cur:
                        await cur.execute(query, params)
                        rows = await cur.fetchall()
        finally:
            p.log_notices(notices, about, rows)
        return rows

    # ----------------------------------------------------------------- helpers

    async def _one(self, query: str, params: Tuple[Any, ...], *,
                   what: str = "a ledger statement", cancellable: bool = False,
                   about: p.About = p.NOWHERE, shielded: bool = False) -> Dict[str, Any]:
        """A statement on the single connection, checked to have committed, and finished
        also when the caller is cancelled meanwhile (see `_finish`).  ``cancellable``: the
        statement writes nothing if it fails (a wait for a run's lease, an intent), and a
        cancellation that comes while it is out cancels it on the server."""
        out = _Out(cancellable)
        if shielded:  # see _pooled_rows
            rows = await self._one_now(query, params, what, out, about)
        else:
            rows = await _finish(self._one_now(query, params, what, out, about), out)
        assert len(rows) == 1, query
        return rows[0]

    async def _one_now(self, query: str, params: Tuple[Any, ...], what: str,
                       out: _Out, about: p.About) -> List[Dict[str, Any]]:
        assert self.conn is not None
        async with self._conn_lock:
            out.send(self.conn)
            return await _execute_on(self.conn, query, params, shared=True, what=what,
                                     about=about)

    @asynccontextmanager
    async def _connection(self, *, fresh: bool = False,
                          ) -> AsyncIterator["psycopg.AsyncConnection[Any]"]:
        """A connection for one statement (see `Ledger._connection`)."""
        if self._borrow is None:
            async with self._conn_lock:
                self._check_writable()
                yield self.conn  # type: ignore[misc]
            return
        tries = p.borrow_tries(self._source, fresh)
        if self._getconn is not None:
            for _ in range(tries):
                try:
                    conn = await self._getconn()
                except psycopg.OperationalError as exc:  # (a PoolTimeout) nothing was sent
                    raise _NotSent(f"the connection source handed out no connection ({exc})") from exc
                try:
                    alive = not (conn.closed or conn.broken or (fresh and not await _answers(conn)))
                    if not p.usable_lent(conn, alive, fresh):
                        continue  # given back broken: the pool discards it
                    try:
                        yield conn
                    except BaseException:
                        # as the pool's connection() does: what is left open rolled back
                        if not conn.closed and conn.pgconn.transaction_status != TransactionStatus.IDLE:
                            await conn.rollback()
                        raise
                    if not conn.closed and conn.pgconn.transaction_status != TransactionStatus.IDLE:
                        await conn.commit()
                    return
                finally:
                    await self._putconn(conn)
            raise psycopg.OperationalError(f"the connection source handed out no working "
                                           f"connection in {tries} tries")
        for _ in range(tries):
            # the connection source's connection, given back at the end; one that cannot be
            # had (it cannot connect; a pool's PoolTimeout) raises `_NotSent`: nothing was
            # sent, so an idempotent statement may be sent on the next one
            try:
                source = self._borrow()
                if inspect.isawaitable(source):
                    source = await source
            except psycopg.OperationalError as exc:
                raise _NotSent(f"the connection source handed out no connection ({exc})") from exc
            if not hasattr(source, "__aenter__"):
                raise TypeError("the connection source must hand out psycopg AsyncConnections "
                                "(a psycopg_pool.AsyncConnectionPool, or a function returning "
                                "an AsyncConnection)")
            handed_out = False
            try:
                async with source as conn:
                    handed_out = True
                    if not isinstance(conn, psycopg.AsyncConnection):
                        raise TypeError(f"the connection source handed out {type(conn).__name__}, "
                                        f"not a psycopg.AsyncConnection")
                    alive = not (conn.closed or conn.broken or (fresh and not await _answers(conn)))
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

    async def _pooled_rows(self, query: str, params: Tuple[Any, ...], *,
                           on_uncertain: Optional[Callable[[BaseException], None]] = None,
                           retry: bool = False, cancellable: bool = False,
                           what: str = "a ledger statement", about: p.About = p.NOWHERE,
                           shielded: bool = False,
                           held: Optional[_Held] = None) -> Tuple[List[Dict[str, Any]], bool]:
        """One statement in a transaction of its own, and whether it was sent twice (see
        `Ledger._pooled_rows`: only idempotent statements are sent again); finished also
        when the caller is cancelled meanwhile (see `_finish`).  ``shielded``: the caller
        already runs inside a `_finish` of its own (a report, the release at the end of a
        token attempt), which no cancellation of the awaiting task reaches: the statement is
        awaited in it directly, not in a second task of its own (issue 34: a task and a
        shield a statement less).  On a psycopg_pool pool (``_held_path``) the statement
        runs in the caller's task, the caller's cancellations held (`_held`), or held by
        ``held``, the caller's, for a larger step that raises them at its end (a report,
        the end of a token attempt)."""
        out = _Out(cancellable)
        if self._held_path:
            if held is not None:
                return await self._pooled_rows_held(query, params, on_uncertain, retry, what,
                                                    out, about, held)
            return await _held(lambda held: self._pooled_rows_held(
                query, params, on_uncertain, retry, what, out, about, held), out)
        if shielded:
            return await self._pooled_rows_now(query, params, on_uncertain, retry, what, out,
                                               about)
        return await _finish(self._pooled_rows_now(query, params, on_uncertain, retry, what, out,
                                                   about), out)

    async def _pooled_rows_now(self, query: str, params: Tuple[Any, ...],
                               on_uncertain: Optional[Callable[[BaseException], None]],
                               retry: bool, what: str, out: _Out,
                               about: p.About) -> Tuple[List[Dict[str, Any]], bool]:
        broke: List[BaseException] = []
        try:
            return (await self._pooled_once(query, params, on_uncertain, broke, what, out,
                                            about, fresh=False), False)
        except psycopg.OperationalError as exc:
            if not (retry and self._borrow is not None and (broke or isinstance(exc, _NotSent))):
                raise
            p.warn_resend(what, exc)
            first = exc
        try:
            return (await self._pooled_once(query, params, None, [], what, out, about,
                                            fresh=True), True)
        except BaseException as again:
            if again.__context__ is None:
                again.__context__ = first
            raise

    async def _pooled_rows_held(self, query: str, params: Tuple[Any, ...],
                                on_uncertain: Optional[Callable[[BaseException], None]],
                                retry: bool, what: str, out: _Out, about: p.About,
                                held: _Held) -> Tuple[List[Dict[str, Any]], bool]:
        """`_pooled_rows_now` on a psycopg_pool pool, in the caller's task, every await
        through ``held``."""
        broke: List[BaseException] = []
        try:
            return (await self._pooled_once_held(query, params, on_uncertain, broke, what, out,
                                                 about, held), False)
        except psycopg.OperationalError as exc:
            if not (retry and (broke or isinstance(exc, _NotSent))):
                raise
            p.warn_resend(what, exc)
            first = exc
        try:
            # on a fresh connection (an empty query first): the way any source is borrowed
            # from, in a task of its own
            return (await held.task(self._pooled_once(query, params, None, [], what, out,
                                                      about, fresh=True)), True)
        except BaseException as again:
            if again.__context__ is None:
                again.__context__ = first
            raise

    async def _pooled_once_held(self, query: str, params: Tuple[Any, ...],
                                on_uncertain: Optional[Callable[[BaseException], None]],
                                broke: List[BaseException], what: str, out: _Out,
                                about: p.About, held: _Held) -> List[Dict[str, Any]]:
        """`_pooled_once` on a psycopg_pool pool (getconn and putconn straight, what
        `_connection` does for it), in the caller's task, every await through ``held``."""
        assert self._getconn is not None and self._putconn is not None
        try:
            # a connection idle in the pool is handed out without a wait; else getconn
            # waits in a task of its own (its timeout its own), as a subclass's always
            # does (what it enters before its first wait is bound to the task it runs in)
            conn = await (held.step(self._getconn()) if self._pool_steps and _idle_in(self._source)
                          else held.task(self._getconn()))
        except psycopg.OperationalError as exc:  # (a PoolTimeout) nothing was sent
            raise _NotSent(f"the connection source handed out no connection ({exc})") from exc
        plain = False
        try:
            lock = conn.lock
            await held.step(lock.acquire())  # (free: the pool lent the connection to us)
            try:
                # idle, open, in no pipeline: usable (`usable_lent`) and sent straight
                plain = p.plain_ready(conn)
                if not plain:
                    p.usable_lent(conn, not (conn.closed or conn.broken), False)
                out.send(conn)  # CancelledError: the caller gave up before it went out
                if plain:
                    try:
                        return await _send_held(conn, query, params, what, about, held)
                    except BaseException as exc:
                        p.note_uncertain(exc, conn, broke, on_uncertain)
                        raise
            finally:
                lock.release()
            # any other: `_pooled_once`'s way, in a task of its own
            return await held.task(self._once_on(conn, query, params, on_uncertain, broke,
                                                 what, about))
        except BaseException:
            # (plain_rows refuses a statement that did not end idle: as the pool's
            # connection() does, what is left open after the statement is rolled back)
            if (plain and out.sent and not conn.closed
                    and conn.pgconn.transaction_status != TransactionStatus.IDLE):
                await held.task(conn.rollback())
            raise
        finally:
            await (held.step(self._putconn(conn)) if self._pool_steps
                   else held.task(self._putconn(conn)))

    async def _once_on(self, conn: "psycopg.AsyncConnection[Any]", query: str,
                       params: Tuple[Any, ...],
                       on_uncertain: Optional[Callable[[BaseException], None]],
                       broke: List[BaseException], what: str,
                       about: p.About) -> List[Dict[str, Any]]:
        """The statement on a lent connection that is not idle (the cursor's way, what
        `_connection` and `_pooled_once` do around it)."""
        try:
            try:
                rows = await _execute_on(conn, query, params, shared=False, what=what,
                                         about=about)
            except BaseException as exc:
                p.note_uncertain(exc, conn, broke, on_uncertain)
                raise
        except BaseException:
            if not conn.closed and conn.pgconn.transaction_status != TransactionStatus.IDLE:
                await conn.rollback()
            raise
        if not conn.closed and conn.pgconn.transaction_status != TransactionStatus.IDLE:
            await conn.commit()
        return rows

    async def _pooled_once(self, query: str, params: Tuple[Any, ...],
                           on_uncertain: Optional[Callable[[BaseException], None]],
                           broke: List[BaseException], what: str, out: _Out, about: p.About,
                           *, fresh: bool) -> List[Dict[str, Any]]:
        async with self._connection(fresh=fresh) as conn:
            out.send(conn)
            try:
                return await _execute_on(conn, query, params, shared=self._borrow is None,
                                         what=what, about=about)
            except BaseException as exc:
                p.note_uncertain(exc, conn, broke, on_uncertain)
                raise

    async def _pooled_one(self, query: str, params: Tuple[Any, ...], *,
                          on_uncertain: Optional[Callable[[BaseException], None]] = None,
                          retry: bool = False, cancellable: bool = False,
                          what: str = "a ledger statement",
                          about: p.About = p.NOWHERE, shielded: bool = False,
                          held: Optional[_Held] = None) -> Dict[str, Any]:
        rows = (await self._pooled_rows(query, params, on_uncertain=on_uncertain, retry=retry,
                                        cancellable=cancellable, what=what, about=about,
                                        shielded=shielded, held=held))[0]
        assert len(rows) == 1, query
        return rows[0]


class _Renewal:
    """The renewal of one token attempt's lease: a task of the event loop ("durable_ledger
    renewal of RUN") that renews it every ttl / 3, started by a timer of the loop when the
    first renewal is due.  An attempt shorter than ttl / 3 -- the common one -- starts no
    task (issue 34: a task and its ``wait_for`` per attempt were a tenth of a guarded
    call's CPU).  The task runs in the context of the attempt's start, as it did when it
    was started there."""

    def __init__(self, ledger: "AsyncLedger", lease: AsyncTokenLease) -> None:
        self.ledger: Optional[AsyncLedger] = ledger
        self.lease: Optional[AsyncTokenLease] = lease
        self.stop = asyncio.Event()
        self.task: "Optional[asyncio.Task[None]]" = None
        self.timer: Optional[asyncio.TimerHandle] = asyncio.get_running_loop().call_later(
            lease.ttl.total_seconds() / 3, self._start)

    def _start(self) -> None:
        self.timer = None
        if self.stop.is_set() or self.ledger is None or self.lease is None:
            return
        self.task = asyncio.get_running_loop().create_task(
            self.ledger._renew(self.lease, self.stop, 0.0),
            name=f"durable_ledger renewal of {self.lease.run}")

    async def end(self) -> None:
        """No renewal starts from now on; one in flight finishes first."""
        self.stop.set()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.ledger = self.lease = None
        if self.task is not None:
            await asyncio.wait([self.task], timeout=30)


#: How long a pooled connection may take to answer an empty query before it counts as dead.
PROBE_TIMEOUT = 5.0



def _refuse_if_in_transaction(status: int, what: str) -> None:
    """The statement is not sent on a connection inside someone else's transaction (a
    lost connection is left to the send, which reports it as such)."""
    if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        raise p.in_foreign_transaction(what, status, sent=False)


async def _answers(conn: "psycopg.AsyncConnection[Any]") -> bool:
    """Whether the connection answers an empty query (nothing of the ledger is sent) within
    PROBE_TIMEOUT seconds, waiting without blocking the event loop.  One that does not is
    given back unanswered: the pool discards a connection returned busy."""
    try:
        async with conn.lock:
            conn.pgconn.send_query(b"")
            results = await asyncio.wait_for(conn.wait(generators.execute(conn.pgconn)),
                                             PROBE_TIMEOUT)
    except (Exception, asyncio.TimeoutError):
        return False
    return (conn.pgconn.status == ConnStatus.OK and len(results) == 1
            and results[0].status == ExecStatus.EMPTY_QUERY)


async def _execute_on(conn: "psycopg.AsyncConnection[Any]", query: str,
                      params: Tuple[Any, ...], *, shared: bool, what: str,
                      about: p.About = p.NOWHERE) -> List[Dict[str, Any]]:
    """`_execute_raw`, its errors with a SQLSTATE of the ledger's as named exceptions, and
    the server's notices meanwhile logged (see the synchronous `_execute_on`)."""
    notices: List[Any] = []
    rows: Optional[List[Dict[str, Any]]] = None
    try:
        with p.ledger_errors(), p.notices_of(conn, notices):
            rows = await _execute_raw(conn, query, params, shared=shared, what=what)
    finally:
        p.log_notices(notices, about, rows)
    return rows


async def _send_held(conn: "psycopg.AsyncConnection[Any]", query: str,
                     params: Tuple[Any, ...], what: str, about: p.About,
                     held: _Held) -> List[Dict[str, Any]]:
    """`_execute_on` of an idle pooled connection whose lock the caller holds, in the
    caller's task: the statement sent straight (`p.plain_send`), its reply awaited here
    (`_Held.wait_reply`)."""
    notices: List[Any] = []
    rows: Optional[List[Dict[str, Any]]] = None
    try:
        with p.ledger_errors(), p.notices_of(conn, notices):
            sent = p.plain_send(conn, query, params)
            rows = p.plain_rows(conn, sent, await held.wait_reply(conn, sent.gen), what)
    finally:
        p.log_notices(notices, about, rows)
    return rows


async def _execute_raw(conn: "psycopg.AsyncConnection[Any]", query: str,
                       params: Tuple[Any, ...], *, shared: bool,
                       what: str) -> List[Dict[str, Any]]:
    """One ledger statement on ``conn`` in a transaction of its own; its rows.  ``shared``:
    the AsyncLedger's single connection, whose transaction status is read with the reply
    (see the synchronous `_execute_on`)."""
    if not shared:
        async with conn.lock:
            if p.plain_ready(conn):  # idle: the statement alone, sent straight (p.plain_send)
                sent = p.plain_send(conn, query, params)
                return p.plain_rows(conn, sent, await conn.wait(sent.gen), what)
    async with conn.cursor(row_factory=dict_row) as cur:
        if shared:
            status = await _execute_and_status(conn, cur, query, params, what)
            if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                raise p.in_foreign_transaction(what, status)
            return await cur.fetchall()
        if conn.autocommit:
            await cur.execute(query, params, prepare=False)
            return await cur.fetchall()
        if conn.info.transaction_status == TransactionStatus.IDLE:
            return await _alone(conn, cur, query, params)
        async with conn.transaction():  # a savepoint in the caller's transaction (a local effect's)
            await cur.execute(query, params, prepare=False)
            rows = await cur.fetchall()
        return rows


async def _alone(conn: "psycopg.AsyncConnection[Any]", cur: Any, query: str,
                 params: Tuple[Any, ...]) -> List[Dict[str, Any]]:
    """One statement as a transaction of its own on an idle connection that is not in
    autocommit mode (a pool's), in one round trip (see the synchronous `_alone`)."""
    await conn.set_autocommit(True)
    try:
        await cur.execute(query, params, prepare=False)
        rows: List[Dict[str, Any]] = await cur.fetchall()
        return rows
    finally:
        try:
            await conn.set_autocommit(False)
        except BaseException:
            await conn.close()


async def _execute_and_status(conn: "psycopg.AsyncConnection[Any]", cur: Any, query: str,
                              params: Tuple[Any, ...], what: str) -> int:
    """``await cur.execute(query, params)`` and the transaction status right after its
    reply, under the connection's lock so that no other task's statement comes between;
    not sent at all if the connection is in a transaction already (see the synchronous
    `_execute_and_status`)."""
    execute_gen = getattr(cur, "_execute_gen", None)
    lock = getattr(conn, "lock", None)
    if execute_gen is None or lock is None:  # not psycopg 3.1/3.2: no atomic read
        _refuse_if_in_transaction(conn.info.transaction_status, what)
        await cur.execute(query, params, prepare=False)
        return conn.info.transaction_status
    try:
        async with lock:
            _refuse_if_in_transaction(conn.pgconn.transaction_status, what)
            await conn.wait(execute_gen(query, params, prepare=False))
            return conn.pgconn.transaction_status
    except psycopg.Error as exc:
        raise exc.with_traceback(None)
