"""What a tool's ``reconcile`` function returns: the provider's own record of an effect
whose outcome the ledger does not know (a worker was lost mid-call).

    def lookup(downstream_key, args):
        payment = bank.find_payment(idempotency_key=downstream_key)
        if payment is not None:
            return Happened(payment)             # completed: the record is its result
        if bank.has_no_request(idempotency_key=downstream_key):
            return NotHappened({"lookup": "no payment with that key"})  # made again
        return None                              # the provider cannot tell: a person

A ledger calls it for a paused effect of the tool whose outcome is unknown, once an admin
made the tool reconcilable (``set_reconcile``), and records the answer
(``reconcile_effect``) before the call goes on: a completion replays, a "did not happen"
executes the next attempt under a new provider key.  None, an exception, or an answer
given before the tool's grace has passed leave the pause for a person (`EffectPaused`).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, NamedTuple, Optional, Union

__all__ = ["Happened", "NotHappened", "Finding", "Reconcile", "AsyncReconcile"]


class Happened(NamedTuple):
    """The provider's record shows the effect happened: ``evidence`` (that record,
    JSON-serialisable) becomes its result."""
    evidence: Any


class NotHappened(NamedTuple):
    """The provider has no record of it: ``evidence`` (its answer, JSON-serialisable)
    becomes the attempt's error, and the call is made again as the next attempt."""
    evidence: Any


Finding = Union[Happened, NotHappened]
#: ``reconcile(downstream_key, args)``: the provider's record, or None when it cannot tell.
Reconcile = Callable[[str, Any], Optional[Finding]]
#: The same for `AsyncLedger`: it may return an awaitable.
AsyncReconcile = Callable[[str, Any], Union[Optional[Finding], Awaitable[Optional[Finding]]]]
