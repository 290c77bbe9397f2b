#!/usr/bin/python3
"""An asyncio agent loop whose side-effecting tool calls go through durable_ledger.

The shape of an LLM agent, with a scripted stand-in for the model (no network): the model
reads the conversation and answers either with tool calls -- several at once, which the
agent runs in parallel, as a model's parallel tool calls are -- or with a final answer.
Its tools: ``lookup_invoice`` (read-only, not recorded), ``pay_invoice`` and
``send_email`` (side effects, through the ledger).  The bank and the mail server are
files that record every call they receive and deduplicate nothing, so that what happened
survives the worker.

The example runs the agent as a worker process that is killed (SIGKILL) in the middle of
its work, once the payments are made and before any email is sent, then runs a new worker on the same run id, as a queue that
redelivers the job would.  The model of the second worker asks for its parallel calls in
another order (as real models do): every call the first worker completed is replayed from
the ledger, the rest is performed, and the bank and the mail server see each effect once.

    /usr/bin/python3 clients/python/examples/async_agent.py --dsn "dbname=postgres"

Each attempt runs under a token lease on a ``psycopg_pool.AsyncConnectionPool`` (every call
may use another connection), so ``--dsn`` may point at PgBouncer in transaction mode.  The
killed worker's lease lives on until its ttl (5 s here) runs out: the new worker waits for
it (`RunBusy`), as a redelivered job would.  The role needs durable_ledger_worker.  Exit
status 0 when every effect happened exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from durable_ledger import AsyncLedger, EffectDidNotHappen, EffectFailed, RunBusy  # noqa: E402

BOOKS: Dict[str, Dict[str, Any]] = {
    "INV-201": {"vendor": "Acme Paper", "amount": 420.00, "email": "billing@acme.example",
                "account": "DE89 3704 0044 0532 0130 00"},
    "INV-202": {"vendor": "Globex", "amount": 1250.50, "email": "ar@globex.example",
                "account": "CLOSED-ACCOUNT"},
    "INV-203": {"vendor": "Initech", "amount": 99.00, "email": "ap@initech.example",
                "account": "FR14 2004 1010 0505 0001 3M02 606"},
}


# --------------------------------------------------------------------------
# The outside world: a bank and a mail server that remember every call (in files).
# --------------------------------------------------------------------------

class Downstream:
    """A downstream system that performs every call it gets: one JSON line per call."""

    def __init__(self, path: str) -> None:
        self.path = path

    def calls(self) -> List[Dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    async def call(self, **what: Any) -> Dict[str, Any]:
        await asyncio.sleep(random.uniform(0.01, 0.1))  # the network; replies in any order
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(what) + "\n")
        return {"id": f"{os.path.basename(self.path)[:4]}-{len(self.calls())}"}


# --------------------------------------------------------------------------
# The model: a script that reads the conversation, like a model would.
# --------------------------------------------------------------------------

class ScriptedModel:
    """Answers each turn from the conversation so far.  Parallel calls come in a random
    order (seeded per worker), as a real model's do from one run to its replay."""

    def __init__(self, seed: int) -> None:
        self.shuffle = random.Random(seed).shuffle

    async def respond(self, messages: List[Dict[str, Any]]) -> Dict[str, Any]:
        await asyncio.sleep(0.05)  # thinking
        results = {m["call"]: m["content"] for m in messages if m["role"] == "tool"}
        invoices = messages[0]["invoices"]
        # Turn 1: look every invoice up, in parallel.
        calls = [{"id": f"look-{i}", "tool": "lookup_invoice", "args": {"invoice": i}}
                 for i in invoices if f"look-{i}" not in results]
        if not calls:
            # Turn 2: pay every invoice, in parallel.
            calls = [{"id": f"pay-{i}", "tool": "pay_invoice",
                      "args": {"invoice": i, "amount": results[f"look-{i}"]["amount"],
                               "account": results[f"look-{i}"]["account"]}}
                     for i in invoices if f"pay-{i}" not in results]
        if not calls:
            # Turn 3: tell each vendor what happened, in parallel.
            calls = []
            for i in invoices:
                if f"mail-{i}" in results:
                    continue
                paid = results[f"pay-{i}"]
                subject = (f"{i} paid: {paid['id']}" if "error" not in paid
                           else f"{i} could not be paid: please send new bank details")
                calls.append({"id": f"mail-{i}", "tool": "send_email",
                              "args": {"to": results[f"look-{i}"]["email"], "subject": subject}})
        if not calls:
            return {"final": f"processed {len(invoices)} invoices"}
        self.shuffle(calls)
        return {"tool_calls": calls}


# --------------------------------------------------------------------------
# The agent: the usual loop, with the side-effecting tools through the ledger.
# --------------------------------------------------------------------------

