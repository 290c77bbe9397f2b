"""The exceptions of the durable_ledger client.

Every exception the client raises about an effect derives from `LedgerError`, which
carries the effect's `key`, the ledger's `decision` and a one-sentence `reason`, so that a
caller (or the person paged about it) can look the effect up in
`durable_ledger.effects` / `durable_ledger.unresolved` without parsing a message.

What each one means for the caller:

=====================  ============================  ====================================
exception              did the effect happen?        what to do
=====================  ============================  ====================================
`EffectFailed`         no (now, or replayed)          handle the failure; to try again,
                                                     call again (the next occurrence)
`EffectPaused`         unknown                       stop the run; a person resolves the
                                                     effect, then start a new attempt
`DivergencePaused`     not performed; it may be an   stop the run; a person decides with
(an `EffectPaused`)    earlier effect again, with    ``resolve_divergence`` (same or
                       drifted args                  distinct), then start a new attempt
`AwaitingApproval`     not performed: the call       stop the run; an approver decides
(an `EffectPaused`)    needs an approver's approval  (``approve_effect`` or
                       (``set_approval``)            ``reject_effect``), then a new attempt
`AttemptStopped`       a recorded call (`record`)    end the attempt and start a new
                       of this attempt raised or     one: it makes the call again (no
                       was lost; nothing recorded    person)
`EffectInProgress`     being done elsewhere now      ask again later (same call)
`OutcomeNotRecorded`   performed (or declared not)   stop the run; the next attempt
                       but the ledger has not        pauses until a person resolves it
                       recorded it                   (for `record`: makes the call
                                                     again); `result`/`error` say what
                                                     happened
`RunBusy`              not attempted                 another worker holds the run
`LeaseLost`            a call in flight was          stop the attempt; a new one
                       reported; nothing more was    (``token_attempt``) replays what
                       begun                         was completed
`PoolerDetected`       not performed, nothing        a transaction pooler is between
(a `LeaseLost`)        called: the call reached      client and database: use
                       another server connection     ``token_attempt`` (or connect
                       than the attempt's            directly / pool_mode = session)
`RunAbandoned`         not performed, nothing        stop the attempt and do NOT retry
                       recorded: a person abandoned  the run (fork it into a new run
                       the run (55L02)               to redo part of it)
`ToolRefused`          not performed, nothing        stop the attempt; an admin registers
                       recorded: the tool is         the tool (again), then a new attempt
                       retired or not registered     may call it
                       (55L03)
`LedgerUsageError`     not attempted                 fix the calling code
`LedgerRefused`        not attempted: the ledger     see its subclass (below): fix the
(and its subclasses)   refused the statement and     call, retry it, or ask an admin
                       wrote nothing
=====================  ============================  ====================================

Every error of a ledger statement whose SQLSTATE is in the ledger's list
(docs/reference.md, "Errors") comes as one of these, with the psycopg error as its
``__cause__``: 55P03 `RunBusy` (a lease wait that timed out names the holder), 55L01
`LeaseLost`, 55L02 `RunAbandoned`, 55L03 `ToolRefused`, and the `LedgerRefused` family --
22004/22023 `InvalidArgument`, 23505 `BusinessKeyConflict`, 42704 `NotFound`, 42710
`RunExists`, 55000 `WrongState` (also a session lease lost behind the ledger's back:
start a new attempt), 40001 `ConcurrentChange` (retry the call), 25006 `ReadOnlyLedger`
(a standby), 53400 `TooManyLeases`, 42501 `PermissionDenied`.  Errors of your own
functions (``perform``) are never translated.

`EffectDidNotHappen` is not a `LedgerError`: it is what *your* side-effecting function
raises to tell the client that the downstream system definitively refused the call.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "LedgerError",
    "EffectFailed",
    "EffectPaused",
    "DivergencePaused",
    "AwaitingApproval",
    "BudgetExhausted",
    "AttemptStopped",
    "EffectInProgress",
    "OutcomeNotRecorded",
    "RunBusy",
    "LeaseLost",
    "PoolerDetected",
    "RunAbandoned",
    "ToolRefused",
    "LedgerUsageError",
    "LedgerRefused",
    "InvalidArgument",
    "BusinessKeyConflict",
    "NotFound",
    "RunExists",
    "WrongState",
    "ConcurrentChange",
    "ReadOnlyLedger",
    "TooManyLeases",
    "PermissionDenied",
    "EffectDidNotHappen",
]


class LedgerError(Exception):
    """Base class: the ledger answered something other than a plain result.

    Attributes, always present (None where they do not apply):

    - ``key``: the effect's idempotency key (the primary key of ``durable_ledger.effects``);
    - ``decision``: what ``begin_effect`` answered (``execute``, ``replay``, ``pause``,
      ``in_progress``), or None when the ledger was not asked;
    - ``reason``: one human-readable sentence, usually the ledger's own.
    """

    def __init__(self, key: Optional[str], decision: Optional[str], reason: str) -> None:
        self.key = key
        self.decision = decision
        self.reason = reason
        super().__init__(self._message())

    def _message(self) -> str:
        if self.key is None:
            return self.reason
        return f"{self.reason} (key {self.key})"


class EffectFailed(LedgerError):
    """The effect did not happen; ``error`` is the recorded error (JSON, may be None).

    ``replayed`` is False when the downstream refused it just now (your function raised
    `EffectDidNotHappen` and the failure was recorded), True when an earlier attempt's
    recorded failure is replayed.  A derived key replays its failure on every later attempt
    so that a replayed run sees the same outcomes as the original; to try the operation
    again, call the tool again: that is the next occurrence, with a key of its own.
    """

    def __init__(self, key: str, decision: str, reason: str, error: Any, replayed: bool) -> None:
        self.error = error
        self.replayed = replayed
        super().__init__(key, decision, reason)

    def _message(self) -> str:
        return f"{self.reason}: {self.error!r} (key {self.key})"


class EffectPaused(LedgerError):
    """The outcome of an earlier attempt at this effect is unknown: it must not be performed.

    The run must stop.  A person (or a reconciler asking the downstream system with
    ``key``) calls ``durable_ledger.resolve_effect``; the next attempt then replays the
    decision.  The client also raises it, without asking the database, for every further
    call on the same run in the same attempt (see `Ledger.guarded`): after a pause, an
    identical call in the same attempt would be the *next* occurrence and would execute.

    ``downstream_key`` is the key the provider was given (``key``, or ``key#attempt`` for
    a business key): what a reconciler asks the provider about; None when the client
    stopped the run without asking the database.
    """

    downstream_key: Optional[str] = None


class AwaitingApproval(EffectPaused):
    """This call needs an approver's approval before it executes: not performed.

    An admin made calls like this one (its tool, args matching a condition) wait for a
    person (``durable_ledger.set_approval``).  ``begin_effect`` recorded the call's intent
    with status ``awaiting_approval`` and answered ``pause``; ``durable_ledger.unresolved``
    lists it and the ledger notified ``durable_ledger_attention``.  The run stops, as on
    any pause (it is an `EffectPaused`).  An approver -- a member of
    ``durable_ledger_approver``, never the role that made the call -- decides with
    ``durable_ledger.approve_effect(key, approved_by, note)``: the next attempt's same
    call then executes, once; or with ``reject_effect``: it replays as `EffectFailed`.
    The approval is of exactly these args: a call with other args asks for its own.
    """


class BudgetExhausted(EffectPaused):
    """A budget the ledger holds stops this call: not performed, and nothing recorded
    for it but the pause (extension 1.3).

    An admin gave the call's tool a budget per run (``durable_ledger.set_budget``: at
    most N executions, or M within a window), or every run a budget of attempts
    (``set_attempts_budget``), and this call would pass it: a loop that calls again and
    again -- each call reworded, so each one new to the ledger -- stops here.
    ``begin_effect`` answered ``pause`` with a reason that begins ``budget:`` and names
    the budget and the count; ``durable_ledger.unresolved`` lists it and the ledger
    notified ``durable_ledger_attention``.  The run stops, as on any pause (it is an
    `EffectPaused`).  A person raises the run's budget
    (``durable_ledger.set_run_budget``) -- the next attempt's call then executes -- or
    abandons the run.  ``run`` and ``tool`` name the call.
    """

    def __init__(self, key: str, reason: str, *, run: str, tool: str) -> None:
        self.run = run
        self.tool = tool
        super().__init__(key, "pause", reason)


class DivergencePaused(EffectPaused):
    """This call diverges from the run's earlier attempts: it may be an effect they
    recorded, made again with drifted arguments (the model reworded a memo, rounded an
    amount).  Not performed, and nothing was recorded for it.

    ``begin_effect`` answered ``pause`` with no status: the call's tool is registered with
    the divergence policy ``pause``, this is a later attempt of the run, and the call
    would have executed (its key is new) while an effect of the tool that an earlier
    attempt recorded has not been replayed by this attempt yet.  The ledger lists it in
    ``durable_ledger.unresolved`` (``may_duplicate`` names that earlier effect; ``reason``
    names it too).

    The run must stop, as on any pause (it is an `EffectPaused`, so handlers of pauses
    catch it): every further call of the attempt raises `EffectPaused` without asking the
    database.  A person decides with ``durable_ledger.resolve_divergence(key, 'same' |
    'distinct', resolved_by, note)``: ``same`` -- the call is that earlier effect, and the
    next attempt gets its recorded outcome instead of performing it; ``distinct`` -- it is
    a new operation, and the next attempt executes it.

    ``key`` is the drifted call's own key (the one to pass to ``resolve_divergence``);
    ``run`` and ``tool`` name the call; ``reason`` is the ledger's sentence.
    """

    def __init__(self, key: str, reason: str, *, run: str, tool: str) -> None:
        self.run = run
        self.tool = tool
        super().__init__(key, "pause", reason)


class AttemptStopped(LedgerError):
    """This attempt at the run has stopped, and the next one needs no person.

    A recorded call (`Ledger.record`) raised or was cancelled: nothing was recorded, and
    this attempt must not go on -- a retry of the call inside it would act on an answer
    that a replay, which makes the lost call again first, may not get.  Raised, without
    asking the database, for every further call on the run in this attempt.  End the
    attempt and start a new one (the usual retry loop): it replays what was done and
    makes the call again.
    """


class EffectInProgress(LedgerError):
    """Another live worker is performing this very effect (a shared ``business_key``).

    Not performed here.  Ask again later with the same call; the answer will then be a
    replay of its outcome (or a pause, if that worker died without reporting).
    """


class OutcomeNotRecorded(LedgerError):
    """Your function returned (or raised `EffectDidNotHappen`) but the ledger did not record it.

    Either the report could not be written (the connection broke, the result is not
    JSON-serialisable) or the ledger found it contradicting its record (a ``conflict``:
    then the effect is flagged and listed in ``durable_ledger.unresolved``) -- also when
    the report was on an attempt of a business key that a later attempt had replaced
    meanwhile (a completion of a replaced attempt: it may have happened twice).  The effect
    stays unrecorded; the run must stop, and its next attempt pauses until a person
    resolves it -- ``result`` (for a completion) or ``error`` (for a refusal) holds what
    your function reported, for that person.
    """

    def __init__(self, key: str, reason: str, *, result: Any = None, error: Any = None) -> None:
        self.result = result
        self.error = error
        super().__init__(key, "execute", reason)


class RunBusy(LedgerError):
    """Another worker holds the run's lease and the caller asked not to wait.

    Raised by ``attempt(run, wait=False)`` when another session holds the run, and by
    ``token_attempt(run)`` when a live lease of either kind holds it (``take_lease``
    never waits).  Also when a wait for the lease ended (SQLSTATE 55P03: after
    ``lock_timeout``, else ``durable_ledger.lease_wait_timeout``, 5 s by default), or a
    session lease was asked of a run a token lease holds: then ``sqlstate`` is set, and
    ``detail`` names the holder (its backend, application and since when).
    """

    sqlstate: Optional[str] = None
    detail: Optional[str] = None
    hint: Optional[str] = None


class LeaseLost(LedgerError):
    """The lease of this attempt is gone.

    A token lease expired, was broken by an admin, released or superseded (SQLSTATE 55L01
    from ``begin_effect`` or ``renew_lease``); or a session lease was dropped behind the
    ledger's back on the attempt's own connection (``DISCARD ALL``,
    ``pg_advisory_unlock_all()``: the call found that its session holds no lease of the
    run, and called nothing); or the call belongs to an attempt whose block has ended.

    The attempt must stop: from the moment the client knows, no further call of the
    attempt goes out (every one raises this again without asking the database), and
    ``token_attempt`` raises it at its end if the body did not.  Nothing is lost: a call
    that was in flight when the lease went had its outcome reported (a report needs no
    lease), a call refused for the lease wrote nothing, and the next attempt replays
    everything that was completed.  Another worker may hold the run by now.

    ``run`` and ``epoch`` name the attempt (the lease epoch) that was lost (``epoch`` None
    where the client does not know it); ``key`` is None (the loss is the lease's, not an
    effect's); ``reason`` says what happened.
    """

    def __init__(self, run: str, epoch: Optional[int], reason: str) -> None:
        self.run = run
        self.epoch = epoch
        super().__init__(None, None, reason)


class PoolerDetected(LeaseLost):
    """A call of a session attempt (``attempt()``, ``acquire_run()``) reached another
    server connection than the one whose session holds the attempt's lease, or one whose
    session another attempt took over: a transaction pooler (PgBouncer with ``pool_mode =
    transaction``, a pooled endpoint) is between the client and the database.

    Found out in the very statement that would have begun the call: nothing was called,
    recorded or performed.  The attempt stops (a `LeaseLost`: every further call raises it
    again without asking the database), and its end releases the lease where it was taken
    (``release_attempt``) so that no other client of the pooler meets the lock.  A session
    lease belongs to one server connection for the whole attempt; behind a transaction
    pooler run the attempt with ``token_attempt`` (or connect directly, or through
    ``pool_mode = session``).

    ``run`` and ``epoch`` name the attempt; ``pid`` is the server process that holds its
    lease, ``reached_pid`` the one the call reached, and ``reached_epoch`` the epoch of the
    run that the reached session holds (None: none).
    """

    def __init__(self, run: str, epoch: Optional[int], reason: str, *, pid: Optional[int],
                 reached_pid: Optional[int], reached_epoch: Optional[int]) -> None:
        self.pid = pid
        self.reached_pid = reached_pid
        self.reached_epoch = reached_epoch
        super().__init__(run, epoch, reason)


class RunAbandoned(LedgerError):
    """A person abandoned the run (``durable_ledger.abandon_run``): SQLSTATE 55L02 from
    ``begin_effect``, ``acquire_run`` or ``take_lease``.

    Nothing was performed and nothing was written for this call.  The attempt stops: every
    further call of it raises `RunAbandoned` again without asking the database, and a new
    attempt (``attempt``, ``acquire_run``, ``token_attempt``) raises it at its start.  **Do
    not retry the run**: it is stopped for good.  Drop the job (or tell whoever queued it);
    to redo part of the run, an admin forks it into a new run (``durable_ledger.fork_run``)
    and the new run is what gets retried.  Effects the run left in flight wait for a person
    in ``durable_ledger.unresolved``.

    ``run`` names the run; ``key`` and ``decision`` are None; ``reason`` is the ledger's
    message (who abandoned it, and when).
    """

    def __init__(self, run: str, reason: str) -> None:
        self.run = run
        super().__init__(None, None, reason)


class ToolRefused(LedgerError):
    """The ledger refuses to execute the tool: SQLSTATE 55L03 from ``begin_effect``.

    The tool is retired (``durable_ledger.retire_tool``), or nobody registered it and the
    database runs with `the ledger refuses tools nobody registered (`set_unregistered_tools('refuse', …)`)`.  Nothing was
    recorded and nothing was performed (the occurrence is not used up).

    The attempt stops: the run cannot make that call, so its plan cannot go on as it was.
    Every further call of the attempt raises `EffectPaused` (``key`` None, the refusal in
    its ``reason``) without asking the database.  An admin registers the tool (again) with
    ``durable_ledger.register_tool``, or the run is changed so that it no longer calls it;
    then a new attempt may go on.  (What a retired tool recorded earlier still replays:
    only a call that would execute is refused.)

    ``run`` and ``tool`` name the call; ``key`` and ``decision`` are None; ``reason`` is
    the ledger's message.
    """

    def __init__(self, run: str, tool: str, reason: str) -> None:
        self.run = run
        self.tool = tool
        super().__init__(None, None, reason)


class LedgerUsageError(LedgerError):
    """The client was used in a way that could break at-most-once (e.g. not autocommit)."""


class LedgerRefused(LedgerError):
    """A ledger function refused the statement; nothing was written (every error of the
    ledger rolls its statement back).  ``sqlstate``, and the server's ``detail`` and
    ``hint`` (None when it gave none), which the message includes; ``reason`` is the
    server's message.  The psycopg error is ``__cause__``."""

    def __init__(self, sqlstate: str, reason: str, *, detail: Optional[str] = None,
                 hint: Optional[str] = None) -> None:
        self.sqlstate = sqlstate
        self.detail = detail
        self.hint = hint
        super().__init__(None, None, reason)

    def _message(self) -> str:
        return "".join([f"{self.reason} (SQLSTATE {self.sqlstate})",
                        f"\nDETAIL: {self.detail}" if self.detail else "",
                        f"\nHINT: {self.hint}" if self.hint else ""])


class InvalidArgument(LedgerRefused):
    """22004, 22023: a NULL where a value is required, or a value out of its domain (an
    empty run, a ttl outside 1 s to 1 day, ...).  Fix the call."""


class BusinessKeyConflict(LedgerRefused):
    """23505: a business key that exists was begun with another tool or other args (or a
    tool registered twice).  A business key names one operation: a legitimately new
    operation needs a key of its own (e.g. the invoice number and a revision)."""


class NotFound(LedgerRefused):
    """42704: the key, tool, run or divergence named is not in the ledger."""


class RunExists(LedgerRefused):
    """42710: ``fork_run`` into a run the ledger has seen."""


class WrongState(LedgerRefused):
    """55000: the object is not in the state the call needs -- a session lease lost behind
    the ledger's back (``DISCARD ALL``, a pooler's reset: stop, and start a new attempt; a
    session attempt of this client finds that out before it calls, and raises `LeaseLost`),
    an effect already decided, a retired tool, the library newer than the extension's SQL
    objects (``ALTER EXTENSION durable_ledger UPDATE``)."""


class ConcurrentChange(LedgerRefused):
    """40001: under REPEATABLE READ or SERIALIZABLE, a concurrent change; retry the call."""


class ReadOnlyLedger(LedgerRefused):
    """25006: a writing call on a hot standby or in a read-only transaction."""


class TooManyLeases(LedgerRefused):
    """53400: more leases in one session than ``durable_ledger.max_leases_per_session``;
    release runs that are over."""


class PermissionDenied(LedgerRefused):
    """42501: the role lacks a grant: workers need ``durable_ledger_worker``, auditors
    ``durable_ledger_auditor``, people who resolve and break leases
    ``durable_ledger_admin`` (``GRANT durable_ledger_worker TO your_role``)."""


class EffectDidNotHappen(Exception):
    """Raise this from a side-effecting function when the downstream API *definitively*
    refused the call before changing anything (a 4xx validation error, "insufficient
    funds", ...).  ``error`` (JSON-serialisable, may be None) is recorded with
    ``fail_effect`` and the caller gets `EffectFailed`.

    Raise it only when you know nothing happened.  Any other exception (a time-out, a
    dropped connection, a 5xx) leaves the outcome unknown, which is the safe default: the
    ledger never guesses.
    """

    def __init__(self, error: Any = None) -> None:
        self.error = error
        super().__init__(error)
