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
- A call cancelled while its ``begin_effect`` is out (``task.cancel()``, a timeout) stops
  the attempt, as does any failure that leaves it unknown whether the intent committed:
  the same call again in the same attempt would be the next occurrence, a second effect.
  Cancelled while ``perform`` runs, the outcome is unknown: nothing is recorded, the run
  pauses at its next attempt until a person resolves the effect.
- An `AsyncLedger` belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Tuple,
                    Union, cast)

import psycopg
from psycopg.pq import ConnStatus, ExecStatus, TransactionStatus
from psycopg.rows import dict_row

from . import _protocol as p
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
    _stopped,
    log,
)
from .errors import EffectDidNotHappen, LedgerError, LedgerUsageError, RunBusy

__all__ = ["AsyncLedger", "AsyncTokenLease", "AsyncPerform", "AsyncToolFunction"]

#: ``perform(idempotency_key) -> result``, or a coroutine function returning it.
AsyncPerform = Callable[[str], Union[Any, Awaitable[Any]]]
#: ``tool(args, idempotency_key) -> result`` (a coroutine function, or a plain one).
AsyncToolFunction = Callable[[Any, str], Union[Any, Awaitable[Any]]]


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


class AsyncLedger:
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

    def __init__(self, conn: Any) -> None:
        self._halted: Dict[str, _Halt] = {}
        self._leases: Dict[str, AsyncTokenLease] = {}
        self._opening: set[str] = set()
        self._used_tokens = False
        self._session_held: set[str] = set()
        self._conn_lock = asyncio.Lock()
        self._source = conn
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

    async def guarded(self, run: str, tool: str, args: Any, perform: AsyncPerform, *,
                      business_key: Optional[str] = None, meta: Any = None) -> Any:
        """Perform one side effect at most once per logical action; return its result.

        `Ledger.guarded`, awaited: ``perform(key)`` may return an awaitable."""
        lease = p.bound_lease(self, run)
        if lease is not None:
            p.enter_attempt(lease)
            try:
                return await self._guarded(cast(AsyncTokenLease, lease), run, tool, args,
                                           perform, business_key, meta)
            finally:
                lease._leave()
        if run in self._leases:
            raise p.not_carried(run)
        self._session_only("guarded() outside token_attempt()")
        if self._used_tokens and run not in self._session_held:
            raise p.no_implicit_session(run)
        self._check_writable()
        halted = self._halted.get(run)
        if halted is not None:
            raise _stopped(halted)
        return await self._guarded(None, run, tool, args, perform, business_key, meta)

    def _halter(self, run: str, lease: Optional[TokenLease]) -> p.HaltFn:
        return lambda key, reason, error: self._halt(run, key, reason, lease, error=error)

    async def _guarded(self, lease: Optional[AsyncTokenLease], run: str, tool: str, args: Any,
                       perform: AsyncPerform, business_key: Optional[str], meta: Any) -> Any:
        halt = self._halter(run, lease)
        if lease is None:
            query, params = p.BEGIN_SESSION, p.begin_params(run, tool, args, business_key, meta)
        else:
            query, params = p.BEGIN_TOKEN, p.begin_params(run, tool, args, business_key, meta,
                                                          lease.token)
        def uncertain(exc: BaseException) -> None:
            p.begin_uncertain(run, tool, exc, halt)

        try:
            if lease is None:
                row = await self._one(query, params, what=f"begin_effect of {tool}")
            else:
                row = await self._pooled_one(query, params, on_uncertain=uncertain,
                                             what=f"begin_effect of {tool}")
        except LedgerUsageError as exc:
            if _not_committed(exc):
                p.begin_not_committed(run, tool, halt)
            raise
        except psycopg.Error as exc:
            if lease is not None and exc.sqlstate == LEASE_LOST:
                raise lease._lose(exc) from exc
            refused = p.refusal(exc, run, tool, halt)
            if refused is not None:
                raise refused from exc
            if lease is None and self.conn is not None and not _refused_cleanly(exc, self.conn):
                uncertain(exc)
            raise
        except BaseException as exc:
            # Cancelled while the statement was out: it may have committed, and the same
            # call again in this attempt would be the next occurrence.
            uncertain(exc)
            raise
        decision = p.decision_of(row, run, tool, halt)
        if isinstance(decision, p.Replayed):
            return decision.result
        key, attempt = decision
        try:
            result = perform(key)
            if inspect.isawaitable(result):
                result = await result
        except EffectDidNotHappen as refusal:
            await self._record(run, key, attempt, "fail_effect", "failed", refusal.error, lease)
            raise p.refusal_recorded(key, refusal) from refusal
        except BaseException as exc:
            p.outcome_unknown(run, tool, key, exc, halt)
            raise
        row = await self._record(run, key, attempt, "complete_effect", "completed", result,
                                 lease)
        return row["result"]

    async def _record(self, run: str, key: str, attempt: int, function: str, expected: str,
                      payload: Any, lease: Optional[TokenLease]) -> Dict[str, Any]:
        """`Ledger._record`, awaited."""
        halt = self._halter(run, lease)
        query, params = p.report_statement(function, key, payload, attempt)
        try:
            if lease is not None or self.conn is None:
                row = await self._pooled_one(query, params, retry=True,
                                             what=f"{function} of {key}")
            else:
                row = await self._one(query, params, what=f"{function} of {key}")
        except BaseException as exc:
            failed = p.report_failed(run, key, function, expected, payload, exc, halt)
            if not isinstance(exc, Exception):
                raise
            raise failed from exc
        judged: Dict[str, Any] = p.judge_report(row, run, key, attempt, function, expected,
                                                payload, halt)
        return judged

    # ---------------------------------------------------------------- decorator

    def tool(self, name: str, *, business_key: Optional[Callable[[Any], Optional[str]]] = None,
             ) -> Callable[[AsyncToolFunction], Callable[..., Awaitable[Any]]]:
        """Decorator for a side-effecting tool ``fn(args, idempotency_key) -> result`` (a
        coroutine function or a plain one); the decorated tool is a coroutine function
        ``await fn(run, args, *, business_key=None, meta=None)``.  See `Ledger.tool`."""
        key_of = business_key

        def decorate(fn: AsyncToolFunction) -> Callable[..., Awaitable[Any]]:
            @functools.wraps(fn)
            async def call(run: str, args: Any, *, business_key: Optional[str] = None,
                           meta: Any = None) -> Any:
                if business_key is None and key_of is not None:
                    business_key = key_of(args)
                return await self.guarded(run, name, args, lambda key: fn(args, key),
                                          business_key=business_key, meta=meta)

            del call.__wrapped__  # type: ignore[attr-defined]  # its signature is not ours
            call.tool = name  # type: ignore[attr-defined]
            call.perform = fn  # type: ignore[attr-defined]
            call.ledger = self  # type: ignore[attr-defined]
            return call

        return decorate

    # ------------------------------------------------------------ session leases

    async def acquire_run(self, run: str, wait: bool = True) -> bool:
        """`Ledger.acquire_run`, awaited (a wait for the lease does not block the loop)."""
        self._session_only("acquire_run()")
        self._check_writable()
        try:
            row = await self._one(p.ACQUIRE_RUN, (run, wait), what=f"acquire_run of {run}")
        except psycopg.Error as exc:
            if exc.sqlstate == RUN_ABANDONED:
                raise _abandoned(run, exc) from exc
            raise
        if row["ok"]:
            self._halted.pop(run, None)
            self._session_held.add(run)
        return bool(row["ok"])

    async def release_run(self, run: str) -> bool:
        """`Ledger.release_run`, awaited."""
        self._session_only("release_run()")
        self._check_writable()
        self._session_held.discard(run)
        row = await self._one(p.RELEASE_RUN, (run,), what=f"release_run of {run}")
        self._halted.pop(run, None)
        return bool(row["ok"])

    @asynccontextmanager
    async def attempt(self, run: str, *, wait: bool = True) -> AsyncIterator[str]:
        """``async with ledger.attempt(run):`` -- one attempt under a session lease on the
        AsyncLedger's connection.  See `Ledger.attempt`."""
        if not await self.acquire_run(run, wait=wait):
            raise RunBusy(None, None, f"run {run!r} is held by another session")
        assert self.conn is not None
        try:
            yield run
        except BaseException:
            self._halted.pop(run, None)
            self._session_held.discard(run)
            if not (self.conn.closed or self.conn.broken):
                try:
                    await self._one(p.RELEASE_RUN, (run,), what=f"release_run of {run}")
                except Exception:  # the body's exception is the one that matters
                    log.warning("could not release run %s after an error", run, exc_info=True)
            raise
        else:
            await self.release_run(run)

    # ------------------------------------------------------------ token leases

    @asynccontextmanager
    async def token_attempt(self, run: str, *, ttl: Union[float, timedelta] = timedelta(minutes=5),
                            holder: Optional[str] = None) -> AsyncIterator[AsyncTokenLease]:
        """``async with ledger.token_attempt(run, ttl=60) as lease:`` -- one attempt at a
        run under a token lease.  See `Ledger.token_attempt`; here the renewal is a task of
        the event loop (every ``ttl / 3``), and the tasks started in the block carry the
        attempt."""
        ttl = p.as_ttl(ttl)
        if run in self._leases or run in self._opening:
            raise p.attempt_already_open(run)
        self._opening.add(run)
        self._used_tokens = True
        try:
            try:
                row = await self._pooled_one(p.TAKE_LEASE, (run, ttl, holder), retry=True,
                                             what=f"take_lease of {run}")
            except psycopg.Error as exc:
                if exc.sqlstate == RUN_ABANDONED:
                    raise _abandoned(run, exc) from exc
                raise
            lease = cast(AsyncTokenLease, p.new_lease(row, run, ttl, self, AsyncTokenLease))
            self._halted.pop(run, None)
            self._leases[run] = lease
        finally:
            self._opening.discard(run)
        stop = asyncio.Event()
        renewer = asyncio.create_task(self._renew(lease, stop),
                                      name=f"durable_ledger renewal of {run}")
        log.debug("token attempt at %s: epoch %s, ttl %s", run, lease.epoch, ttl)
        bound = _ATTEMPTS.set(_ATTEMPTS.get() + (lease,))
        try:
            yield lease
        except BaseException:
            p.unbind(bound, lease)
            await self._end_token_attempt(lease, stop, renewer, body_failed=True)
            raise
        p.unbind(bound, lease)
        await self._end_token_attempt(lease, stop, renewer, body_failed=False)
        lease.check()

    async def _renew(self, lease: AsyncTokenLease, stop: asyncio.Event) -> None:
        """The renewal task of a token attempt: renew_lease every ttl / 3 until stopped."""
        every = lease.ttl.total_seconds() / 3
        wait = every
        while True:
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

    async def _end_token_attempt(self, lease: AsyncTokenLease, stop: asyncio.Event,
                                 renewer: "asyncio.Task[None]", *, body_failed: bool) -> None:
        # Calls of the attempt not begun yet are refused from now on; those in flight in
        # other tasks finish first (the lease is still renewed meanwhile).
        await lease._end_async()
        stop.set()
        await asyncio.wait([renewer], timeout=30)  # a renewal in flight finishes first
        self._leases.pop(lease.run, None)
        self._halted.pop(lease.run, None)
        if lease.lost is not None:
            return  # nothing to release
        try:
            rows, resent = await self._pooled_rows(p.RELEASE_LEASE, (lease.token,), retry=True,
                                                   what=f"release_lease of {lease.run}")
        except Exception:
            if not body_failed:
                raise
            log.warning("could not release the token lease on run %s after an error",
                        lease.run, exc_info=True)
            return
        p.released(lease, rows[0]["released"], resent)

    # ------------------------------------------------------------------- reads

    async def effect_status(self, key: str) -> Optional[Dict[str, Any]]:
        """`Ledger.effect_status`, awaited."""
        rows = await self._read(p.EFFECT_STATUS, (key,), what=f"effect_status of {key}")
        return rows[0] if rows else None

    async def history(self, run: str) -> List[Dict[str, Any]]:
        """`Ledger.history`, awaited (needs durable_ledger_auditor)."""
        return await self._read(p.HISTORY, (run,), what=f"history of {run}")

    async def _read(self, query: str, params: Tuple[Any, ...], *,
                    what: str) -> List[Dict[str, Any]]:
        if self.conn is None:
            return (await self._pooled_rows(query, params, what=what))[0]
        async with self._conn_lock:
            async with self.conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query, params)
                return await cur.fetchall()

    # ----------------------------------------------------------------- helpers

    def _session_only(self, what: str) -> None:
        if self.conn is None:
            raise p.session_only(what)

    def _check_writable(self) -> None:
        assert self.conn is not None
        problem = p.unwritable(self.conn)
        if problem is not None:
            raise problem

    def _halt(self, run: str, key: Optional[str], reason: str,
              lease: Optional[TokenLease] = None, *,
              error: Optional[Callable[[], LedgerError]] = None) -> None:
        """Stop ``run`` in its current attempt (see `Ledger._halt`)."""
        if lease is not None:
            with lease._mutex:
                if lease._halted is None:
                    lease._halted = (key, reason, error)
        else:
            self._halted.setdefault(run, (key, reason, error))

    async def _one(self, query: str, params: Tuple[Any, ...], *,
                   what: str = "a ledger statement") -> Dict[str, Any]:
        """A statement on the single connection, checked to have committed."""
        assert self.conn is not None
        async with self._conn_lock:
            rows = await _execute_on(self.conn, query, params, shared=True, what=what)
        assert len(rows) == 1, query
        return rows[0]

    @asynccontextmanager
    async def _connection(self, *, fresh: bool = False,
                          ) -> AsyncIterator["psycopg.AsyncConnection[Any]"]:
        """A connection for one statement (see `Ledger._connection`)."""
        if self._borrow is None:
            async with self._conn_lock:
                self._check_writable()
                yield self.conn  # type: ignore[misc]
            return
        tries = 1
        if fresh:
            size = getattr(self._source, "max_size", None)
            tries = size + 1 if isinstance(size, int) and size > 0 else 5
        for _ in range(tries):
            source = self._borrow()
            if inspect.isawaitable(source):
                source = await source
            if not hasattr(source, "__aenter__"):
                raise TypeError("the connection source must hand out psycopg AsyncConnections "
                                "(a psycopg_pool.AsyncConnectionPool, or a function returning "
                                "an AsyncConnection)")
            async with source as conn:
                if not isinstance(conn, psycopg.AsyncConnection):
                    raise TypeError(f"the connection source handed out {type(conn).__name__}, "
                                    f"not a psycopg.AsyncConnection")
                if conn.closed or conn.broken or (fresh and not await _answers(conn)):
                    if fresh:
                        continue  # given back broken: the pool discards it
                    raise _NotSent("the connection source handed out a closed connection")
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    raise LedgerUsageError(None, None, "the connection source handed out a "
                                                       "connection inside a transaction")
                yield conn
                return
        raise psycopg.OperationalError(f"the connection source handed out no working "
                                       f"connection in {tries} tries")

    async def _pooled_rows(self, query: str, params: Tuple[Any, ...], *,
                           on_uncertain: Optional[Callable[[BaseException], None]] = None,
                           retry: bool = False, what: str = "a ledger statement",
                           ) -> Tuple[List[Dict[str, Any]], bool]:
        """One statement in a transaction of its own, and whether it was sent twice (see
        `Ledger._pooled_rows`: only idempotent statements are sent again)."""
        broke: List[BaseException] = []
        try:
            return (await self._pooled_once(query, params, on_uncertain, broke, what,
                                            fresh=False), False)
        except psycopg.OperationalError as exc:
            if not (retry and self._borrow is not None and (broke or isinstance(exc, _NotSent))):
                raise
            log.warning("%s: the connection broke before the reply (%s: %s); sending it once "
                        "more on a fresh connection", what, type(exc).__name__,
                        str(exc).strip().splitlines()[0] if str(exc).strip() else "")
            first = exc
        try:
            return await self._pooled_once(query, params, None, [], what, fresh=True), True
        except BaseException as again:
            if again.__context__ is None:
                again.__context__ = first
            raise

    async def _pooled_once(self, query: str, params: Tuple[Any, ...],
                           on_uncertain: Optional[Callable[[BaseException], None]],
                           broke: List[BaseException], what: str, *, fresh: bool,
                           ) -> List[Dict[str, Any]]:
        async with self._connection(fresh=fresh) as conn:
            try:
                return await _execute_on(conn, query, params, shared=self._borrow is None,
                                         what=what)
            except BaseException as exc:
                if not _refused_cleanly(exc, conn) and not _not_committed(exc):
                    broke.append(exc)
                    if on_uncertain is not None:
                        on_uncertain(exc)
                raise

    async def _pooled_one(self, query: str, params: Tuple[Any, ...], *,
                          on_uncertain: Optional[Callable[[BaseException], None]] = None,
                          retry: bool = False, what: str = "a ledger statement",
                          ) -> Dict[str, Any]:
        rows = (await self._pooled_rows(query, params, on_uncertain=on_uncertain, retry=retry,
                                        what=what))[0]
        assert len(rows) == 1, query
        return rows[0]


