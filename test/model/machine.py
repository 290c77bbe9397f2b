"""Generated histories against a real server, checked against the model.

A Hypothesis RuleBasedStateMachine: several sessions, each a real
connection, make random calls; every answer (a decision, a SQLSTATE, a
boolean) and, after every step, every effect row, every session's epoch of
every run, the runs' epochs and the set `unresolved` lists are compared with
ledger_model.Model.  Throughout: no key and attempt is answered `execute`
twice, and the audit chain verifies.  A disagreement fails with the history
so far as the SQL a person can replay in psql, one line per statement, each
naming its session.

Each history uses runs and business keys of its own (a prefix per history),
so histories share one database without resetting it.
"""

from __future__ import annotations

import collections
import copy
import itertools
import json
import os
import re
import threading
import time
from typing import Any, Optional

import psycopg
from psycopg import ClientCursor
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ledger_model import Model, Refused, Tool

SESSIONS = 3
RUNS = 3
# a session calls its own run mostly (a worker per run), now and then another's
WHOSE_RUN = st.sampled_from([0, 0, 0, 0, 0, 0, 1, 2])
# the tools of a history (registered by it, under names of its own): a
# side-effecting one judged for divergence, a read-only one, one nobody
# registered (until a rule registers it), and one keyed by a key field (its
# memo changes from call to call, as a model rewords free text)
TOOLS = {"pay": Tool(side_effecting=True, divergence="pause", reconcile_grace="0"),
         "llm": Tool(side_effecting=False, divergence="off"),
         "mail": Tool(registered=False),
         "crm": Tool(side_effecting=True, divergence="pause", key_fields=("n",))}
VALUES = [{"v": 0}, {"v": 1}, None]
ATTEMPTS = ["current", "none", "earlier", "above"]

DSN = os.environ.get("MODEL_DSN", "")
HISTORY_IDS = itertools.count(1)
PREFIX = f"model{os.getpid()}-{int(time.time())}"

# the steps of the last history that failed, for a regression file
last_failure: dict[str, Any] = {}
# every finished history as SQL with its names made alike (run.py --twice)
finished: list[str] = []
# the steps of the last history begun: the failing one when it raised what
# no check raises (a driver's error, Hypothesis's Flaky)
last_begun: dict[str, Any] = {}
# what the histories made happen, for the summary (run.py)
seen: dict[str, int] = {}


def saw(what: str) -> None:
    seen[what] = seen.get(what, 0) + 1


def failed_history() -> dict[str, Any]:
    """The history that failed: the last one a check failed, else the last begun."""
    return last_failure or last_begun


def failed_history_text() -> str:
    return "-- the history, as SQL (psql):\n" + "\n".join(failed_history().get("transcript", []))


class Mismatch(AssertionError):
    pass