class Agent:
    def __init__(self, ledger: AsyncLedger, run: str, bank: Downstream, mail: Downstream,
                 crash_after: Optional[int]) -> None:
        self.run, self.crash_after = run, crash_after

        @ledger.tool("bank.pay")
        async def pay_invoice(args: Dict[str, Any], idempotency_key: str) -> Dict[str, Any]:
            if args["account"].startswith("CLOSED"):  # refused before any money moved
                raise EffectDidNotHappen({"code": "account_closed"})
            return await bank.call(invoice=args["invoice"], amount=args["amount"],
                                   idempotency_key=idempotency_key)

        @ledger.tool("mail.send")
        async def send_email(args: Dict[str, Any], idempotency_key: str) -> Dict[str, Any]:
            return await mail.call(to=args["to"], subject=args["subject"],
                                   idempotency_key=idempotency_key)

        self.pay_invoice, self.send_email = pay_invoice, send_email

    async def dispatch(self, call: Dict[str, Any]) -> Dict[str, Any]:
        tool, args = call["tool"], call["args"]
        if tool == "lookup_invoice":  # read-only: straight to the books
            content: Dict[str, Any] = dict(BOOKS[args["invoice"]])
        elif tool == "pay_invoice":
            try:
                content = await self.pay_invoice(self.run, args)
            except EffectFailed as failed:  # now, or replayed from the first worker
                content = {"error": failed.error}
        else:
            content = await self.send_email(self.run, args)
        print(f"  {tool:<15} {json.dumps(args, sort_keys=True)[:60]:<62} -> "
              f"{json.dumps(content, sort_keys=True)[:50]}", flush=True)
        return {"role": "tool", "call": call["id"], "content": content}

    async def loop(self, model: ScriptedModel, invoices: List[str]) -> str:
        messages: List[Dict[str, Any]] = [{"role": "user", "invoices": invoices}]
        for turns in range(1, 100):
            if turns == self.crash_after:
                print(f"  worker {os.getpid()}: killed before turn {turns}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            turn = await model.respond(messages)
            if "final" in turn:
                return str(turn["final"])
            print(f"  model asks for {len(turn['tool_calls'])} calls at once: "
                  f"{[c['id'] for c in turn['tool_calls']]}", flush=True)
            messages += await asyncio.gather(*(self.dispatch(c) for c in turn["tool_calls"]))
        raise RuntimeError("the model never gave a final answer")


async def worker(dsn: str, run: str, state: str, crash_after: Optional[int]) -> None:
    """One worker's attempt at the run, on a pool of its own, under a token lease."""
    from psycopg_pool import AsyncConnectionPool  # Debian: python3-psycopg-pool

    async with AsyncConnectionPool(dsn, min_size=2, max_size=4, kwargs={
            "autocommit": True, "prepare_threshold": None,
            "application_name": "async-agent-example"}) as pool:
        ledger = AsyncLedger(pool)
        agent = Agent(ledger, run, Downstream(os.path.join(state, "bank")),
                      Downstream(os.path.join(state, "mail")), crash_after)
        while True:
            try:
                async with ledger.token_attempt(run, ttl=5, holder=f"worker-{os.getpid()}") as lease:
                    print(f"== worker {os.getpid()}: attempt (lease epoch {lease.epoch})", flush=True)
                    answer = await agent.loop(ScriptedModel(seed=os.getpid()), list(BOOKS))
                    print(f"  model: {answer}", flush=True)
                    return
            except RunBusy:  # the killed worker's lease has not run out yet
                print("  run busy: waiting for the previous worker's lease to run out", flush=True)
                await asyncio.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="libpq connection string")
    parser.add_argument("--run", default=None, help="run id (default: a new one)")
    parser.add_argument("--worker", metavar="STATE_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--crash-before-turn", type=int, default=None, help=argparse.SUPPRESS)
    options = parser.parse_args()
    run = options.run or f"async-agent-{uuid.uuid4().hex[:12]}"
    if options.worker:  # one worker process
        asyncio.run(worker(options.dsn, run, options.worker, options.crash_before_turn))
        return 0

    with tempfile.TemporaryDirectory() as state:
        def start(*extra: str) -> int:
            return subprocess.run([sys.executable, os.path.abspath(__file__), "--dsn", options.dsn,
                                   "--run", run, "--worker", state, *extra]).returncode

        print(f"run {run}: an agent pays {list(BOOKS)} and tells each vendor", flush=True)
        first = start("--crash-before-turn", "3")
        print(f"== the first worker died (exit status {first}); the job is redelivered", flush=True)
        began = time.monotonic()
        second = start()
        print(f"== the second worker finished (exit status {second}) "
              f"in {time.monotonic() - began:.1f} s", flush=True)
        bank, mail = Downstream(os.path.join(state, "bank")), Downstream(os.path.join(state, "mail"))
        payments, emails = bank.calls(), mail.calls()
    print(f"== downstream: {len(payments)} payments {[p['invoice'] for p in payments]}, "
          f"{len(emails)} emails")
    keys = [c["idempotency_key"] for c in payments + emails]
    ok = (first == -signal.SIGKILL and second == 0 and len(payments) == 2 and len(emails) == 3
          and sorted(p["invoice"] for p in payments) == ["INV-201", "INV-203"]
          and len(set(keys)) == len(keys))
    print("ok - the first worker was killed mid-run, the second replayed what it had done; "
          "every effect happened once" if ok else "not ok - an effect is missing or happened twice")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
