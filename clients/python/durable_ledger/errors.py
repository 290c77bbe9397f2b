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
`EffectInProgress`     being done elsewhere now      ask again later (same call)
`OutcomeNotRecorded`   performed (or declared not)   stop the run; the next attempt
                       but the ledger has not        pauses until a person resolves it;
                       recorded it                   `result`/`error` say what happened
`RunBusy`              not attempted                 another worker holds the run
`LeaseLost`            a call in flight was          stop the attempt; a new one
                       reported; nothing more was    (``token_attempt``) replays what
                       begun                         was completed
`LedgerUsageError`     not attempted                 fix the calling code
=====================  ============================  ====================================

`EffectDidNotHappen` is not a `LedgerError`: it is what *your* side-effecting function
raises to tell the client that the downstream system definitively refused the call.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "LedgerError",
    "EffectFailed",
    "EffectPaused",
    "EffectInProgress",
    "OutcomeNotRecorded",
    "RunBusy",
    "LeaseLost",
    "LedgerUsageError",
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
    never waits).
    """


class LeaseLost(LedgerError):
    """The token lease of this attempt is gone: expired, broken by an admin, released or
    superseded (SQLSTATE 55L01 from ``begin_effect`` or ``renew_lease``).

    The attempt must stop: from the moment the client knows, no further call of the
    attempt goes out (every one raises this again without asking the database), and
    ``token_attempt`` raises it at its end if the body did not.  Nothing is lost: a call
    that was in flight when the lease went had its outcome reported (a report needs no
    lease), a ``begin_effect`` refused with 55L01 wrote nothing, and the next attempt
    (a new ``token_attempt``) replays everything that was completed.  Another worker may
    hold the run by now.

    ``run`` and ``epoch`` name the attempt (the lease epoch) that was lost; ``key`` is
    None (the loss is the lease's, not an effect's); ``reason`` is the ledger's message.
    """

    def __init__(self, run: str, epoch: Optional[int], reason: str) -> None:
        self.run = run
        self.epoch = epoch
        super().__init__(None, None, reason)


class LedgerUsageError(LedgerError):
    """The client was used in a way that could break at-most-once (e.g. not autocommit)."""


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
