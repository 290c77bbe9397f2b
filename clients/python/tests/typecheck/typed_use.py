"""Typed use of durable_ledger, checked with ``mypy --strict`` (test/apps/032): what a
user's code writes type-checks, and the types it sees are the tools' own results.  Never
run; it only defines functions."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Dict, List, Optional, TypedDict

import psycopg

from durable_ledger import (AsyncLedger, AsyncTool, DivergencePaused, EffectPaused, Ledger,
                            LeaseLost, PoolerDetected, Tool, side_effect)


class Receipt(TypedDict):
    payment_id: str
    amount: int


def sync_agent(conn: "psycopg.Connection[Any]", run: str) -> int:
    ledger = Ledger(conn)

    @ledger.tool("bank.pay")
    def pay_invoice(args: Dict[str, Any], idempotency_key: str) -> Receipt:
        return {"payment_id": idempotency_key, "amount": int(args["amount"])}

    @side_effect(ledger, "mail.send")
    def send_email(args: Dict[str, Any], idempotency_key: str) -> Dict[str, str]:
        return {"sent": idempotency_key}

    tool: Tool[Receipt] = pay_invoice
    assert tool.tool == "bank.pay" and tool.ledger is ledger
    try:
        with ledger.attempt(run):
            receipt: Receipt = pay_invoice(run, {"invoice": "INV-9", "amount": 4200})
            note: str = ledger.record(run, "llm.note", receipt, lambda: f"paid {receipt['amount']}")
            sent: Dict[str, str] = send_email(run, {"body": note}, business_key=None, meta={"m": 1})
            count: int = ledger.guarded(run, "crm.note", {"n": 1}, lambda key: len(key))
            return receipt["amount"] + count + len(sent)
    except PoolerDetected as e:
        reached: Optional[int] = e.reached_pid
        logging.getLogger(__name__).error("use token_attempt: %s (%s)", e, reached)
    except (DivergencePaused, EffectPaused, LeaseLost):
        pass
    return 0


async def async_agent(conn: "psycopg.AsyncConnection[Any]", run: str) -> List[Any]:
    ledger = AsyncLedger(conn)

    @ledger.tool("bank.pay")
    async def pay(args: Dict[str, Any], idempotency_key: str) -> Receipt:
        await asyncio.sleep(0)
        return {"payment_id": idempotency_key, "amount": 1}

    @ledger.tool("books.count")
    def count(args: Any, idempotency_key: str) -> int:  # a plain function, too
        return 3

    tool: AsyncTool[Receipt] = pay

    async def model() -> str:
        return "hello"

    async def perform(key: str) -> Dict[str, Any]:
        return {"key": key}

    async with ledger.attempt(run):
        receipt: Receipt = await pay(run, {"amount": 1})
        n: int = await count(run, {})
        text: str = await ledger.record(run, "model", {"q": 1}, model)
        length: int = await ledger.record(run, "len", {"q": 1}, lambda: 5)
        done: Dict[str, Any] = await ledger.guarded(run, "t", {}, perform)
        flag: bool = await ledger.guarded(run, "u", {}, lambda key: True)
        both = await asyncio.gather(pay(run, {"amount": 2}), tool(run, {"amount": 3}))
        task: "asyncio.Task[Receipt]" = asyncio.create_task(pay(run, {"amount": 4}))
        return [receipt, n, text, length, done, flag, both, await task]