class Session:
    """One connection, as a worker holds it; reconnected when it is ended."""

    def __init__(self, label: str):
        self.label = label
        self.notices: list[str] = []
        self.pids: list[int] = []  # every backend it had (alike names them by order)
        self.connect()

    def connect(self) -> None:
        self.conn = psycopg.connect(DSN, autocommit=True, cursor_factory=ClientCursor)
        self.conn.add_notice_handler(lambda d: self.notices.append(d.sqlstate or ""))
        self.conn.execute("SET lock_timeout = '100ms'")
        self.pid = self.conn.info.backend_pid
        self.pids.append(self.pid)

    def close(self) -> None:
        self.conn.close()


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"{PREFIX}-{next(HISTORY_IDS)}-"
        self.runs = [f"{self.prefix}r{i}" for i in range(RUNS)]
        # INV-0, INV-1; MAIL-2, an order the tool nobody registered sends (report_meanwhile)
        self.business_keys = [f"{self.prefix}INV-{i}" for i in range(2)] + [f"{self.prefix}MAIL-2"]
        self.tools = {short: f"{self.prefix}{short}" for short in TOOLS}
        self.model = Model({self.tools[short]: copy.copy(t) for short, t in TOOLS.items()})
        self.admin = Session("admin")
        self.sessions = [Session(f"s{i}") for i in range(SESSIONS)]
        self.transcript: list[str] = []
        for short, t in TOOLS.items():
            if t.registered:
                self.sql(self.admin, "SELECT FROM durable_ledger.register_tool(%s, 'model',"
                         " side_effecting => %s, divergence => %s, key_fields => %s)",
                         (self.tools[short], t.side_effecting, t.divergence,
                          list(t.key_fields) if t.key_fields else None))
                if t.reconcile_grace is not None:
                    self.sql(self.admin, "SELECT FROM durable_ledger.set_reconcile(%s, %s, 'model')",
                             (self.tools[short], t.reconcile_grace))
        # the policies for tools nobody registered are the database's: each
        # history starts from the defaults (what the previous one left is no
        # part of this history: not selected)
        self.sql(self.admin, "SELECT FROM durable_ledger.set_unregistered_tools('allow', 'model'),"
                 " durable_ledger.set_unregistered_divergence('pause', 'model')")
        # metrics_events() counts what committed transactions logged: from
        # here on, each count grows by the rows the history adds to the audit
        # log (and purge_audit takes), none of a rolled-back call's
        self.events_before = self.event_totals()
        self.audit_from = self.sql(self.admin, "SELECT coalesce(max(id), 0)"
                                   " FROM durable_ledger.audit_log", quiet=True)[0][0]
        self.audit_purged: collections.Counter[str] = collections.Counter()
        self.steps: list[list[Any]] = []
        self.tokens: list[str] = []
        self.run_tokens: dict[int, list[str]] = {}
        self.keys: list[str] = []
        self.executed: set[tuple[str, int]] = set()
        self.holders: dict[str, int] = {}  # key -> the pid that started its current attempt
        self.calls: list[tuple[int, tuple]] = []  # the begins of the history: (run, call)
        self.last_report: Optional[tuple] = None
        self.expired = 0
        self.nested = False
        last_begun.update(steps=self.steps, transcript=self.transcript)

    def whose(self, s: int, r: int) -> int:
        """The run a rule's r names: counted from session s's own run."""
        return (s + r) % len(self.runs)

    # ---------- talking to the server ----------

    def sql(self, session: Session, query: str, params: tuple = (), quiet: bool = False
            ) -> list[tuple]:
        """Runs a statement, keeping it in the transcript; raises Refused.

        quiet: a check's read, left out of the transcript (which is the
        history itself)."""
        if quiet:
            with session.conn.cursor() as cur:
                cur.execute(query, params)
                return cur.fetchall()
        with session.conn.cursor() as cur:
            text = cur.mogrify(query, params)
            self.transcript.append(f"-- {session.label}\n{text};")
            session.notices.clear()
            try:
                cur.execute(query, params)
            except psycopg.Error as e:
                if e.sqlstate is None:
                    raise
                self.transcript.append(f"--   => ERROR {e.sqlstate}")
                saw(f"{query.split('(')[0].split('.')[-1]} {e.sqlstate}")
                raise Refused(e.sqlstate, str(e).splitlines()[0]) from None
            rows = cur.fetchall() if cur.description else []
            self.transcript.append(f"--   => {rows!r}")
            return rows

    def fail(self, what: str) -> None:
        last_failure["steps"] = self.steps
        last_failure["transcript"] = self.transcript
        raise Mismatch(what + "\n\n" + failed_history_text())

    def both(self, server, model) -> Any:
        """Runs the server's call and the model's; their refusals must agree."""
        try:
            got = server()
        except Refused as e:
            got = e
        try:
            want = model()
        except Refused as e:
            want = e
        if isinstance(got, Refused) or isinstance(want, Refused):
            g = got.sqlstate if isinstance(got, Refused) else f"no error ({got!r})"
            w = want.sqlstate if isinstance(want, Refused) else f"no error ({want!r})"
            if g != w:
                self.fail(f"the server answered {g}, the model {w}"
                          + (f" ({want.why})" if isinstance(want, Refused) else ""))
            return None
        return got, want

    def step(self, *what: Any) -> None:
        """Keeps a rule's call for a regression file (not the calls a rule makes)."""
        if not self.nested:
            self.steps.append(list(what))

    # ---------- leases ----------

    @rule(s=st.integers(0, SESSIONS - 1), r=WHOSE_RUN, wait=st.sampled_from([False, False, True]))
    def acquire(self, s: int, r: int, wait: bool = False) -> None:
        """acquire_run, mostly without waiting (a wait for another holder
        outlasts the sessions' lock_timeout: 55P03)."""
        self.step("acquire", s, r, wait)
        r = self.whose(s, r)
        out = self.both(
            lambda: self.sql(self.sessions[s], "SELECT durable_ledger.acquire_run(%s, %s)",
                             (self.runs[r], wait))[0][0],
            lambda: self.model.acquire_run(s, self.runs[r], wait))
        if out and out[0] != out[1]:
            self.fail(f"acquire_run answered {out[0]}, the model {out[1]}")

    @rule(s=st.integers(0, SESSIONS - 1), r=WHOSE_RUN)
    def release(self, s: int, r: int) -> None:
        self.step("release", s, r)
        r = self.whose(s, r)
        out = self.both(
            lambda: self.sql(self.sessions[s], "SELECT durable_ledger.release_run(%s)",
                             (self.runs[r],))[0][0],
            lambda: self.model.release_run(s, self.runs[r]))
        if out and out[0] != out[1]:
            self.fail(f"release_run answered {out[0]}, the model {out[1]}")

    @rule(s=st.integers(0, SESSIONS - 1), r=WHOSE_RUN)
    def take(self, s: int, r: int) -> None:
        self.step("take", s, r)
        r = self.whose(s, r)
        try:
            token = self.sql(self.sessions[s],
                             "SELECT token FROM durable_ledger.take_lease(%s, '5 minutes')",
                             (self.runs[r],))[0][0]
        except Refused as e:
            token = e
        try:
            want = self.model.take_lease(s, self.runs[r], None if isinstance(token, Refused)
                                         else token)
        except Refused as e:
            want = e
        except AssertionError as e:
            self.fail(f"take_lease answered {token!r}, which the model refuses: {e}")
        if isinstance(token, Refused) or isinstance(want, Refused):
            if not (isinstance(token, Refused) and isinstance(want, Refused)
                    and token.sqlstate == want.sqlstate):
                self.fail(f"take_lease answered {token!r}, the model {want!r}")
            return
        if (token is None) != (want is None):
            self.fail(f"take_lease answered {token!r}, the model {want!r}")
        if token is not None:
            self.tokens.append(token)
            self.run_tokens.setdefault(r, []).append(token)

    def token(self, t: int) -> Optional[str]:
        return self.tokens[t % len(self.tokens)] if self.tokens else None

    def token_of(self, r: int, via: str) -> Optional[str]:
        """The token a call passes: none (a session lease), the run's latest,
        an older one of the run, or another run's."""
        mine = self.run_tokens.get(r, [])
        if via == "latest" and mine:
            return mine[-1]
        if via == "older" and mine:
            return mine[0]
        if via == "other" and self.tokens:
            return self.tokens[-1]
        return None

    @precondition(lambda self: self.tokens)
    @rule(t=st.integers(0, 3))
    def renew(self, t: int) -> None:
        self.step("renew", t)
        token = self.token(t)
        self.both(lambda: self.sql(self.admin, "SELECT FROM durable_ledger.renew_lease(%s)", (token,)),
                  lambda: self.model.renew_lease(token))

    @precondition(lambda self: self.tokens)
    @rule(t=st.integers(0, 3))
    def release_token(self, t: int) -> None:
        self.step("release_token", t)
        token = self.token(t)
        out = self.both(
            lambda: self.sql(self.admin, "SELECT durable_ledger.release_lease(%s)", (token,))[0][0],
            lambda: self.model.release_lease(token))
        if out and out[0] != out[1]:
            self.fail(f"release_lease answered {out[0]}, the model {out[1]}")

    @precondition(lambda self: self.tokens and self.expired < 1)
    @rule(t=st.integers(0, 3))
    def expire(self, t: int) -> None:
        """The server's clock ends a token lease: renewed for 1 s, then waited out."""
        self.step("expire", t)
        token = self.token(t)
        if not self.model.token_live(token):
            return
        self.expired += 1
        self.sql(self.admin, "SELECT FROM durable_ledger.renew_lease(%s, '1 second')", (token,))
        while not self.sql(self.admin,
                           "SELECT clock_timestamp() > expires_at FROM durable_ledger.token_leases"
                           " WHERE token_sha256 = sha256(convert_to(%s, 'UTF8'))", (token,), quiet=True)[0][0]:
            time.sleep(0.05)
        self.model.token_expired(token)

    @rule(s=st.integers(0, SESSIONS - 1))
    def kill(self, s: int) -> None:
        """A worker's connection ends (SIGKILL, network): its leases end with it."""
        self.step("kill", s)
        self.end_backend(self.sessions[s])
        self.model.session_ended(s)

    @rule(s=st.integers(0, SESSIONS - 1))
    def lose_locks(self, s: int) -> None:
        """A worker's locks are dropped behind the ledger's back
        (pg_advisory_unlock_all, as DISCARD ALL or a pooler's reset does)."""
        self.step("lose_locks", s)
        self.sql(self.sessions[s], "SELECT FROM pg_advisory_unlock_all()")
        self.model.locks_lost(s)
        saw("locks lost")

    def end_backend(self, session: Session) -> None:
        self.sql(self.admin, "SELECT pg_terminate_backend(%s)", (session.pid,))
        self.wait_gone(session)

    def wait_gone(self, session: Session) -> None:
        while self.sql(self.admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                       (session.pid,), quiet=True)[0][0]:
            time.sleep(0.01)
        session.close()
        session.connect()
        self.transcript.append(f"-- ({session.label} reconnected)")

    @rule(r=WHOSE_RUN)
    def break_lease(self, r: int) -> None:
        self.step("break_lease", r)
        run = self.runs[r]
        held = run in self.model.leases
        holder = self.model.leases[run].session if held else None
        got = self.sql(self.admin, "SELECT durable_ledger.break_lease(%s, 'model')", (run,))[0][0]
        if got != held:
            self.fail(f"break_lease answered {got}, the model {held}")
        self.model.break_lease(run)
        if holder is not None:
            self.wait_gone(self.sessions[holder])

    @rule(s=st.integers(0, SESSIONS - 1), r=WHOSE_RUN, back=st.sampled_from([0, 0, 1, 5]))
    def release_attempt(self, s: int, r: int, back: int) -> None:
        """A worker (or its supervisor) ends the run's attempt it knows by its
        epoch: the latest, an older one, or none at all (epoch 0: 22023)."""
        self.step("release_attempt", s, r, back)
        r = self.whose(s, r)
        run = self.runs[r]
        epoch = max(self.model.epochs.get(run, 0) - back, 1) if back < 5 else 0
        holder = self.model.leases.get(run)
        try:
            got = self.sql(self.sessions[s], "SELECT durable_ledger.release_attempt(%s, %s)",
                           (run, epoch))[0][0]
        except Refused as e:
            got = e
        try:
            want, ended = self.model.release_attempt(s, run, epoch)
        except Refused as e:
            want, ended = e, None
        if isinstance(got, Refused) or isinstance(want, Refused):
            if not (isinstance(got, Refused) and isinstance(want, Refused)
                    and got.sqlstate == want.sqlstate):
                self.fail(f"release_attempt answered {got!r}, the model {want!r}")
            return
        if got != want:
            self.fail(f"release_attempt({epoch}) answered {got}, the model {want}"
                      f" (the run's lease: {holder!r})")
        saw(f"release_attempt {'ended another session' if ended is not None else got}")
        if ended is not None:
            self.wait_gone(self.sessions[ended])

    @precondition(lambda self: self.keys and len(self.runs) < RUNS + 2)
    @rule(r=st.integers(0, RUNS - 1), k=st.integers(0, 7))
    def fork(self, r: int, k: int) -> None:
        """An admin forks a run (mostly one with effects) into a new one up to
        one of its effects (k = 7: into a run that exists, 42710); a worker
        then runs the new run's first attempt: the source's calls again, in
        order (the carried ones replay, the rest execute), the k-th reworded
        when k is 4 to 6 (a drift before the end of what it carries pauses)."""
        self.step("fork", r, k)
        with_effects = [run for run in self.runs if self.model.run_effects(run)]
        source = with_effects[r % len(with_effects)] if with_effects else self.runs[r]
        effects = self.model.run_effects(source)
        up_to = effects[k % len(effects)].key if effects else self.keys[-1]
        new = self.runs[(r + 1) % len(self.runs)] if k == 7 else f"{self.prefix}f{len(self.runs)}"

        def key_of(tool: str, args: Any, occurrence: int) -> str:
            return self.sql(self.admin, "SELECT durable_ledger.effect_key(%s, %s, %s::jsonb, %s)",
                            (new, tool, json.dumps(args), occurrence), quiet=True)[0][0]

        out = self.both(
            lambda: self.sql(self.admin, "SELECT durable_ledger.fork_run(%s, %s, %s, 'model')",
                             (source, new, up_to))[0][0],
            lambda: self.model.fork_run(source, new, up_to, key_of))
        if out is None:
            return
        if out[0] != out[1]:
            self.fail(f"fork_run carried {out[0]} effects, the model {out[1]}")
        saw("fork_run carried" if out[0] else "fork_run carried nothing")
        if new not in self.runs:
            self.runs.append(new)
        self.keys.extend(e.key for e in self.model.run_effects(new))
        for e in self.model.run_effects(new):
            self.holders[e.key] = self.admin.pid  # the carried rows are fork_run's
        s, n, to = k % SESSIONS, self.runs.index(new), self.runs.index(source)
        self.nested = True
        try:
            self.acquire(s, (n - s) % len(self.runs))
            for i, (run, (tool, a, b, via, recorded)) in enumerate(
                    c for c in list(self.calls) if c[0] == to and c[1][3] == "session"):
                if 4 <= k <= 6 and i == k - 4:
                    a = 1 - a
                self.calls.append((n, (tool, a, b, via, recorded)))
                self.begin(s, (n - s) % len(self.runs), tool, a, b, via, recorded)
        finally:
            self.nested = False

    @precondition(lambda self: len(self.steps) > 20)
    @rule()
    def purge(self) -> None:
        """An admin purges every settled, quiet run (older_than 0: the horizon
        is now): a dry run first, which must name the same runs and counts;
        a later call of a purged run executes again, as documented."""
        self.step("purge")
        mine = self.prefix + "%"
        query = ("SELECT run, effects, past_attempts, divergences FROM durable_ledger.purge_settled("
                 "'0', 'model', dry_run => %s, max_runs => 100000) WHERE run LIKE %s")
        dry = {r: tuple(c) for r, *c in self.sql(self.admin, query, (True, mine))}
        got = {r: tuple(c) for r, *c in self.sql(self.admin, query, (False, mine))}
        want = self.model.purge_settled()
        if dry != got or got != want:
            self.fail(f"purge_settled purged {got!r} (a dry run: {dry!r}), the model {want!r}")
        if got:
            saw("purge_settled purged")
        self.executed = {(k, a) for k, a in self.executed if k in self.model.effects}

    @precondition(lambda self: len(self.steps) > 20)
    @rule()
    def purge_audit(self) -> None:
        """An admin cuts the audit log at now (older_than 0): a prefix of each
        hash chain of rows about nothing still open, of runs with no effect
        left.  What it must keep: every row about an effect the ledger still
        has (history tells each, the next steps check), a chain that still
        verifies.  Which rows of runs without effects go depends on where each
        chain's prefix stops: the model reads back which runs it still heard of."""
        self.step("purge_audit")
        before = self.audit_rows()
        self.sql(self.admin, "SELECT FROM durable_ledger.purge_audit('0', 'model', dry_run => false)")
        after = self.audit_rows()
        self.audit_purged.update(event for id, event in before.items() if id not in after)
        problems = self.sql(self.admin, "SELECT * FROM durable_ledger.verify_audit()", quiet=True)
        if problems:
            self.fail(f"verify_audit after purge_audit found {problems!r}")
        for run in list(self.model.heard):
            if not self.sql(self.admin, "SELECT EXISTS (SELECT FROM durable_ledger.audit_log"
                            " WHERE run = %s)", (run,), quiet=True)[0][0]:
                self.model.heard.discard(run)
        self.nested = True
        try:
            for r in range(len(self.runs)):
                self.history(r)
        finally:
            self.nested = False

    @rule(r=st.integers(0, RUNS + 1))
    def history(self, r: int) -> None:
        """An auditor reads a run's history: every effect whose current attempt
        the run began is there, under its key, with its tool and args, and the
        events are in order."""
        self.step("history", r)
        run = self.runs[r % len(self.runs)]
        rows = self.sql(self.admin, "SELECT id, key, tool, args FROM durable_ledger.history(%s)",
                        (run,), quiet=True)
        if [row[0] for row in rows] != sorted(row[0] for row in rows):
            self.fail(f"history({run}) is not in the order of the audit log")
        told = {(key, tool, json.dumps(args, sort_keys=True)) for _, key, tool, args in rows}
        for e in self.model.effects.values():
            if e.run == run and (e.key, e.tool, json.dumps(e.args, sort_keys=True)) not in told:
                self.fail(f"history({run}) does not tell of effect {e.key} ({e.tool}, {e.args!r})")

    @invariant()
    def metrics_agree(self) -> None:
        """The metrics count what unresolved lists (the whole ledger)."""
        if not self.sql(self.admin, "SELECT (SELECT unresolved FROM durable_ledger.metrics)"
                        " = (SELECT count(*) FROM durable_ledger.unresolved)", quiet=True)[0][0]:
            self.fail("durable_ledger.metrics counts another number of unresolved than the view lists")

    def event_totals(self) -> Optional[dict[str, int]]:
        """metrics_events(): None when the library is not preloaded (NULL totals)."""
        rows = self.sql(self.admin, "SELECT event, total FROM durable_ledger.metrics_events()",
                        quiet=True)
        if not rows or any(total is None for _, total in rows):
            return None
        return dict(rows)

    def audit_rows(self) -> dict[int, str]:
        """The audit rows the history logged: id -> event."""
        return dict(self.sql(self.admin, "SELECT id, event::text FROM durable_ledger.audit_log"
                             " WHERE id > %s", (self.audit_from,), quiet=True))

    @invariant()
    def events_counted(self) -> None:
        """metrics_events() counted every event the history's committed
        transactions logged, each once (the database's: one check at a time)."""
        if self.events_before is None:
            return
        now = self.event_totals()
        if now is None:
            self.fail("metrics_events() stopped counting")
        logged = collections.Counter(self.audit_rows().values()) + self.audit_purged
        counted = {e: n - self.events_before.get(e, 0) for e, n in now.items()
                   if n != self.events_before.get(e, 0)}
        if counted != dict(logged):
            self.fail(f"metrics_events() counted {counted!r} since the history began;"
                      f" the audit log has {dict(logged)!r}")
        saw("metrics_events checked")

    @precondition(lambda self: len(self.steps) > 15 and not self.model.abandoned)
    @rule()
    def abandon(self, r: int = RUNS - 1) -> None:
        """An admin abandons the last run (the others stay open: a history
        of abandoned runs only says 55L02)."""
        self.step("abandon", r)
        out = self.both(
            lambda: self.sql(self.admin, "SELECT durable_ledger.abandon_run(%s, 'model')",
                             (self.runs[r],))[0][0],
            lambda: self.model.abandon_run(self.runs[r]))
        if out and out[0] != out[1]:
            self.fail(f"abandon_run answered {out[0]}, the model {out[1]}")

    # ---------- effects ----------

    BEGINS = dict(s=st.integers(0, SESSIONS - 1), r=WHOSE_RUN,
                  tool=st.sampled_from(["pay", "pay", "llm", "mail", "crm"]), a=st.integers(0, 1),
                  b=st.sampled_from([None, None, 0, 1]),
                  via=st.sampled_from(["session", "session", "latest", "latest", "older", "other"]),
                  recorded=st.sampled_from([False, False, True]))

    @rule(**BEGINS)
    def begin(self, s: int, r: int, tool: str, a: int, b: Optional[int], via: str,
              recorded: bool) -> None:
        self.step("begin", s, r, tool, a, b, via, recorded)
        if not self.nested:
            self.calls.append((self.whose(s, r), (tool, a, b, via, recorded)))
        self.call_begin(s, r, tool, a, b, via, recorded, rolled_back=False)

    @rule(**BEGINS)
    def begin_rolled_back(self, s: int, r: int, tool: str, a: int, b: Optional[int], via: str,
                          recorded: bool) -> None:
        """A begin in a transaction that rolls back: it leaves no effect, no
        audit row and the occurrence counter as it was (a lock it took stays);
        the worker then retries the call, which must get the same occurrence."""
        self.step("begin_rolled_back", s, r, tool, a, b, via, recorded)
        self.call_begin(s, r, tool, a, b, via, recorded, rolled_back=True)
        self.call_begin(s, r, tool, a, b, via, recorded, rolled_back=False)

    LOCALS = {k: v for k, v in BEGINS.items() if k != "recorded"}

    # drawn a third as often as a rule of its own would be: it is a begin and a report,
    # which the other rules draw already, and the histories' other paths keep their share
    @precondition(lambda self: len(self.steps) % 3 == 0)
    @rule(**LOCALS, outcome=st.sampled_from(["completed", "completed", "failed", "none"]),
          v=st.integers(0, len(VALUES) - 1))
    def local(self, s: int, r: int, tool: str, a: int, b: Optional[int], via: str,
              outcome: str, v: int) -> None:
        """A local effect (begin_local): its begin and, on execute, its report
        (or none) in one transaction.  It commits whole -- as begin and report
        would -- or, without an outcome, its COMMIT fails (25000) and it leaves
        what a begin rolled back leaves; any other decision commits as begin's."""
        self.step("local", s, r, tool, a, b, via, outcome, v)
        call = self.prepare_begin(s, r, tool, a, b, via, False)
        call["query"] = call["query"].replace("durable_ledger.begin_effect(", "durable_ledger.begin_local(")
        session = self.sessions[s]
        self.sql(session, "BEGIN")
        try:
            got = self.sql(session, call["query"], call["params"])[0]
        except Refused as e:
            self.sql(session, "ROLLBACK")
            self.judge_begin(call, e, list(session.notices), rolled_back=True)
            return
        notices = list(session.notices)
        executes = got[1] == "execute"
        value = VALUES[v]
        report = None
        if executes and outcome != "none":
            fn = "complete_effect" if outcome == "completed" else "fail_effect"
            report = self.sql(session, f"SELECT {self.ROW} FROM durable_ledger.{fn}(%s, %s::jsonb, %s)",
                              (got[0], None if value is None else json.dumps(value), got[4]))
        try:
            self.sql(session, "COMMIT")
            refused = None
        except Refused as e:
            refused = e
        if (refused is not None) != (executes and outcome == "none"):
            self.fail(f"local: COMMIT {'failed: ' + refused.sqlstate if refused else 'succeeded'} after "
                      f"{got[1]} with outcome {outcome}")
        if refused is not None and refused.sqlstate != "25000":
            self.fail(f"local: COMMIT without an outcome failed with {refused.sqlstate}, not 25000")
        self.judge_begin(call, got, notices, rolled_back=refused is not None)
        if report is not None:
            applied = self.model.report(s, got[0], outcome == "completed", value, got[4])
            if applied != "applied":
                self.fail(f"local: the report in the effect's transaction was {applied} in the model")
            self.returned_row_agrees("local's report", report, got[0])
            saw(f"local {outcome}")
        elif refused is not None:
            saw("local without an outcome, refused")

    def call_begin(self, s: int, r: int, tool: str, a: int, b: Optional[int], via: str,
                   recorded: bool, rolled_back: bool) -> None:
        call = self.prepare_begin(s, r, tool, a, b, via, recorded)
        if rolled_back:
            self.sql(self.sessions[s], "BEGIN")
        try:
            got = self.sql(self.sessions[s], call["query"], call["params"])[0]
        except Refused as e:
            got = e
        notices = list(self.sessions[s].notices)
        if rolled_back:
            self.sql(self.sessions[s], "ROLLBACK")
        self.judge_begin(call, got, notices, rolled_back)

    def prepare_begin(self, s: int, r: int, tool: str, a: int, b: Optional[int], via: str,
                      recorded: bool) -> dict[str, Any]:
        """A call of begin_effect or begin_recorded as drawn: its SQL and what
        the model is asked."""
        r = self.whose(s, r)
        run, args = self.runs[r], {"n": a}
        if tool == "crm":
            args["memo"] = f"m{len(self.steps) % 3}"
        if recorded and tool in ("pay", "crm") and a == 0:
            tool = "llm"  # a side-effecting tool's recorded call is refused (55L03): now and then
        tool = self.tools[tool]
        token = self.token_of(r, via)
        bk = self.business_keys[b] if b is not None and not recorded else None
        if bk is not None:
            # a business key names one operation: its calls are mostly the
            # same one (a redelivery), now and then another (refused, 23505)
            tool = self.tools["pay"] if a == 0 else tool
            args = {"invoice": b}
        cols = "key, decision::text, status::text, occurrence, attempt, result, error, downstream_key"
        if recorded:
            query = f"SELECT {cols} FROM durable_ledger.begin_recorded(%s, %s, %s::jsonb, NULL, %s)"
            params: tuple = (run, tool, json.dumps(args), token)
        else:
            query = f"SELECT {cols} FROM durable_ledger.begin_effect(%s, %s, %s::jsonb, %s, NULL, %s)"
            params = (run, tool, json.dumps(args), bk, token)
        return dict(s=s, run=run, tool=tool, args=args, bk=bk, token=token, recorded=recorded,
                    query=query, params=params)

    def judge_begin(self, call: dict[str, Any], got: Any, notices: list[str],
                    rolled_back: bool) -> None:
        """The server's answer to a begin against the model's."""
        s, run, tool, args, bk, token, recorded = (call[k] for k in (
            "s", "run", "tool", "args", "bk", "token", "recorded"))

        def derived(occurrence: int) -> str:
            """The key the server derives for that occurrence (effect_key)."""
            return self.sql(self.admin, "SELECT durable_ledger.effect_key(%s, %s, %s::jsonb, %s)",
                            (run, tool, json.dumps(args), occurrence), quiet=True)[0][0]
        model_begin = self.model.begin_rolled_back if rolled_back else self.model.begin
        try:
            want = model_begin(s, run, tool, args, bk, token, recorded, derived)
        except Refused as e:
            want = e
        except AssertionError as e:
            self.fail(f"the model refuses the server's answer {got!r}: {e}")
        if isinstance(got, Refused) or isinstance(want, Refused):
            g = got.sqlstate if isinstance(got, Refused) else f"no error ({got!r})"
            w = f"{want.sqlstate} ({want.why})" if isinstance(want, Refused) else f"no error ({want!r})"
            if not (isinstance(got, Refused) and isinstance(want, Refused)
                    and got.sqlstate == want.sqlstate):
                self.fail(f"begin: the server answered {g}, the model {w}")
            return
        # the provider's key: a derived key's first attempt, the key; else key#attempt
        downstream = (None if want.status is None
                      else want.key if bk is None and want.attempt == 1
                      else f"{want.key}#{want.attempt}")
        answer = (want.key, want.decision, want.status, want.occurrence, want.attempt,
                  want.result, want.error, downstream)
        if tuple(got) != answer:
            self.fail(f"begin: the server answered {tuple(got)!r}, the model {answer!r}")
        for sqlstate, wanted, what in (("01L01", self.model.warned, "a divergence"),
                                       ("01L02", self.model.warned_unregistered,
                                        "a tool nobody registered")):
            if (sqlstate in notices) != wanted:
                self.fail("begin: the server " + ("warned" if sqlstate in notices else "did not warn")
                          + f" of {what}, the model " + ("did" if wanted else "did not"))
        if got[1] == "pause" and got[2] is None:
            saw("begin pause divergence")
        if "01L02" in notices:
            saw("begin warned of a tool nobody registered")
        if self.model.tools[tool].key_fields and got[1] == "replay" and bk is None:
            saw("begin replay by key fields")
        saw(f"begin{'_recorded' if recorded else ''} {got[1]}"
            + (f" {got[2]}" if got[1] == "replay" else "")
            + (" again" if got[1] == "execute" and got[4] > 1 else "")
            + (" business key" if bk else "") + (" token" if token else "")
            + (" rolled back" if rolled_back else ""))
        if rolled_back:
            return
        if got[0] not in self.keys:
            self.keys.append(got[0])
        if got[1] == "execute":
            if (got[0], got[4]) in self.executed:
                self.fail(f"effect {got[0]} attempt {got[4]} was answered execute twice")
            self.executed.add((got[0], got[4]))
            self.holders[got[0]] = self.sessions[s].pid

    @precondition(lambda self: len(self.steps) > 3)
    @rule(s=st.integers(0, SESSIONS - 1), other=st.integers(1, SESSIONS - 1),
          completed=st.booleans())
    def report_meanwhile(self, s: int, other: int, completed: bool) -> None:
        """A call's effect row changes between its judgement and its write:
        t calls the order MAIL-2 of the tool nobody registered while an admin's
        change of the policy for such tools is open, so t, having read and
        judged the row, waits before it writes (or answered already: a replay,
        a pause); meanwhile s reports on the order's current attempt; then the
        admin commits.  t must decide on the row as s left it (a new round),
        never on the one it judged."""
        self.step("report_meanwhile", s, other, completed)
        t = (s + other) % SESSIONS
        call = self.prepare_begin(t, 0, "mail", 1, 2, "session", False)
        lease = self.model.leases.get(call["run"])
        if lease is not None and lease.session != t:
            return  # t would wait for its run's lease: not this rule's history
        waiter = self.sessions[t]
        self.sql(waiter, "SET lock_timeout = '30s'")
        self.sql(self.admin, "BEGIN")
        self.sql(self.admin, "SELECT FROM durable_ledger.set_unregistered_tools(%s, 'model')",
                 (self.model.unregistered_tools,))
        thread, outcome = self.send_waiting(waiter, call, "the admin's")
        waited = self.wait_for(thread, waiter)
        if waited and call["bk"] in self.model.effects:
            self.nested = True
            try:
                self.report_on(s, call["bk"], completed, 0 if completed else 1, "current")
            finally:
                self.nested = False
        self.sql(self.admin, "COMMIT")
        thread.join()
        got = self.answer_of(outcome)
        notices = list(waiter.notices)
        self.sql(waiter, "SET lock_timeout = '100ms'")
        saw("report_meanwhile waited" if waited else "report_meanwhile did not wait")
        self.judge_begin(call, got, notices, rolled_back=False)

    def send_waiting(self, waiter: Session, call: dict[str, Any], whose: str
                     ) -> tuple[threading.Thread, dict[str, Any]]:
        """Sends call from waiter in a thread of its own (it may wait for a lock)."""
        with waiter.conn.cursor() as cur:
            text = cur.mogrify(call["query"], call["params"])
        self.transcript.append(f"-- {waiter.label}, in another psql while {whose}"
                               f" transaction is open\n{text};")
        outcome: dict[str, Any] = {}

        def send() -> None:
            waiter.notices.clear()
            try:
                with waiter.conn.cursor() as cur:
                    cur.execute(call["query"], call["params"])
                    outcome["rows"] = cur.fetchall()
            except psycopg.Error as e:
                outcome["error"] = e
        thread = threading.Thread(target=send)
        thread.start()
        return thread, outcome

    def wait_for(self, thread: threading.Thread, waiter: Session) -> bool:
        """Until waiter's call waits for a lock (True) or has its answer (False)."""
        while thread.is_alive():
            if self.sql(self.admin, "SELECT count(*) > 0 FROM pg_stat_activity"
                        " WHERE pid = %s AND wait_event_type = 'Lock'", (waiter.pid,),
                        quiet=True)[0][0]:
                return True
        return False

    def answer_of(self, outcome: dict[str, Any]) -> Any:
        """A waiting call's answer, as the transcript tells it."""
        if "error" in outcome:
            e = outcome["error"]
            if e.sqlstate is None:
                raise e
            self.transcript.append(f"--   => ERROR {e.sqlstate}")
            saw(f"begin_effect {e.sqlstate}")
            return Refused(e.sqlstate, str(e).splitlines()[0])
        self.transcript.append(f"--   => {outcome['rows']!r}")
        return outcome["rows"][0]

    @precondition(lambda self: len(self.steps) > 3)
    @rule(s=st.integers(0, SESSIONS - 1), other=st.integers(1, SESSIONS - 1), b=st.integers(0, 1),
          commit=st.sampled_from([True, True, False]), failed=st.booleans())
    def overlap(self, s: int, other: int, b: int, commit: bool, failed: bool = False) -> None:
        """Two runs call one business key at once (an order redelivered to two
        workers): s's call is in an open transaction when t's arrives, which
        waits for s's row or insert where it must, then s commits or rolls back.
        The answers are those of s's call and then t's (or t's alone): never
        two execute of one attempt, whichever round t's decision took.  With
        failed, the key's current attempt is failed first (the provider
        refused it), so that both calls would execute its next attempt."""
        self.step("overlap", s, other, b, commit, failed)
        t = (s + other) % SESSIONS
        if failed:
            self.nested = True
            try:
                if self.business_keys[b] not in self.model.effects:
                    self.begin(s, 0, "pay", 0, b, "session", False)
                if self.business_keys[b] in self.model.effects:
                    self.report_on(s, self.business_keys[b], False, 1, "current")
            finally:
                self.nested = False
        first = self.prepare_begin(s, 0, "pay", 0, b, "session", False)
        second = self.prepare_begin(t, 0, "pay", 0, b, "session", False)
        lease = self.model.leases.get(second["run"])
        if lease is not None and lease.session != t:
            return  # t would wait for its run's lease, not for s: not this rule's history
        waiter = self.sessions[t]
        self.sql(waiter, "SET lock_timeout = '30s'")
        self.sql(self.sessions[s], "BEGIN")
        try:
            got_first = self.sql(self.sessions[s], first["query"], first["params"])[0]
        except Refused as e:
            got_first = e
        notices_first = list(self.sessions[s].notices)
        thread, outcome = self.send_waiting(waiter, second, f"{self.sessions[s].label}'s")
        waited = self.wait_for(thread, waiter)
        self.sql(self.sessions[s], "COMMIT" if commit else "ROLLBACK")
        thread.join()
        got_second = self.answer_of(outcome)
        notices_second = list(waiter.notices)
        self.sql(waiter, "SET lock_timeout = '100ms'")
        saw("overlap waited" if waited else "overlap did not wait")
        self.judge_begin(first, got_first, notices_first,
                         rolled_back=not commit or isinstance(got_first, Refused))
        self.judge_begin(second, got_second, notices_second, rolled_back=False)

    @rule(**BEGINS)
    def begin_too(self, **call: Any) -> None:
        """Calls are most of what workers do: begin is drawn twice as often."""
        self.begin(**call)

    @rule(s=st.integers(0, SESSIONS - 1), r=WHOSE_RUN,
          reword=st.sampled_from([None, None, 0, 1, 2]))
    def new_attempt(self, s: int, r: int, reword: Optional[int] = None) -> None:
        """A worker starts the run's next attempt in its session (breaking
        another holder's lease, as a redelivery does) and makes the calls the
        run made so far again, in order (an honest replay) -- or with the
        reword-th call's args changed, as a model rewords a memo on a retry."""
        self.step("new_attempt", s, r, reword)
        r = self.whose(s, r)
        self.nested = True
        try:
            lease = self.model.leases.get(self.runs[r])
            if lease is not None and lease.session != s:
                self.break_lease(r)  # the run is redelivered: its hung holder is ended
            self.acquire(s, (r - s) % len(self.runs))
            calls = [call for run, call in self.calls if run == r and call[3] == "session"]
            for i, (tool, a, b, via, recorded) in enumerate(calls):
                if i == reword:
                    a = 1 - a
                self.begin(s, (r - s) % len(self.runs), tool, a, b, via, recorded)
        finally:
            self.nested = False

    def key(self, k: int) -> str:
        """Mostly one of the latest three keys (a worker reports what it just
        began, a person resolves what just paused), now and then any."""
        if k < 6:
            return self.keys[-1 - k % min(3, len(self.keys))]
        return self.keys[k % len(self.keys)]

    def attempt_of(self, key: str, mode: str) -> Optional[int]:
        effect = self.model.effects.get(key)  # none: a drifted call's key
        current = effect.attempt if effect else 1
        return {"current": current, "none": None, "earlier": max(current - 1, 1),
                "above": current + 1}[mode]

    @precondition(lambda self: self.keys)
    @rule(s=st.integers(0, SESSIONS - 1), k=st.integers(0, 7), completed=st.booleans(),
          v=st.integers(0, len(VALUES) - 1), mode=st.sampled_from(ATTEMPTS))
    def report(self, s: int, k: int, completed: bool, v: int, mode: str) -> None:
        self.step("report", s, k, completed, v, mode)
        self.report_on(s, self.key(k), completed, v, mode)

    @precondition(lambda self: self.last_report is not None)
    @rule()
    def report_again(self) -> None:
        """A worker sends its last report again (its answer was lost to a
        network error): the same report, which must change nothing."""
        self.step("report_again")
        self.report_on(*self.last_report)

    def report_on(self, s: int, key: str, completed: bool, v: int, mode: str) -> None:
        self.last_report = (s, key, completed, v, mode)
        value = VALUES[v]
        attempt = self.attempt_of(key, mode)
        fn = "complete_effect" if completed else "fail_effect"
        session = self.sessions[s]
        out = self.both(
            lambda: self.sql(session, f"SELECT {self.ROW} FROM durable_ledger.{fn}(%s, %s::jsonb, %s)",
                             (key, None if value is None else json.dumps(value), attempt)),
            lambda: self.model.report(s, key, completed, value, attempt))
        if out is None:
            return
        self.returned_row_agrees(fn, out[0], key)
        saw(f"{fn} {out[1]}")
        warned = "01L03" in session.notices
        if warned != (out[1] == "conflict"):
            self.fail(f"{fn}: the model says {out[1]}, the server "
                      + ("warned of a conflict" if warned else "did not warn of one"))
        superseded = "01L04" in session.notices
        if superseded != (out[1] == "superseded" and attempt is None):
            self.fail(f"{fn}: the model says {out[1]}, the server "
                      + ("warned of a superseded report" if superseded else "did not warn of one"))

    @rule(s=st.integers(0, SESSIONS - 1), r=WHOSE_RUN, completed=st.sampled_from([True, True, False]))
    def finish(self, s: int, r: int, completed: bool = True) -> None:
        """A worker reports every effect of the run still started as completed
        (or as failed: the provider refused), naming its attempt (then a next
        attempt has outcomes to replay)."""
        self.step("finish", s, r, completed)
        run = self.runs[self.whose(s, r)]
        self.nested = True
        try:
            for e in list(self.model.effects.values()):
                if e.run == run and e.status == "started" and e.key in self.keys:
                    self.report_on(s, e.key, completed, 0 if completed else 1, "current")
        finally:
            self.nested = False

    @rule(s=st.integers(0, SESSIONS - 1), r=WHOSE_RUN, completed=st.sampled_from([True, True, False]),
          reword=st.sampled_from([None, None, 0, 1]), model_call=st.booleans())
    def rerun(self, s: int, r: int, completed: bool, reword: Optional[int] = None,
              model_call: bool = False) -> None:
        """A run's attempt ends with every outcome reported, and the run is
        delivered again: its next attempt replays each call (completed, failed;
        a recorded call's answer) -- what the ledger is for -- or rewords one.
        With model_call, the attempt asked the model first (a recorded call),
        whose answer the next attempt replays."""
        self.step("rerun", s, r, completed, reword, model_call)
        mine = self.whose(s, r)
        if model_call and not any(run == mine and call[4] and call[3] == "session"
                                  for run, call in self.calls):
            self.calls.append((mine, ("llm", 0, None, "session", True)))
            self.call_begin(s, r, "llm", 0, None, "session", True, rolled_back=False)
        if reword is not None and not any(
                run == mine and call[0] in ("pay", "crm") and call[2] is None and call[3] == "session"
                and not call[4] for run, call in self.calls):
            # a reworded call drifts only from an earlier call of a judged tool: make one
            self.calls.append((mine, ("pay", 0, None, "session", False)))
            self.call_begin(s, r, "pay", 0, None, "session", False, rolled_back=False)
            reword = len([c for run, c in self.calls if run == mine and c[3] == "session"]) - 1
        self.nested = True
        try:
            self.finish(s, r, completed)
            self.nested = True  # (finish ended its own nesting)
            self.new_attempt(s, r, reword)
        finally:
            self.nested = False

    @precondition(lambda self: self.keys)
    @rule(k=st.integers(0, 7), completed=st.booleans(), v=st.integers(0, len(VALUES) - 1),
          mode=st.sampled_from(ATTEMPTS))
    def resolve(self, k: int, completed: bool, v: int, mode: str) -> None:
        self.step("resolve", k, completed, v, mode)
        key, value = self.key(k), VALUES[v]
        attempt = self.attempt_of(key, mode if mode != "none" else "current")
        outcome = "completed" if completed else "failed"
        out = self.both(
            lambda: self.sql(self.admin,
                             f"SELECT {self.ROW} FROM durable_ledger.resolve_effect(%s, %s, %s::jsonb,"
                             " 'model', NULL, %s)",
                             (key, outcome, None if value is None else json.dumps(value), attempt)),
            lambda: self.model.resolve(key, outcome, value, attempt))
        if out is not None:
            self.returned_row_agrees("resolve_effect", out[0], key)
            saw(f"resolve_effect {outcome}")

    @precondition(lambda self: self.keys)
    @rule(k=st.integers(0, 7), mode=st.sampled_from(["current", "current", "current", "earlier",
                                                     "above", "none"]))
    def retry(self, k: int, mode: str) -> None:
        """A person found that an attempt did not happen: do it again (retry_effect)."""
        self.step("retry", k, mode)
        key = self.key(k)
        attempt = self.attempt_of(key, mode)

        def model() -> None:
            if attempt is None:
                raise Refused("22004", "attempt is required")
            self.model.retry(key, attempt)
        got = self.both(
            lambda: self.sql(self.admin, f"SELECT {self.ROW}"
                             " FROM durable_ledger.retry_effect(%s, %s, 'model', NULL)",
                             (key, attempt)),
            model)
        if got is not None:
            self.returned_row_agrees("retry_effect", got[0], key)
            saw("retry_effect applied")

    @precondition(lambda self: self.keys)
    @rule(k=st.integers(0, 7), happened=st.booleans(), v=st.integers(0, len(VALUES) - 1),
          mode=st.sampled_from(["current", "current", "current", "earlier", "above"]))
    def reconcile(self, k: int, happened: bool, v: int, mode: str) -> None:
        """A worker settles an unknown outcome from the provider's record:
        reconcilable_from, then reconcile_effect (reference.md, "Reconcilers")."""
        self.step("reconcile", k, happened, v, mode)
        # mostly an effect a reconciler would be asked about: one found unknown
        unknown = [key for key in self.keys if key in self.model.effects
                   and self.model.effects[key].status == "unknown"]
        key = unknown[k % len(unknown)] if unknown and k < 6 else self.key(k)
        evidence = VALUES[v]
        attempt = self.attempt_of(key, mode)
        got = self.sql(self.admin, "SELECT f IS NOT NULL, f <= clock_timestamp()"
                       " FROM durable_ledger.reconcilable_from(%s, %s) f", (key, attempt))[0]
        want = self.model.reconcilable_from(key, attempt)
        if got != (want is not None, want):
            self.fail(f"reconcilable_from({key}, {attempt}) answered {got!r}, the model {want!r}")
        evidence = {"lookup": evidence}  # evidence is required: never NULL
        out = self.both(
            lambda: self.sql(self.admin, f"SELECT {self.ROW} FROM durable_ledger.reconcile_effect("
                             "%s, %s, %s, %s::jsonb)", (key, attempt, happened, json.dumps(evidence))),
            lambda: self.model.reconcile(key, attempt, happened, evidence))
        if out is None:
            return
        self.returned_row_agrees("reconcile_effect", out[0], key)
        saw(f"reconcile_effect {out[1]}")
        warned = "01L03" in self.admin.notices
        if warned != (out[1] == "conflict"):
            self.fail(f"reconcile_effect: the model says {out[1]}, the server "
                      + ("warned of a conflict" if warned else "did not warn of one"))

    @rule(s=st.integers(0, SESSIONS - 1), r=WHOSE_RUN, happened=st.booleans(),
          v=st.integers(0, len(VALUES) - 1))
    def lost_and_reconciled(self, s: int, r: int, happened: bool, v: int) -> None:
        """What reconcilers are for, start to end: the payments tool is made
        reconcilable, a worker begins a payment and dies, the next worker's
        call of it pauses (unknown), and the provider's record settles it
        (the rules above draw each step, and rarely all of them in a row)."""
        self.step("lost_and_reconciled", s, r, happened, v)
        self.nested = True
        try:
            self.set_reconcile("0", "pay")
            self.acquire(s, r)
            self.begin(s, r, "pay", 0, None, "session", False)
            self.kill(s)
            self.acquire(s, r)
            self.begin(s, r, "pay", 0, None, "session", False)
            if self.keys:  # (none when the run was abandoned, or the lease not had)
                self.reconcile(0, happened, v, "current")
        finally:
            self.nested = False

    @precondition(lambda self: len(self.steps) > 2)
    @rule(grace=st.sampled_from(["0", "0", "0", "1 hour", None]),
          short=st.sampled_from(["pay", "pay", "pay", "crm", "mail"]))
    def set_reconcile(self, grace: Optional[str], short: str) -> None:
        """An admin lets workers reconcile a tool's unknown outcomes, or not."""
        self.step("set_reconcile", grace, short)
        tool = self.tools[short]
        self.both(lambda: self.sql(self.admin, "SELECT FROM durable_ledger.set_reconcile(%s, %s,"
                                   " 'model')", (tool, grace)),
                  lambda: self.model.set_reconcile(tool, grace))

    @precondition(lambda self: self.keys)
    @rule(k=st.integers(0, 7))
    def status(self, k: int) -> None:
        self.step("status", k)
        key = self.key(k)
        got = self.sql(self.admin, f"SELECT {self.ROW} FROM durable_ledger.effect_status(%s)",
                       (key,))
        effect = self.model.effects.get(key)
        want = [self.model_row(effect, self.model.status_now(effect))] if effect else []
        if got != want:
            self.fail(f"effect_status({key}) answered {got!r}, the model {want!r}")

    # ---------- the registry, divergence ----------

    @precondition(lambda self: len(self.steps) > 5)
    @rule(setting=st.sampled_from(["off", "pause", "warn"]),
          short=st.sampled_from(["pay", "pay", "crm", "mail"]))
    def change_divergence(self, setting: str, short: str = "pay") -> None:
        """An admin changes a tool's divergence policy."""
        self.step("change_divergence", setting, short)
        tool = self.tools[short]
        self.both(lambda: self.sql(self.admin, "SELECT FROM durable_ledger.change_tool(%s, 'model',"
                                   " divergence => %s)", (tool, setting)),
                  lambda: self.model.change_divergence(tool, setting))

    @precondition(lambda self: len(self.steps) > 5)
    @rule(which=st.sampled_from(["tools", "divergence"]), setting=st.integers(0, 2))
    def unregistered_policy(self, which: str, setting: int) -> None:
        """An admin sets whether tools nobody registered may execute, or how
        their drift is judged."""
        self.step("unregistered_policy", which, setting)
        fn, words = (("set_unregistered_tools", ["allow", "warn", "refuse"]) if which == "tools"
                     else ("set_unregistered_divergence", ["pause", "warn", "off"]))
        out = self.both(lambda: self.sql(self.admin, f"SELECT durable_ledger.{fn}(%s, 'model')",
                                         (words[setting],))[0][0],
                        lambda: self.model.set_unregistered(which, words[setting]))
        if out and out[0] != out[1]:
            self.fail(f"{fn} answered {out[0]!r} as the previous setting, the model {out[1]!r}")

    @precondition(lambda self: len(self.steps) > 10 and (
        not self.model.tools[self.tools["mail"]].registered
        or any(t.retired for t in self.model.tools.values())))
    @rule(short=st.sampled_from(["mail", "mail", "pay", "llm"]), side_effecting=st.booleans(),
          divergence=st.sampled_from([None, None, "pause", "warn", "off"]))
    def register(self, short: str, side_effecting: bool, divergence: Optional[str]) -> None:
        """An admin registers the tool nobody registered mid-history (or a
        retired one anew; a registered one: 23505)."""
        self.step("register", short, side_effecting, divergence)
        tool = self.tools[short]
        self.both(lambda: self.sql(self.admin, "SELECT FROM durable_ledger.register_tool(%s, 'model',"
                                   " side_effecting => %s, divergence => %s)",
                                   (tool, side_effecting, divergence)),
                  lambda: self.model.register_tool(tool, side_effecting, divergence))

    @rule(short=st.sampled_from(["crm", "crm", "pay"]), fields=st.sampled_from(["n", "none"]))
    def change_key_fields(self, short: str, fields: str) -> None:
        """An admin changes a tool's key fields (refused once a call of it is
        recorded under a derived key); "none": the whole args again."""
        self.step("change_key_fields", short, fields)
        tool = self.tools[short]
        self.both(lambda: self.sql(self.admin, "SELECT FROM durable_ledger.change_tool(%s, 'model',"
                                   " key_fields => %s)", (tool, [fields] if fields != "none" else [])),
                  lambda: self.model.change_key_fields(tool, (fields,) if fields != "none" else None))

    @invariant()
    def leases_listed(self) -> None:
        """durable_ledger.leases lists the live leases of the history's runs:
        each session's with its pid and epoch (none: a lock whose epoch rolled
        back, of a run with no row then listed without its name), each token's."""
        pids = [session.pid for session in self.sessions]
        got = sorted(self.sql(
            self.admin, "SELECT run, lease_epoch, kind, holder_pid FROM durable_ledger.leases"
            " WHERE run LIKE %s OR holder_pid = ANY(%s)", (self.prefix + "%", pids), quiet=True),
            key=repr)
        want = (((run if lease.epoch is not None or self.model.epochs.get(run) else None),
                       lease.epoch, "session" if lease.session is not None else "token",
                       pids[lease.session] if lease.session is not None else None)
                      for run, lease in self.model.leases.items())
        want = sorted(want, key=repr)
        if got != want:
            self.fail(f"durable_ledger.leases lists {got!r}, the model {want!r}")

    @precondition(lambda self: len(self.steps) > 20)
    @rule(short=st.sampled_from(["pay", "llm", "mail"]), side_effecting=st.booleans())
    def change_side_effecting(self, short: str, side_effecting: bool) -> None:
        """An admin says a tool is (not) side-effecting: its recorded calls are
        refused from then on, or allowed."""
        self.step("change_side_effecting", short, side_effecting)
        tool = self.tools[short]
        self.both(lambda: self.sql(self.admin, "SELECT FROM durable_ledger.change_tool(%s, 'model',"
                                   " side_effecting => %s)", (tool, side_effecting)),
                  lambda: self.model.change_side_effecting(tool, side_effecting))

    @precondition(lambda self: len(self.steps) > 25)
    @rule(short=st.sampled_from(["pay", "llm", "mail"]))
    def retire(self, short: str) -> None:
        self.step("retire", short)
        tool = self.tools[short]
        self.both(lambda: self.sql(self.admin, "SELECT FROM durable_ledger.retire_tool(%s, 'model')",
                                   (tool,)),
                  lambda: self.model.retire_tool(tool))

    @precondition(lambda self: self.model.divergences)
    @rule(d=st.integers(0, 3), verdict=st.sampled_from(["same", "same", "distinct"]),
          same_as=st.sampled_from([None, None, "earliest", "wrong"]))
    def resolve_divergence(self, d: int, verdict: str, same_as: Optional[str]) -> None:
        """A person's verdict on a drifted call: the same as the effect it may
        duplicate (or another earlier effect, or one that is not), or distinct."""
        self.step("resolve_divergence", d, verdict, same_as)
        # in the order they were recorded, not by key: a key is a hash of the
        # history's own prefix, so an order by key would make the same draws
        # choose another divergence when Hypothesis replays the history
        divergences = list(self.model.divergences.values())
        div = divergences[d % len(divergences)]
        earlier = self.model.earlier_effects(div.run, div.epoch, div.tool)
        given = {None: None, "earliest": earlier[0].key if earlier else None,
                 "wrong": div.key}[same_as]
        if self.both(lambda: self.sql(self.admin, "SELECT FROM durable_ledger.resolve_divergence("
                                      "%s, %s, 'model', NULL, %s)", (div.key, verdict, given)),
                     lambda: self.model.resolve_divergence(div.key, verdict, given)) is not None:
            saw(f"resolve_divergence {verdict}")

    # ---------- what is recorded, after every step ----------

    @invariant()
    def divergences_agree(self) -> None:
        got = self.sql(self.admin, "SELECT key, run, lease_epoch, tool, occurrence, candidate_key,"
                       " args, verdict, same_as FROM durable_ledger.divergences WHERE run LIKE %s"
                       " ORDER BY key", (self.prefix + "%",), quiet=True)
        want = [(d.key, d.run, d.epoch, d.tool, d.occurrence, d.candidate, d.args, d.verdict,
                 d.same_as)
                for d in sorted(self.model.divergences.values(), key=lambda d: d.key)]
        if got != want:
            self.fail(f"the divergences differ:\n  server {got!r}\n  model  {want!r}")

    # an effect's row as the model predicts it: every column the calls of a
    # history set (no call passes meta or a note; resolutions are by "model")
    ROW = ("key, run, tool, status::text, attempt, lease_epoch, conflict, business_key, occurrence,"
           " safe_to_redo, result, error, args, forked_from, execute_again, resolved_by,"
           " resolution_note, meta, holder_pid, completed_at IS NOT NULL")

    def model_row(self, e: Any, status: Optional[str] = None) -> tuple:
        return (e.key, e.run, e.tool, status or e.status, e.attempt, e.epoch, e.conflict,
                e.business_key, e.occurrence, e.safe_to_redo, e.result, e.error, e.args,
                e.forked_from, e.execute_again, e.resolved_by, None, None,
                self.holders.get(e.key), e.status in ("completed", "failed"))

    def returned_row_agrees(self, what: str, rows: list[tuple], key: str) -> None:
        """The row a report or a person's decision returned is the effect as the model has it."""
        want = self.model_row(self.model.effects[key])
        if rows != [want]:
            self.fail(f"{what} returned {rows!r}, the model's effect is {want!r}")

    @invariant()
    def rows_agree(self) -> None:
        got = self.sql(self.admin, f"SELECT {self.ROW} FROM durable_ledger.effects"
                       " WHERE run LIKE %s OR key LIKE %s ORDER BY key",
                       (self.prefix + "%", self.prefix + "%"), quiet=True)
        want = [self.model_row(e) for e in sorted(self.model.effects.values(), key=lambda e: e.key)]
        if got != want:
            diff = [f"  server {g!r}\n  model  {w!r}" for g, w in itertools.zip_longest(got, want)
                    if g != w]
            self.fail("the effects differ:\n" + "\n".join(diff))

    @invariant()
    def keys_check_out(self) -> None:
        """Every derived key is the one keys.md derives in plain SQL from the
        effect's run, tool, occurrence and (identity) args: effect_key and
        canonical_args as the reference gives them."""
        wrong = self.sql(
            self.admin,
            "SELECT e.key FROM durable_ledger.effects e LEFT JOIN durable_ledger.tools t USING (tool)"
            " WHERE e.run LIKE %s AND NOT e.business_key AND e.key <> encode(sha256(convert_to("
            "concat_ws('|', 'durable_ledger.v1', octet_length(e.run), e.run, octet_length(e.tool),"
            " e.tool, e.occurrence, durable_ledger.canonical_args(coalesce((SELECT"
            " jsonb_object_agg(f, e.args -> f) FROM unnest(t.key_fields) f), e.args))),"
            " 'UTF8')), 'hex')", (self.prefix + "%",), quiet=True)
        if wrong:
            self.fail(f"derived keys that keys.md does not derive: {wrong!r}")

    @invariant()
    def past_attempts_agree(self) -> None:
        got = self.sql(self.admin, "SELECT key, attempt, run, lease_epoch, status::text, error,"
                       " resolved_by FROM durable_ledger.past_attempts WHERE run LIKE %s"
                       " ORDER BY key, attempt", (self.prefix + "%",), quiet=True)
        want = sorted((e.key, p.attempt, p.run, p.epoch, p.status, p.error, p.resolved_by)
                      for e in self.model.effects.values() for p in e.past)
        if got != want:
            self.fail(f"the past attempts differ:\n  server {got!r}\n  model  {want!r}")

    @invariant()
    def leases_agree(self) -> None:
        runs = self.sql(self.admin, "SELECT run, epochs FROM durable_ledger.runs WHERE run LIKE %s",
                        (self.prefix + "%",), quiet=True)
        want = {run: n for run, n in self.model.epochs.items() if n > 0}
        if dict(runs) != want:
            self.fail(f"the runs' epochs are {dict(runs)!r}, the model's {want!r}")
        for s, session in enumerate(self.sessions):
            got = self.sql(session, "SELECT r, durable_ledger.session_epoch(r)"
                           " FROM unnest(%s::text[]) r", (self.runs,), quiet=True)
            wanted = [(run, self.model.session_epoch(s, run)) for run in self.runs]
            if got != wanted:
                self.fail(f"{session.label}'s session_epoch: {got!r}, the model's {wanted!r}")

    @invariant()
    def unresolved_agrees(self) -> None:
        got = {k for (k,) in self.sql(
            self.admin, "SELECT key FROM durable_ledger.unresolved WHERE run LIKE %s",
            (self.prefix + "%",), quiet=True)}
        want = self.model.unresolved()
        if got != want:
            self.fail(f"unresolved lists {sorted(got)}, the model {sorted(want)}")

    def alike(self) -> str:
        """The history as SQL with what differs from one run of the same
        draws to the next named by order of appearance: its prefix, the keys
        (hashes of the prefix), the tokens and backend pids the server chose."""
        text = "\n".join(self.transcript).replace(self.prefix, "<history>-")
        for i, token in enumerate(self.tokens):
            text = text.replace(token, f"<token {i}>")
        text = re.sub(r"pg_terminate_backend\(\d+\)", "pg_terminate_backend(<pid>)", text)
        for session in self.sessions + [self.admin]:  # a row's holder_pid
            for i, pid in enumerate(session.pids):
                text = re.sub(rf"\b{pid}\b", f"<pid {session.label}.{i}>", text)
        names: dict[str, str] = {}
        return re.sub(r"\b[0-9a-f]{64}\b",
                      lambda m: names.setdefault(m.group(0), f"<key {len(names)}>"), text)

    def teardown(self) -> None:
        finished.append(self.alike())
        try:
            problems = self.sql(self.admin, "SELECT * FROM durable_ledger.verify_audit()")
            if problems:
                self.fail(f"verify_audit found {problems!r}")
        finally:
            for session in self.sessions + [self.admin]:
                session.close()


def replay(steps: list[list[Any]]) -> None:
    """Runs a kept history again, checking the invariants after each step."""
    machine = LedgerMachine()
    try:
        for name, *args in steps:
            getattr(machine, name)(*args)
            machine.rows_agree()
            machine.leases_agree()
            machine.unresolved_agrees()
            machine.divergences_agree()
            machine.past_attempts_agree()
            machine.keys_check_out()
            machine.metrics_agree()
            machine.events_counted()
            machine.leases_listed()
    finally:
        machine.teardown()
