"""The ledger's contract as an executable reference model.

Written from docs/reference.md and docs/leases.md, not from the C code: each
method says what a call must answer and what it must leave recorded.  The
state machine (machine.py) makes the same calls against a real server and
compares.  Where the docs are silent the model's choice is written in
CONTRIBUTING.md ("The model").

The model knows nothing of key derivation: a derived-key effect is named by
what identifies it -- (run, tool, canonical args, occurrence) -- and the key
the server returned is remembered for it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, Optional


class Refused(Exception):
    """A call the contract refuses: its SQLSTATE, and nothing written."""

    def __init__(self, sqlstate: str, why: str):
        super().__init__(f"{sqlstate}: {why}")
        self.sqlstate = sqlstate
        self.why = why


def canonical(args: Any) -> str:
    """Equal JSON is equal here; the server's canonical text is its own."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"))


@dataclass
class Lease:
    """One live lease of a run: a session's (by session id) or a token's."""

    run: str
    epoch: Optional[int]  # None: a session's lock whose epoch rolled back
    session: Optional[int] = None  # session lease: the session holding it
    token: Optional[str] = None  # token lease: its token


@dataclass
class Attempt:
    attempt: int
    run: str
    epoch: int
    status: str
    error: Any = None
    resolved_by: Optional[str] = None


@dataclass
class Effect:
    key: str
    tool: str
    args: Any
    business_key: bool
    occurrence: Optional[int]
    safe_to_redo: bool
    run: str  # the run whose lease started the current attempt
    epoch: int
    begun: int = 0  # when its current attempt began, in the model's order
    attempt: int = 1
    status: str = "started"
    result: Any = None
    error: Any = None
    conflict: bool = False
    execute_again: bool = False  # failed, and a person asked for the next attempt (retry_effect)
    resolved_by: Optional[str] = None  # who resolved it or asked for it again (the machine: 'model')
    past: list[Attempt] = field(default_factory=list)
    forked_from: Optional[str] = None  # the source run's effect it carries
    logged_by: set = field(default_factory=set)  # the runs whose calls of it were logged


@dataclass
class Answer:
    """A decision, as begin_effect returns it (the columns compared)."""

    key: Optional[str]
    decision: str
    status: Optional[str]
    occurrence: Optional[int]
    attempt: Optional[int]
    result: Any = None
    error: Any = None


@dataclass
class Tool:
    """A tool as the registry has it; registered False: nobody registered it."""

    side_effecting: bool = True
    divergence: str = "off"
    registered: bool = True
    retired: bool = False
    key_fields: Optional[tuple] = None  # the fields of args that make a call's identity
    reconcile_grace: Optional[str] = None  # set_reconcile's grace ('0', '1 hour'); None: a person


@dataclass
class Divergence:
    """A drifted call paused for a person (durable_ledger.divergences)."""

    key: str
    run: str
    epoch: int
    tool: str
    occurrence: int
    candidate: str
    args: Any = None  # the drifted call's, as given
    verdict: Optional[str] = None
    same_as: Optional[str] = None


@dataclass
class Progress:
    """How far an attempt replayed a tool's earlier effects (divergence)."""

    unwatched: bool = False  # called while its policy was off: not judged in this attempt
    replayed: set = field(default_factory=set)  # the earlier effects replayed, each once
    earlier: Optional[int] = None  # how many earlier effects there are, counted once


