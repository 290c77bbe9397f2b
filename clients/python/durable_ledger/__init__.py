"""durable_ledger: at-most-once side effects for agents and workers (psycopg 3 client).

    import psycopg
    from durable_ledger import Ledger, EffectDidNotHappen

    ledger = Ledger(psycopg.connect(dsn, autocommit=True))

    @ledger.tool("bank.pay")
    def pay(args, idempotency_key):
        return bank.pay(args["invoice"], args["amount"], idempotency_key=idempotency_key)

    with ledger.attempt(run_id):
        receipt = pay(run_id, {"invoice": "INV-9", "amount": 4200})

On a pool of connections, or behind PgBouncer in transaction mode, build the Ledger on
the pool (the tools are decorated the same way) and run each attempt under a token lease,
renewed in the background; a lost lease raises LeaseLost:

    ledger = Ledger(psycopg_pool.ConnectionPool(dsn, kwargs={"autocommit": True}))
    with ledger.token_attempt(run_id, ttl=60):
        receipt = pay(run_id, {"invoice": "INV-9", "amount": 4200})

In asyncio, `AsyncLedger` has the same names, awaited, on a `psycopg.AsyncConnection` or
a `psycopg_pool.AsyncConnectionPool` (`async with ledger.token_attempt(run_id):`).

Run it twice (a crash, a redelivery, an LLM calling the tool again on replay) and the
bank is paid once: the second time the recorded receipt is returned.  See README.md next
to this package and the SQL contract of the extension.
"""

from .errors import (
    AttemptStopped,
    DivergencePaused,
    AwaitingApproval,
    BudgetExhausted,
    EffectDidNotHappen,
    EffectFailed,
    EffectInProgress,
    EffectPaused,
    LeaseLost,
    PoolerDetected,
    LedgerError,
    LedgerUsageError,
    OutcomeNotRecorded,
    RunAbandoned,
    RunBusy,
    ToolRefused,
    LedgerRefused,
    InvalidArgument,
    BusinessKeyConflict,
    NotFound,
    RunExists,
    WrongState,
    ConcurrentChange,
    ReadOnlyLedger,
    TooManyLeases,
    PermissionDenied,
)
from .aio import (AsyncLedger, AsyncPerform, AsyncTokenLease, AsyncTool, AsyncToolDecorator,
                  AsyncToolFunction)
from .ledger import Ledger, Perform, TokenLease, Tool, ToolFunction, side_effect
from .outcomes import AsyncReconcile, Finding, Happened, NotHappened, Reconcile
from ._protocol import CallKey, call_key

__version__ = "1.3.0"

# Written out, not built from errors.__all__: mypy --strict reads only a literal list
# (test/apps/032 type-checks a user module that imports every name).
__all__ = [
    "Ledger",
    "call_key",
    "CallKey",
    "TokenLease",
    "AsyncLedger",
    "AsyncTokenLease",
    "AsyncPerform",
    "AsyncToolFunction",
    "AsyncTool",
    "AsyncToolDecorator",
    "side_effect",
    "Perform",
    "ToolFunction",
    "Tool",
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
    "Happened",
    "NotHappened",
    "Finding",
    "Reconcile",
    "AsyncReconcile",
]