async def _answers(conn: "psycopg.AsyncConnection[Any]") -> bool:
    """Whether the connection answers an empty query (nothing of the ledger is sent)."""
    try:
        async with conn.lock:
            res = conn.pgconn.exec_(b"")
    except Exception:
        return False
    return conn.pgconn.status == ConnStatus.OK and res.status == ExecStatus.EMPTY_QUERY


async def _execute_on(conn: "psycopg.AsyncConnection[Any]", query: str,
                      params: Tuple[Any, ...], *, shared: bool,
                      what: str) -> List[Dict[str, Any]]:
    """One ledger statement on ``conn`` in a transaction of its own; its rows.  ``shared``:
    the AsyncLedger's single connection, whose transaction status is read with the reply
    (see the synchronous `_execute_on`)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        if shared:
            status = await _execute_and_status(conn, cur, query, params)
            if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                raise p.in_foreign_transaction(what, status)
            return await cur.fetchall()
        if conn.autocommit:
            await cur.execute(query, params, prepare=False)
            return await cur.fetchall()
        async with conn.transaction():
            await cur.execute(query, params, prepare=False)
            rows = await cur.fetchall()
        return rows


async def _execute_and_status(conn: "psycopg.AsyncConnection[Any]", cur: Any, query: str,
                              params: Tuple[Any, ...]) -> int:
    """``await cur.execute(query, params)`` and the transaction status right after its
    reply, under the connection's lock so that no other task's statement comes between."""
    execute_gen = getattr(cur, "_execute_gen", None)
    lock = getattr(conn, "lock", None)
    if execute_gen is None or lock is None:  # not psycopg 3.1/3.2: no atomic read
        await cur.execute(query, params, prepare=False)
        return conn.info.transaction_status
    try:
        async with lock:
            await conn.wait(execute_gen(query, params, prepare=False))
            return conn.pgconn.transaction_status
    except psycopg.Error as exc:
        raise exc.with_traceback(None)