class Model:
    """The ledger as the reference describes it, for the runs of one history."""

    def __init__(self, tools: dict[str, Tool]):
        self.tools = tools
        self.epochs: dict[str, int] = {}  # run -> epochs so far (runs.epochs)
        self.abandoned: set[str] = set()
        self.heard: set[str] = set()  # runs whose lock ended without an epoch: in the audit log
        self.leases: dict[str, Lease] = {}  # run -> its live lease
        self.held: dict[int, dict[str, int]] = {}  # session -> run -> epoch it holds
        self.lost: dict[int, set[str]] = {}  # session -> runs whose lock it lost behind the ledger's back
        self.tokens: dict[str, Lease] = {}  # every token taken, live or not
        self.counters: dict[tuple, int] = {}  # (run, epoch, tool, canon) -> calls
        self.effects: dict[str, Effect] = {}  # key -> effect
        self.derived: dict[tuple, str] = {}  # (run, tool, canon, occurrence) -> key
        self.executed: set[tuple[str, int]] = set()  # (key, attempt) answered execute
        self.divergences: dict[str, Divergence] = {}
        self.progress: dict[tuple, Progress] = {}  # (run, epoch, tool) -> its progress
        self.unregistered_tools = "allow"  # set_unregistered_tools
        self.unregistered_divergence = "pause"  # set_unregistered_divergence
        self.clock = 0  # orders the effects' attempts by when they began
        self.warned = False  # the last begin warned of a divergence (01L01)
        self.warned_unregistered = False  # ... of a tool nobody registered (01L02)

    # ---------- leases ----------

    def _new_epoch(self, run: str) -> int:
        self.epochs[run] = self.epochs.get(run, 0) + 1
        return self.epochs[run]

    def live(self, run: str, epoch: int) -> bool:
        lease = self.leases.get(run)
        return lease is not None and lease.epoch is not None and lease.epoch == epoch

    def _end(self, run: str) -> None:
        lease = self.leases.pop(run, None)
        if lease is not None and lease.session is not None:
            self.held.get(lease.session, {}).pop(run, None)

    def acquire_run(self, session: int, run: str, wait: bool = False) -> bool:
        """acquire_run(run, wait): a new attempt, in a lease this session
        holds or takes (also of a run whose lock it lost: the new attempt the
        loss asks for).  Another session's lease or a token lease: false at
        once without wait; with it, 55P03 (the wait outlasts lock_timeout;
        a token lease's at once)."""
        if run in self.abandoned:
            raise Refused("55L02", "the run was abandoned")
        lease = self.leases.get(run)
        if lease is not None and lease.session != session:
            if wait:
                raise Refused("55P03", "the run's lease was not granted in time")
            return False
        self.lost.get(session, set()).discard(run)
        epoch = self._new_epoch(run)
        self.leases[run] = Lease(run, epoch, session=session)
        self.held.setdefault(session, {})[run] = epoch
        return True

    def known(self, run: str) -> bool:
        """Has the ledger heard of run: an epoch of it, or a line of its audit
        log (a lock held without an epoch, released or broken, is logged)."""
        return run in self.epochs or run in self.heard

    def release_run(self, session: int, run: str) -> bool:
        """False when the session does not hold run, also when it lost its
        lock (then the lost epoch is recorded as ended: the session's next
        call of run takes a new lease)."""
        if run in self.lost.get(session, set()):
            self.lost[session].discard(run)
            self.heard.add(run)
            return False
        if run not in self.held.get(session, {}):
            return False
        self.heard.add(run)
        self._end(run)
        return True

    def session_ended(self, session: int) -> None:
        """The session's connection ended (killed, or a lease broken)."""
        for run in list(self.held.get(session, {})):
            self._end(run)
        self.held.pop(session, None)
        self.lost.pop(session, None)

    def locks_lost(self, session: int) -> None:
        """pg_advisory_unlock_all() in the session: every run's lock it held
        is gone behind the ledger's back (the run is free for others), and
        the session remembers each (its next call of it: 55000)."""
        for run in list(self.held.get(session, {})):
            self._end(run)
            self.lost.setdefault(session, set()).add(run)

    def session_epoch(self, session: int, run: str) -> Optional[int]:
        return self.held.get(session, {}).get(run)

    def take_lease(self, session: int, run: str, token_of_server: Optional[str]) -> Optional[str]:
        """take_lease(run): a new epoch, or None at once when the run is held."""
        if run in self.abandoned:
            raise Refused("55L02", "the run was abandoned")
        if run in self.leases:
            return None
        assert token_of_server is not None, "the server gave no token for a free run"
        epoch = self._new_epoch(run)
        lease = Lease(run, epoch, token=token_of_server)
        self.leases[run] = lease
        self.tokens[token_of_server] = lease
        return token_of_server

    def token_live(self, token: str) -> bool:
        lease = self.tokens[token]
        return self.leases.get(lease.run) is lease

    def renew_lease(self, token: str) -> None:
        if not self.token_live(token):
            raise Refused("55L01", "the token lease is lost")

    def release_lease(self, token: str) -> bool:
        if not self.token_live(token):
            return False
        self._end(self.tokens[token].run)
        return True

    def token_expired(self, token: str) -> None:
        if self.token_live(token):
            self._end(self.tokens[token].run)

    def break_lease(self, run: str) -> Optional[int]:
        """break_lease: False when nobody holds it; a session holder is terminated.

        Returns the session terminated (or None), raises nothing: the caller
        knows it returned true or false from whether the run was held."""
        lease = self.leases.get(run)
        if lease is None:
            return None
        self.heard.add(run)
        if lease.session is not None:
            session = lease.session
            self.session_ended(session)
            return session
        self._end(run)
        return None

    def release_attempt(self, session: int, run: str, epoch: int) -> tuple[bool, Optional[int]]:
        """release_attempt(run, epoch): the session lease of run at epoch ends
        wherever it is held (its holder terminated when it is another
        session); false when no live session lease holds run at epoch.
        Returns the answer and the session terminated, if any."""
        if epoch < 1:
            raise Refused("22023", "an epoch below 1")
        lease = self.leases.get(run)
        if lease is None or lease.session is None or lease.epoch != epoch:
            return False, None
        if lease.session == session:
            self._end(run)
            return True, None
        holder = lease.session
        self.session_ended(holder)
        return True, holder

    def run_effects(self, run: str) -> list[Effect]:
        """The effects run recorded under derived keys, in the order they were begun."""
        return sorted((e for e in self.effects.values() if e.run == run and not e.business_key),
                      key=lambda e: (e.begun, e.key))

    def fork_run(self, source: str, new: str, up_to: str, key_of_server: Any) -> int:
        """fork_run(source, new, up_to): a run the ledger never saw, carrying
        source's derived-key effects up to up_to in begin order, each settled
        (completed or failed, not flagged) under new's key for the same call,
        with its outcome, attempt and forked_from; a recorded call without an
        outcome is not carried (the new run makes it again).  Its attempts
        start at epoch 2.  Returns how many it carries."""
        if source == new:
            raise Refused("22023", "a run cannot be forked into itself")
        if self.known(new) or new in self.leases:
            raise Refused("42710", "the new run exists already")
        if not self.known(source):
            raise Refused("42704", "the source run is not in the ledger")
        effects = self.run_effects(source)
        keys = [e.key for e in effects]
        if up_to not in keys:
            raise Refused("22023", "up_to is not a derived-key effect of the source run")
        carried = []
        for e in effects[:keys.index(up_to) + 1]:
            if e.safe_to_redo and e.status == "started" and not e.conflict:
                continue
            if e.conflict or e.status not in ("completed", "failed"):
                raise Refused("55000", "an effect carried has no settled outcome")
            carried.append(e)
        for e in carried:
            key = key_of_server(e.tool, e.args, e.occurrence)
            self.clock += 1
            self.effects[key] = Effect(key, e.tool, copy.deepcopy(e.args), False, e.occurrence,
                                       e.safe_to_redo, new, 1, begun=self.clock,
                                       attempt=e.attempt, status=e.status,
                                       result=e.result, error=e.error, forked_from=e.key,
                                       resolved_by=e.resolved_by)
            self.derived[(new, e.tool, canonical(self.identity(e.tool, e.args)), e.occurrence)] = key
        self.epochs[new] = 1
        return len(carried)

    def purge_settled(self) -> dict[str, tuple[int, int, int]]:
        """purge_settled('0', dry_run => false): every run whose effects are
        all completed or failed (a started recorded call counts as settled),
        none flagged, with no divergence waiting, held by no live lease, nor
        is any run that shares its effects (an earlier attempt's, a call of a
        business key), loses its effects with their replaced attempts and
        its divergences.  Returns run -> (effects, past attempts, divergences)."""
        purged = {}
        for run in sorted(self.epochs):
            mine = [e for e in self.effects.values() if e.run == run]
            # a retry a person asked for waits for the run's next call: not settled
            if not mine or any(e.conflict or e.execute_again
                               or (e.status not in ("completed", "failed")
                                   and not (e.status == "started" and e.safe_to_redo))
                               for e in mine):
                continue
            if any(d.run == run and d.verdict is None for d in self.divergences.values()):
                continue
            sharing = {run} | {p.run for e in mine for p in e.past} | \
                {r for e in mine for r in e.logged_by}
            if any(self.live(r, self.epochs.get(r, 0)) for r in sharing):
                continue
            divergences = [k for k, d in self.divergences.items() if d.run == run]
            purged[run] = (len(mine), sum(len(e.past) for e in mine), len(divergences))
            for e in mine:
                del self.effects[e.key]
                self.executed = {(k, a) for k, a in self.executed if k != e.key}
            self.derived = {ident: k for ident, k in self.derived.items() if k in self.effects}
            for k in divergences:
                del self.divergences[k]
        return purged

    def abandon_run(self, run: str) -> bool:
        if not self.epochs.get(run):  # a run with no epoch yet has nothing to stop
            raise Refused("42704", "the run is not in the ledger")
        if run in self.abandoned:
            return False
        self.abandoned.add(run)
        return True

    # ---------- begin ----------

    def _lease_for_call(self, session: int, run: str, token: Optional[str]) -> Optional[int]:
        """The epoch a call of run runs in; None: the session takes one."""
        if token is not None:
            lease = self.tokens.get(token)
            if lease is not None and lease.run != run:
                raise Refused("22023", "a token lease's token passed with another run")
            if lease is None or not self.token_live(token):
                raise Refused("55L01", "the token lease is lost")
            return lease.epoch
        if run in self.lost.get(session, set()):
            raise Refused("55000", "the lease on the run was lost")
        held = self.held.get(session, {})
        if run not in held and run in self.abandoned:
            raise Refused("55L02", "the run was abandoned (before waiting for its lease)")
        if run not in held and run in self.leases:
            raise Refused("55P03", "the run's lease was not granted in time")
        return held.get(run)

    def begin(self, session: int, run: str, tool: str, args: Any,
              business_key: Optional[str] = None, token: Optional[str] = None,
              recorded: bool = False, key_of_server: Any = None) -> Answer:
        """begin_effect / begin_recorded.

        A session that holds no epoch of the run takes its lease and starts
        one; when the call then fails, the epoch rolls back with it but the
        lock stays held (leases.md): the session holds the run without an
        epoch until its next call or acquire_run starts one."""
        epoch = self._lease_for_call(session, run, token)
        taken = epoch is None
        saved = copy.deepcopy(self.__dict__)  # an error writes nothing
        self.warned = self.warned_unregistered = False
        if taken:
            epoch = self._new_epoch(run)
        try:
            answer = self._begin(run, epoch, tool, args, business_key, recorded,
                                 key_of_server)
        except Refused:
            self.__dict__.update(saved)
            if taken:
                self.leases[run] = Lease(run, None, session=session)
                self.held.setdefault(session, {})[run] = None
            raise
        if taken:
            self.leases[run] = Lease(run, epoch, session=session)
            self.held.setdefault(session, {})[run] = epoch
        return answer

    def begin_rolled_back(self, session: int, run: str, tool: str, args: Any,
                          business_key: Optional[str] = None, token: Optional[str] = None,
                          recorded: bool = False, key_of_server: Any = None) -> Answer:
        """A begin whose transaction then rolls back: it answers as begin
        would, and leaves nothing -- no effect, no count, no epoch -- but the
        lock a session took for it (held without an epoch)."""
        trial = copy.deepcopy(self)
        took = token is None and run not in self.held.get(session, {})
        try:
            return trial.begin(session, run, tool, args, business_key, token, recorded,
                               key_of_server)
        finally:
            self.warned, self.warned_unregistered = trial.warned, trial.warned_unregistered
            if took and run in trial.held.get(session, {}):
                self.leases[run] = Lease(run, None, session=session)
                self.held.setdefault(session, {})[run] = None

    def _begin(self, run, epoch, tool, args, business_key, recorded, key_of_server) -> Answer:
        if run in self.abandoned:
            raise Refused("55L02", "the run was abandoned")
        if recorded and self.tools[tool].registered and self.tools[tool].side_effecting:
            raise Refused("55L03", "begin_recorded of a tool registered as side-effecting")
        canon = canonical(self.identity(tool, args))
        occurrence = None
        if business_key is None:
            occurrence = self.counters.get((run, epoch, tool, canon), 0) + 1
            ident = (run, tool, canon, occurrence)
            key = self.derived.get(ident)
            if key is None:
                key = key_of_server(occurrence)
                assert key not in self.effects, \
                    f"the server's key {key} for {ident} is another effect's"
        else:
            key = business_key
        effect = self.effects.get(key)
        if effect is not None and business_key is not None:
            if effect.tool != tool or canonical(self.identity(tool, effect.args)) != canon:
                raise Refused("23505", "business key already used by a different call")
        if business_key is None:
            self.derived[(run, tool, canon, occurrence)] = key
        self.warned = False
        progress, watched = Progress(), False  # a business key is never judged
        if business_key is None:
            progress, watched = self._progress_start(run, epoch, tool, recorded)
        answer = None
        same = False  # decided as a call of the earlier effect a verdict named
        if effect is None and business_key is None:
            answer, effect = self._judge_drift(run, epoch, tool, args, key, occurrence, recorded,
                                               progress, watched)
            if effect is not None:
                key = effect.key  # a person said it is that earlier effect
                same = True
        if answer is None:
            answer = self._decide(run, epoch, tool, args, key, business_key is not None,
                                  occurrence, recorded, effect, progress, watched, same)
        if answer.decision == "execute":
            self._may_execute(tool)
        if answer.decision != "pause" and business_key is None:
            self.counters[(run, epoch, tool, canon)] = occurrence
            if answer.decision == "replay" and watched:
                progress.replayed.add(answer.key)
        if answer.decision == "execute":
            assert (answer.key, answer.attempt) not in self.executed, \
                f"execute answered twice for {answer.key} attempt {answer.attempt}"
            self.executed.add((answer.key, answer.attempt))
        if answer.key in self.effects:
            self.effects[answer.key].logged_by.add(run)
        return answer

    # ---------- divergence ----------

    def policy(self, tool: str) -> str:
        t = self.tools[tool]
        return t.divergence if t.registered else self.unregistered_divergence

    def _progress_start(self, run: str, epoch: int, tool: str, recorded: bool
                        ) -> tuple[Progress, bool]:
        """The attempt's progress on the tool, and whether the call is watched:
        a later attempt, the tool's policy not off, and not called while it
        was off earlier in this attempt."""
        progress = self.progress.setdefault((run, epoch, tool), Progress())
        if epoch <= 1:
            return progress, False
        if self.policy(tool) == "off":
            progress.unwatched = True
            return progress, False
        return progress, not progress.unwatched

    def earlier_effects(self, run: str, epoch: int, tool: str) -> list[Effect]:
        """The effects of tool the run's attempts before epoch recorded under
        derived keys, in the order they were begun."""
        return sorted((e for e in self.effects.values()
                       if e.run == run and e.tool == tool and not e.business_key
                       and e.epoch < epoch), key=lambda e: (e.begun, e.key))

    def _earlier_count(self, run: str, epoch: int, tool: str, progress: Progress) -> int:
        if progress.earlier is None:
            progress.earlier = len(self.earlier_effects(run, epoch, tool))
        return progress.earlier

    def _judge_drift(self, run, epoch, tool, args, key, occurrence, recorded, progress, watched):
        """A new derived key: (a pause answer, or None to decide; the effect a
        verdict of same made it, or None)."""
        if epoch <= 1:
            return None, None
        # once recorded, a divergence decides its key whichever way it is called
        recorded_divergence = self.divergences.get(key)
        if recorded_divergence is not None:
            if recorded_divergence.verdict == "same":
                return None, self.effects[recorded_divergence.same_as]
            # it waits while the tool's policy is not off, watched in this attempt or not
            if recorded_divergence.verdict is None and self.policy(tool) != "off":
                return Answer(key, "pause", None, occurrence, None), None
            return None, None
        judged = self.tools[tool].registered or not recorded
        if not judged or not watched or self._earlier_count(run, epoch, tool, progress) <= len(progress.replayed):
            return None, None
        candidate = next(e.key for e in self.earlier_effects(run, epoch, tool)
                         if e.key not in progress.replayed)
        if self.policy(tool) == "warn":
            self.warned = True
            return None, None
        self.divergences[key] = Divergence(key, run, epoch, tool, occurrence, candidate,
                                           copy.deepcopy(args))
        return Answer(key, "pause", None, occurrence, None), None

    def resolve_divergence(self, key: str, verdict: str, same_as: Optional[str]) -> None:
        d = self.divergences.get(key)
        if d is None:
            raise Refused("42704", "no divergence has the key")
        if verdict == "distinct" and same_as is not None:
            raise Refused("22023", "same_as given with distinct")
        if d.verdict is not None:
            raise Refused("55000", "the divergence was decided")
        if key in self.effects:
            raise Refused("55000", "the drifted call was executed since")
        if verdict == "same":
            same_as = same_as or d.candidate
            earlier = self.effects.get(same_as)
            # the divergence's own candidate was an earlier effect when it was
            # found, also if a recorded call's redo has moved it since
            if earlier is None or earlier.run != d.run or earlier.tool != d.tool \
                    or earlier.business_key or (earlier.epoch >= d.epoch and same_as != d.candidate):
                raise Refused("22023", "same_as is not an earlier effect of the tool in the run")
        d.verdict, d.same_as = verdict, same_as

    def _changeable(self, tool: str, retired_too: bool = False) -> Tool:
        """The registered tool change_tool changes (42704: none; 55000: retired)."""
        t = self.tools[tool]
        if not t.registered:
            raise Refused("42704", "the tool is not registered")
        if t.retired and not retired_too:
            raise Refused("55000", "the tool is retired")
        return t

    def change_divergence(self, tool: str, setting: str) -> None:
        self._changeable(tool).divergence = setting

    def set_reconcile(self, tool: str, grace: Optional[str]) -> None:
        self._changeable(tool).reconcile_grace = grace

    def identity(self, tool: str, args: Any) -> Any:
        """The args that identify a call: its tool's key fields, else all of them."""
        t = self.tools[tool]
        if not t.registered or t.key_fields is None:
            return args
        if not isinstance(args, dict) or any(f not in args for f in t.key_fields):
            raise Refused("22023", "the args lack a key field of the tool")
        return {f: args[f] for f in t.key_fields}

    def _may_execute(self, tool: str) -> None:
        """A call that would execute: refused for a retired tool, and for one
        nobody registered under policy refuse; warned of under warn (01L02)."""
        t = self.tools[tool]
        if t.registered and t.retired:
            raise Refused("55L03", "a call of a retired tool would execute")
        if not t.registered and self.unregistered_tools == "refuse":
            raise Refused("55L03", "a tool nobody registered, under policy refuse")
        self.warned_unregistered = not t.registered and self.unregistered_tools == "warn"

    def set_unregistered(self, which: str, setting: str) -> str:
        """set_unregistered_tools / set_unregistered_divergence: the previous setting."""
        attribute = "unregistered_tools" if which == "tools" else "unregistered_divergence"
        previous = getattr(self, attribute)
        setattr(self, attribute, setting)
        return previous

    def register_tool(self, tool: str, side_effecting: bool, divergence: Optional[str]) -> None:
        """register_tool: a tool nobody registered, or a retired one anew."""
        t = self.tools[tool]
        if t.registered and not t.retired:
            raise Refused("23505", "the tool is registered")
        if t.registered:  # anew, with no key fields: as change_tool would change them
            self.change_key_fields(tool, None, retired_too=True)
        t.registered, t.retired, t.side_effecting = True, False, side_effecting
        t.reconcile_grace = None  # (anew too: register_tool gives the rules it is given)
        t.divergence = divergence or ("pause" if side_effecting else "off")

    def change_key_fields(self, tool: str, key_fields: Optional[tuple],
                          retired_too: bool = False) -> None:
        """change_tool(key_fields => ...): only while no call of the tool is
        recorded under a derived key (its replays would get other keys)."""
        t = self._changeable(tool, retired_too)
        if key_fields == t.key_fields:
            return  # no change
        if any(e.tool == tool and not e.business_key for e in self.effects.values()):
            raise Refused("55000", "calls of the tool are recorded under derived keys")
        t.key_fields = key_fields

    def change_side_effecting(self, tool: str, side_effecting: bool) -> None:
        self._changeable(tool).side_effecting = side_effecting

    def retire_tool(self, tool: str) -> None:
        t = self.tools[tool]
        if not t.registered:
            raise Refused("42704", "the tool is not registered")
        t.retired = True

    def _decide(self, run, epoch, tool, args, key, business_key, occurrence, recorded,
                effect: Optional[Effect], progress: Progress, watched: bool,
                same: bool = False) -> Answer:
        def answer(decision, status, attempt, result=None, error=None):
            return Answer(key, decision, status, occurrence, attempt, result, error)

        if effect is None:
            self.clock += 1
            self.effects[key] = Effect(key, tool, args, business_key, occurrence, recorded,
                                       run, epoch, begun=self.clock)
            return answer("execute", "started", 1)
        if effect.conflict:
            # the row's status as recorded (a started one stays started: reference.md)
            return answer("pause", effect.status, effect.attempt)
        if effect.status == "completed":
            return answer("replay", "completed", effect.attempt, result=effect.result)
        if effect.status == "failed":
            # a retry is of the effect's own call: a drifted one a verdict made
            # the same replays its failure (it would execute other args)
            if business_key or (effect.execute_again and not same):
                if watched and not business_key:  # counted before its row moves, as a redo
                    self._earlier_count(run, epoch, tool, progress)
                    progress.replayed.add(effect.key)
                self._next_attempt(effect, run, epoch, "failed", recorded)
                return answer("execute", "started", effect.attempt)
            return answer("replay", "failed", effect.attempt, error=effect.error)
        if effect.status == "unknown":
            return answer("pause", "unknown", effect.attempt)
        # started
        if self.live(effect.run, effect.epoch):
            return answer("in_progress", "started", effect.attempt)
        if recorded and effect.safe_to_redo:
            if watched:  # counted before its row moves into this attempt: it is one of them
                self._earlier_count(run, epoch, tool, progress)
                progress.replayed.add(effect.key)
            self._next_attempt(effect, run, epoch, "unknown", recorded)
            return answer("execute", "started", effect.attempt)
        effect.status = "unknown"
        return answer("pause", "unknown", effect.attempt)

    def _next_attempt(self, effect: Effect, run: str, epoch: int, replaced_as: str,
                      recorded: bool) -> None:
        effect.past.append(Attempt(effect.attempt, effect.run, effect.epoch, replaced_as,
                                   effect.error, effect.resolved_by))
        effect.attempt += 1
        self.clock += 1
        effect.begun = self.clock
        effect.run, effect.epoch = run, epoch
        effect.status = "started"
        effect.result = effect.error = None
        effect.safe_to_redo = recorded
        effect.execute_again = False
        effect.resolved_by = None

    # ---------- reports ----------

    def status_now(self, effect: Effect) -> str:
        """effect_status's status: a started effect whose lease ended is unknown."""
        if effect.status == "started" and not self.live(effect.run, effect.epoch):
            return "unknown"
        return effect.status

    def _effect(self, key: str) -> Effect:
        if key not in self.effects:
            raise Refused("42704", "no effect has the key")
        return self.effects[key]

    def report(self, session: int, key: str, completed: bool, value: Any,
               attempt: Optional[int]) -> str:
        """complete_effect / fail_effect: what happened to the report.

        'applied', 'noop', 'conflict' (kept for a person, flagged) or
        'superseded' (a recorded call's lost attempt: kept, nothing flagged)."""
        effect = self._effect(key)
        if attempt is not None and (attempt < 1 or attempt > effect.attempt):
            raise Refused("22023", "the attempt is below 1 or above the current one")
        if attempt is None and effect.attempt > 1:
            if effect.safe_to_redo:
                return "superseded"
            if not self._holds_only_current(session, effect):
                effect.conflict = True
                return "conflict"
            attempt = effect.attempt
        if attempt is not None and attempt < effect.attempt:
            return self._report_earlier(effect, attempt, completed, value)
        return self._report_current(effect, completed, value)

    def _holds_only_current(self, session: int, effect: Effect) -> bool:
        held = self.held.get(session, {})
        if held.get(effect.run) != effect.epoch:
            return False
        # a lock held without an epoch is no lease here (reference.md, the NULL row)
        return all(held.get(p.run) is None for p in effect.past)

    def _report_earlier(self, effect: Effect, attempt: int, completed: bool, value: Any) -> str:
        # an attempt not on record: a carried recorded call's (they stay with
        # the source's effect), lost as all its replaced attempts were
        past = (effect.past[attempt - 1] if attempt <= len(effect.past)
                else Attempt(attempt, "", 0, "unknown") if effect.safe_to_redo
                else Attempt(attempt, "", 0, "failed", None if completed else value))
        if past.status == "unknown":  # a recorded call's lost attempt
            return "superseded"
        if not completed and past.status == "failed" and past.error == value:
            return "noop"
        effect.conflict = True
        return "conflict"

    def _report_current(self, effect: Effect, completed: bool, value: Any) -> str:
        if effect.status in ("started", "unknown"):
            effect.status = "completed" if completed else "failed"
            if completed:
                effect.result = value
            else:
                effect.error = value
            return "applied"
        if completed and effect.status == "completed" and effect.result == value:
            return "noop"
        if not completed and effect.status == "failed" and effect.error == value:
            return "noop"
        effect.conflict = True
        return "conflict"

    def resolve(self, key: str, outcome: str, value: Any, attempt: Optional[int]) -> None:
        effect = self._effect(key)
        if attempt is not None and (attempt < 1 or attempt > effect.attempt):
            raise Refused("22023", "the attempt is below 1 or above the current one")
        if attempt is not None and attempt < effect.attempt:
            raise Refused("55000", "a later attempt replaced that attempt")
        if effect.status == "started" and self.live(effect.run, effect.epoch):
            raise Refused("55000", "the effect's lease is live (flagged or not: it may be in flight)")
        if not effect.conflict and effect.status in ("completed", "failed"):
            raise Refused("55000", "the effect is decided already")
        effect.status = outcome
        # the value is the result of a completed effect, the error of a failed one
        effect.result, effect.error = (value, None) if outcome == "completed" else (None, value)
        effect.conflict = False
        effect.execute_again = False
        effect.resolved_by = "model"

    def retry(self, key: str, attempt: int) -> None:
        """retry_effect: a person found that the attempt did not happen; the
        next call of the key executes the next attempt (reference.md)."""
        effect = self._effect(key)
        if attempt < 1 or attempt > effect.attempt:
            raise Refused("22023", "the attempt is below 1 or above the current one")
        if attempt < effect.attempt:
            raise Refused("55000", "a later attempt replaced that attempt")
        if effect.status == "started" and self.live(effect.run, effect.epoch):
            raise Refused("55000", "the effect's lease is live: it may be in flight")
        if effect.status == "completed":
            raise Refused("55000", "the effect completed, flagged or not: it would happen twice")
        if effect.execute_again and not effect.conflict:
            return  # asked again: no change
        if effect.status != "failed":
            effect.status = "failed"
            effect.result = effect.error = None
        effect.conflict = False
        effect.execute_again = True
        effect.resolved_by = "model"

    # ---------- reconcilers ----------

    def reconcilable_from(self, key: str, attempt: int) -> Optional[bool]:
        """reconcilable_from: None when the attempt may not be reconciled; else
        whether its grace has passed (the machine's graces: '0', passed at once,
        and '1 hour', never within a history).  An unknown outcome was always
        found unknown by a call whose pause logged it (reference.md)."""
        effect = self.effects.get(key)
        if effect is None or effect.attempt != attempt or effect.status != "unknown" \
                or effect.conflict:
            return None
        t = self.tools[effect.tool]
        if not t.registered or t.reconcile_grace is None:
            return None
        return t.reconcile_grace == "0"

    def reconcile(self, key: str, attempt: int, happened: bool, evidence: Any) -> str:
        """reconcile_effect: what the provider's record said of attempt (reference.md,
        "Reconcilers"): 'applied', 'noop', 'superseded' or 'conflict'.  Evidence of an
        outcome recorded otherwise is kept whatever the tool's setting."""
        effect = self._effect(key)
        if attempt < 1 or attempt > effect.attempt:
            raise Refused("22023", "the attempt is below 1 or above the current one")
        if attempt < effect.attempt:
            if not happened:
                return "noop"  # the ledger went on from that
            past = effect.past[attempt - 1] if attempt <= len(effect.past) else None
            if effect.safe_to_redo and (past is None or past.status == "unknown"):
                return "superseded"  # a recorded call made twice: harmless
            effect.conflict = True  # it may have happened twice
            return "conflict"
        if effect.status in ("completed", "failed"):
            if (effect.status == "completed") == happened:
                return "noop"
            effect.conflict = True
            return "conflict"
        t = self.tools[effect.tool]
        if not t.registered or t.reconcile_grace is None:
            raise Refused("55000", "the tool is not reconciled by workers")
        if effect.conflict:
            raise Refused("55000", "a flagged effect waits for a person")
        if effect.status == "started":
            raise Refused("55000", "a started effect is not unknown")
        if t.reconcile_grace != "0":
            raise Refused("55000", "the grace has not passed")
        if happened:
            effect.status, effect.result, effect.error = "completed", evidence, None
        else:
            effect.status, effect.result, effect.error = "failed", None, evidence
            effect.execute_again = True
        return "applied"

    # ---------- what a person sees ----------

    def unresolved(self) -> set[str]:
        """The keys unresolved must list: every effect a person must decide."""
        keys = set()
        for effect in self.effects.values():
            if effect.conflict or effect.status == "unknown":
                keys.add(effect.key)
            elif (effect.status == "started" and not effect.safe_to_redo
                  and not self.live(effect.run, effect.epoch)):
                keys.add(effect.key)
        # a drifted call executed since (an admin turned its tool's policy off) waits
        # for nobody: reference.md, "A divergence, once recorded"
        keys.update(d.key for d in self.divergences.values()
                    if d.verdict is None and d.key not in self.effects)
        return keys
