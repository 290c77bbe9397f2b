#!/usr/bin/python3
"""An agent loop whose side-effecting tools go through durable_ledger.

A small accounts-payable "agent" (no LLM: a deterministic planner) works through an
inbox of invoices with three tools:

- ``lookup_invoice`` -- read-only: reads the books.  Not decorated: it bypasses the
  ledger, since reading twice harms nobody;
- ``pay_invoice``    -- side-effecting: pays through a (fake) bank;
- ``send_email``     -- side-effecting: sends through a (fake) mail server.

The bank and the mail server are in-memory fakes that do NOT deduplicate anything: every
call they receive is a payment or an email, as with a downstream API that ignores
idempotency keys.  The example runs the agent twice on the same run id, each time on a
new connection, the way a worker restarted after a crash (or a redelivered queue message)
would run it.  The first attempt performs the effects; the second performs none: every
side-effecting call is answered from the ledger, including the bank's refusal of one
payment, so the agent takes exactly the same path.

    /usr/bin/python3 clients/python/examples/agent_loop.py --dsn "dbname=postgres"

With ``--token-lease`` each attempt runs on a pool of connections (psycopg_pool) under a
token lease instead of a session lease: every ledger call may use another connection, so
the DSN may point at PgBouncer in transaction mode:

    /usr/bin/python3 clients/python/examples/agent_loop.py --token-lease \
        --dsn "host=127.0.0.1 port=6432 dbname=app user=agent"

The role needs durable_ledger_worker.  Exit status 0 when the second attempt performed
nothing and every downstream system got each effect exactly once.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import uuid
from typing import Any, Dict, List

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from durable_ledger import EffectDidNotHappen, EffectFailed, Ledger  # noqa: E402


# --------------------------------------------------------------------------
# The outside world: books (read-only), a bank and a mail server (side effects).
# --------------------------------------------------------------------------

BOOKS: Dict[str, Dict[str, Any]] = {
    "INV-101": {"vendor": "Acme Paper", "amount": 420.00, "email": "billing@acme.example",
                "status": "due", "account": "DE89 3704 0044 0532 0130 00"},
    "INV-102": {"vendor": "Globex", "amount": 1250.50, "email": "ar@globex.example",
                "status": "due", "account": "CLOSED-ACCOUNT"},
    "INV-103": {"vendor": "Initech", "amount": 99.00, "email": "ap@initech.example",
                "status": "paid", "account": "FR14 2004 1010 0505 0001 3M02 606"},
}


class FakeBank:
    """Pays whatever it is asked to pay: no deduplication (that is the ledger's job)."""

    def __init__(self) -> None:
        self.payments: List[Dict[str, Any]] = []
        self.refusals: List[Dict[str, Any]] = []
        self._ids = itertools.count(1)

    def transfer(self, account: str, amount: float, reference: str,
                 idempotency_key: str) -> Dict[str, Any]:
        if account.startswith("CLOSED"):
            self.refusals.append({"reference": reference, "idempotency_key": idempotency_key})
            raise ValueError("account closed")
        payment = {"payment_id": f"pay-{next(self._ids)}", "amount": amount, "reference": reference}
        self.payments.append(dict(payment, idempotency_key=idempotency_key))
        return payment


class FakeMailServer:
    """Sends every message it is given."""

    def __init__(self) -> None:
        self.outbox: List[Dict[str, Any]] = []

    def send(self, to: str, subject: str, idempotency_key: str) -> Dict[str, Any]:
        message_id = f"msg-{len(self.outbox) + 1}"
        self.outbox.append({"message_id": message_id, "to": to, "subject": subject,
                            "idempotency_key": idempotency_key})
        return {"message_id": message_id}


BANK = FakeBank()
MAIL = FakeMailServer()


def downstream_calls() -> int:
    return len(BANK.payments) + len(BANK.refusals) + len(MAIL.outbox)


# --------------------------------------------------------------------------
# The tools.
# --------------------------------------------------------------------------

def lookup_invoice(invoice: str) -> Dict[str, Any]:
    """Read-only: not decorated, so it never touches the ledger."""
    return dict(BOOKS[invoice])


def make_tools(ledger: Ledger) -> Dict[str, Any]:
    """The side-effecting tools, bound to this attempt's ledger connection."""

    @ledger.tool("bank.pay")
    def pay_invoice(args: Dict[str, Any], idempotency_key: str) -> Dict[str, Any]:
        try:
            return BANK.transfer(args["account"], args["amount"], args["invoice"],
                                 idempotency_key=idempotency_key)
        except ValueError as refusal:  # the bank refused before moving any money
            raise EffectDidNotHappen({"code": "refused", "message": str(refusal)}) from refusal

    @ledger.tool("mail.send")
    def send_email(args: Dict[str, Any], idempotency_key: str) -> Dict[str, Any]:
        return MAIL.send(args["to"], args["subject"], idempotency_key=idempotency_key)

    return {"pay_invoice": pay_invoice, "send_email": send_email}


# --------------------------------------------------------------------------
# The agent: a deterministic planner over the inbox.
# --------------------------------------------------------------------------

def show(tool: str, what: str, verdict: str, detail: Any) -> None:
    if not isinstance(detail, str):
        detail = json.dumps(detail, sort_keys=True)
    print(f"  {tool:<15} {what:<24} {verdict:<32} {detail}", flush=True)


def call(tools: Dict[str, Any], name: str, run: str, args: Dict[str, Any], what: str) -> Any:
    """One side-effecting tool call; prints whether it was performed or answered by the ledger.

    Returns the result, or None when the effect failed (now or replayed).
    """
    before = downstream_calls()
    try:
        result = tools[name](run, args)
    except EffectFailed as failed:
        verdict = ("failure replayed (not performed)" if failed.replayed
                   else "REFUSED downstream, recorded")
        show(name, what, verdict, failed.error)
        return None
    performed = downstream_calls() > before
    show(name, what, "EXECUTED" if performed else "replayed (not performed)", result)
    return result


def agent(tools: Dict[str, Any], run: str, inbox: List[str]) -> None:
    for invoice in inbox:
        facts = lookup_invoice(invoice)
        show("lookup_invoice", invoice, "read-only (no ledger)",
             f"{facts['status']}, {facts['amount']:.2f} to {facts['vendor']}")
        if facts["status"] != "due":
            continue
        receipt = call(tools, "pay_invoice", run,
                       {"invoice": invoice, "amount": facts["amount"], "account": facts["account"]},
                       f"{invoice} {facts['amount']:.2f}")
        if receipt is not None:
            subject = f"{invoice} paid: {receipt['payment_id']}"
        else:
            subject = f"{invoice} could not be paid; please send new bank details"
        call(tools, "send_email", run, {"to": facts["email"], "subject": subject}, facts["email"])


def attempt(dsn: str, run: str, inbox: List[str], title: str) -> int:
    """One attempt on a connection of its own; returns how many downstream calls it made."""
    before = downstream_calls()
    with psycopg.connect(dsn, autocommit=True, application_name="agent-loop-example") as conn:
        ledger = Ledger(conn)
        print(f"== {title} (connection pid {conn.info.backend_pid})", flush=True)
        with ledger.attempt(run):
            agent(make_tools(ledger), run, inbox)
    performed = downstream_calls() - before
    print(f"   downstream calls made in this attempt: {performed}", flush=True)
    return performed


def token_attempt(dsn: str, run: str, inbox: List[str], title: str) -> int:
    """One attempt under a token lease, on a pool of its own (a restarted worker's)."""
    from psycopg_pool import ConnectionPool  # Debian: python3-psycopg-pool

    before = downstream_calls()
    # prepare_threshold=None: no prepared statements, which PgBouncer's transaction mode
    # cannot carry from one transaction to the next (the ledger's own calls never prepare).
    with ConnectionPool(dsn, min_size=2, max_size=4, kwargs={
            "autocommit": True, "prepare_threshold": None,
            "application_name": "agent-loop-example"}) as pool:
        ledger = Ledger(pool)
        with ledger.token_attempt(run, ttl=30, holder="agent-loop-example") as lease:
            print(f"== {title} (token lease, epoch {lease.epoch})", flush=True)
            agent(make_tools(ledger), run, inbox)
    performed = downstream_calls() - before
    print(f"   downstream calls made in this attempt: {performed}", flush=True)
    return performed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="libpq connection string")
    parser.add_argument("--run", default=None, help="run id (default: a new one)")
    parser.add_argument("--token-lease", action="store_true",
                        help="run each attempt on a connection pool under a token lease "
                             "(works through PgBouncer in transaction mode)")
    options = parser.parse_args()
    one_attempt = token_attempt if options.token_lease else attempt
    run = options.run or f"agent-demo-{uuid.uuid4().hex[:12]}"
    inbox = ["INV-101", "INV-102", "INV-103"]

    print(f"run {run}: an agent pays its inbox {inbox}", flush=True)
    first = one_attempt(options.dsn, run, inbox, "attempt 1: the agent works through its inbox")
    second = one_attempt(options.dsn, run, inbox,
                         "attempt 2: the worker restarts and runs the same agent again")

    print(f"== downstream after both attempts: bank payments {len(BANK.payments)}, "
          f"bank refusals {len(BANK.refusals)}, emails sent {len(MAIL.outbox)}")
    keys = [p["idempotency_key"] for p in BANK.payments] + [m["idempotency_key"] for m in MAIL.outbox]
    ok = second == 0 and len(keys) == len(set(keys)) and downstream_calls() == first
    print("ok - the replayed attempt performed nothing; every effect happened once" if ok
          else "not ok - an effect was performed twice")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
