"""Misuses of durable_ledger that ``mypy --strict --warn-unused-ignores`` must catch
(test/apps/032): every line marked ``# type: ignore[<code>]`` is an error mypy reports
with that code, and an ignore mypy finds unneeded (the misuse went unnoticed) fails the
check.  Never run; it only defines functions."""

from __future__ import annotations

from typing import Any, Dict

import psycopg

from durable_ledger import AsyncLedger, AsyncTool, Ledger, Tool


def sync_misuses(conn: "psycopg.Connection[Any]", run: str) -> None:
    ledger = Ledger(conn)

    @ledger.tool("bank.pay")
    def pay_invoice(args: Dict[str, Any], idempotency_key: str) -> Dict[str, Any]:
        return {"payment_id": idempotency_key}

    n: int = pay_invoice(run, {"invoice": "INV-9", "amount": 4200})  # type: ignore[assignment]
    wrong: Tool[int] = pay_invoice  # type: ignore[assignment]
    pay_invoice(run)  # type: ignore[call-arg]
    pay_invoice(run, {}, "INV-9")  # type: ignore[misc]
    result = ledger.guarded(run, "bank.pay", {}, lambda key: {"paid": key})
    paid: str = result  # type: ignore[assignment]
    answer = ledger.record(run, "model", {}, lambda: ["a", "b"])
    first: int = answer  # type: ignore[assignment]
    del n, wrong, paid, first


async def async_misuses(conn: "psycopg.AsyncConnection[Any]", run: str) -> None:
    ledger = AsyncLedger(conn)

    @ledger.tool("mail.send")
    async def send(args: Dict[str, Any], idempotency_key: str) -> Dict[str, str]:
        return {"sent": idempotency_key}

    @ledger.tool("books.count")
    def count(args: Any, idempotency_key: str) -> int:
        return 3

    async def perform(key: str) -> Dict[str, Any]:
        return {"key": key}

    async def model() -> str:
        return "hi"

    n: int = await send(run, {"to": "ap@example.com"})  # type: ignore[assignment]
    c: str = await count(run, {})  # type: ignore[assignment]
    wrong: AsyncTool[int] = send  # type: ignore[assignment]
    send(run, {})  # type: ignore[unused-coroutine]
    done = await ledger.guarded(run, "t", {}, perform)
    d: int = done  # type: ignore[assignment]
    said = await ledger.record(run, "model", {}, model)
    s: int = said  # type: ignore[assignment]
    del n, c, wrong, d, s
