"""The ledger through durable_ledger_proxy: each call routed by PL/Proxy to the shard of
its run, against real clusters (test/apps/060_proxy.pl starts three shards and a proxy).

PROXY_DSN names the proxy database as a superuser; SHARD_DSNS the shards' ledger
databases, in order (p0, p1, …), separated by '|'.  The roles agent (worker), oncall
(admin), reader (auditor) and approver exist on every cluster.  Every test uses runs and
keys of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import unittest
import uuid
from typing import Any, Dict, List, Optional, Tuple

import psycopg
from psycopg import errors

PROXY_DSN = os.environ.get("PROXY_DSN", "")
SHARD_DSNS = [d for d in os.environ.get("SHARD_DSNS", "").split("|") if d]
DOCS = os.environ.get("DURABLE_LEDGER_DOCS", "")


def setUpModule() -> None:
    if not PROXY_DSN or not SHARD_DSNS:
        raise unittest.SkipTest("PROXY_DSN and SHARD_DSNS are not set")


def shard_index(run: str, shards: int) -> int:
    """docs/scale-out.md's routing, computed here from its words: the routing key is the
    text between the first '{' and the first '}' after it when not empty, else the run;
    its hash the first 4 bytes of its SHA-256 as a signed integer; its shard abs(hash % N)
    (C's remainder, which keeps the dividend's sign)."""
    key = run
    start = run.find("{")
    if start >= 0:
        end = run.find("}", start + 1)
        if end > start + 1:
            key = run[start + 1:end]
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:4], "big", signed=True)
    return abs(h) % shards


class ProxyTest(unittest.TestCase):

    def setUp(self) -> None:
        self.tag = uuid.uuid4().hex[:12]

    def connect(self, dsn: str, user: Optional[str] = None) -> "psycopg.Connection[Any]":
        conn = psycopg.connect(dsn, autocommit=True, user=user) if user \
            else psycopg.connect(dsn, autocommit=True)
        self.addCleanup(conn.close)
        return conn

    def proxy(self, user: Optional[str] = "agent") -> "psycopg.Connection[Any]":
        return self.connect(PROXY_DSN, user)

    def shard(self, i: int) -> "psycopg.Connection[Any]":
        return self.connect(SHARD_DSNS[i])

    def run_on(self, i: int, prefix: str = "run") -> str:
        """A new run id whose shard is p<i>."""
        n = 0
        while True:
            run = f"{prefix}-{self.tag}-{n}"
            if shard_index(run, len(SHARD_DSNS)) == i:
                return run
            n += 1

    def shard_runs(self, i: int, like: str) -> List[str]:
        return [r[0] for r in self.shard(i).execute(
            "SELECT run FROM durable_ledger.runs WHERE run LIKE %s ORDER BY run", (like,))]

    def wait_for(self, conn: "psycopg.Connection[Any]", sql: str, args: Tuple[Any, ...] = (),
                 what: str = "") -> None:
        deadline = time.monotonic() + 60
        while not conn.execute(sql, args).fetchone()[0]:
            if time.monotonic() > deadline:
                self.fail(f"never true: {what or sql}")
            time.sleep(0.01)

    def shard_backend_of(self, i: int, run: str) -> int:
        row = self.shard(i).execute(
            "SELECT holder_pid FROM durable_ledger.leases WHERE run = %s AND kind = 'session'",
            (run,)).fetchone()
        self.assertIsNotNone(row, f"no session lease of {run} on p{i}")
        return row[0]

    # -- routing ---------------------------------------------------------------------------

    def test_each_run_is_held_by_the_shard_its_name_routes_to(self) -> None:
        conn = self.proxy()
        runs = [f"spread-{self.tag}-{n}" for n in range(24)]
        for run in runs:
            self.assertTrue(conn.execute("SELECT durable_ledger.acquire_run(%s)", (run,)).fetchone()[0])
            conn.execute("SELECT durable_ledger.release_run(%s)", (run,))
        for i in range(len(SHARD_DSNS)):
            expected = sorted(r for r in runs if shard_index(r, len(SHARD_DSNS)) == i)
            self.assertTrue(expected, f"no run of 24 routes to p{i}")
            self.assertEqual(self.shard_runs(i, f"spread-{self.tag}-%"), expected,
                             f"p{i} holds exactly the runs that route to it")
            for run in expected:
                self.assertEqual(conn.execute("SELECT durable_ledger_proxy.shard_of(%s)",
                                              (run,)).fetchone()[0], f"p{i}")

    def test_runs_with_one_hash_tag_share_a_shard(self) -> None:
        conn = self.proxy()
        tag = f"acme-{self.tag}"
        shards = {conn.execute("SELECT durable_ledger_proxy.shard_of(%s)", (run,)).fetchone()[0]
                  for run in (f"{{{tag}}}a", f"b{{{tag}}}", f"{{{tag}}}c{{x}}", tag)}
        self.assertEqual(len(shards), 1, "every run tagged {tag}, and tag itself, on one shard")
        self.assertEqual(conn.execute("SELECT durable_ledger_proxy.routing_key(%s)",
                                      ("{}x{y}",)).fetchone()[0], "{}x{y}",
                         "an empty tag is no tag (Redis Cluster's rule)")

    # -- session leases --------------------------------------------------------------------

    def test_a_session_attempt_through_the_proxy_executes_once_and_replays_after(self) -> None:
        run = self.run_on(1)
        worker = self.proxy()
        self.assertTrue(worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,)).fetchone()[0])
        key, decision = worker.execute(
            "SELECT key, decision FROM durable_ledger.begin_effect(%s, 'bank.pay', %s)",
            (run, json.dumps({"invoice": "INV-1", "amount": 10}))).fetchone()
        self.assertEqual(decision, "execute")
        other = self.proxy()
        self.assertFalse(other.execute("SELECT durable_ledger.acquire_run(%s, wait => false)",
                                       (run,)).fetchone()[0],
                         "another proxy session cannot take the run while the lease is held")
        status = worker.execute(
            "SELECT status FROM durable_ledger.complete_effect(%s, %s, 1, run => %s)",
            (key, json.dumps({"paid": True}), run)).fetchone()[0]
        self.assertEqual(status, "completed")
        # the worker's proxy session ends: its connection to the shard, and the lease, with it
        pid = self.shard_backend_of(1, run)
        worker.close()
        self.wait_for(self.shard(1), "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)",
                      (pid,), "the shard backend of the closed proxy session ends")
        self.assertTrue(other.execute("SELECT durable_ledger.acquire_run(%s, wait => false)",
                                      (run,)).fetchone()[0])
        decision, result = other.execute(
            "SELECT decision, result FROM durable_ledger.begin_effect(%s, 'bank.pay', %s)",
            (run, json.dumps({"amount": 10.0, "invoice": "INV-1"}))).fetchone()
        self.assertEqual((decision, result), ("replay", {"paid": True}))

    def test_shard_backends_name_the_holder_of_this_sessions_leases(self) -> None:
        run = self.run_on(1, "holder")
        worker = self.proxy()
        worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        pid = worker.execute("SELECT durable_ledger_proxy.shard_backend(%s)", (run,)).fetchone()[0]
        self.assertEqual(self.shard_backend_of(1, run), pid, "the lease's holder_pid is this session's shard backend")
        backends = dict(worker.execute("SELECT shard, pid FROM durable_ledger_proxy.shard_backends()").fetchall())
        self.assertEqual(sorted(backends), [f"p{i}" for i in range(len(SHARD_DSNS))])
        self.assertEqual(backends["p1"], pid)
        other = dict(self.proxy().execute("SELECT shard, pid FROM durable_ledger_proxy.shard_backends()").fetchall())
        self.assertFalse(set(other.values()) & set(backends.values()), "each session has connections of its own")

    def test_a_call_without_a_lease_takes_none_and_writes_nothing(self) -> None:
        run = self.run_on(0)
        conn = self.proxy()
        with self.assertRaises(errors.ObjectNotInPrerequisiteState) as caught:
            conn.execute("SELECT * FROM durable_ledger.begin_effect(%s, 't', '{}')", (run,))
        self.assertIn("holds no lease", str(caught.exception))
        with self.assertRaises(errors.ObjectNotInPrerequisiteState):
            conn.execute("SELECT * FROM durable_ledger.begin_recorded(%s, 'model', '{}')", (run,))
        self.assertEqual(self.shard_runs(0, run), [], "no lease was taken, no epoch started")
        self.assertEqual(self.shard(0).execute(
            "SELECT count(*) FROM durable_ledger.effects WHERE run = %s", (run,)).fetchone()[0], 0)

    def test_a_lost_shard_connection_never_starts_a_new_epoch_behind_the_caller(self) -> None:
        run = self.run_on(2)
        worker = self.proxy()
        worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        key = worker.execute("SELECT key FROM durable_ledger.begin_effect(%s, 'mail.send', '{\"n\": 1}')",
                             (run,)).fetchone()[0]
        shard = self.shard(2)
        epochs = shard.execute("SELECT epochs FROM durable_ledger.runs WHERE run = %s", (run,)).fetchone()[0]
        pid = self.shard_backend_of(2, run)
        shard.execute("SELECT pg_terminate_backend(%s)", (pid,))
        self.wait_for(shard, "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)", (pid,))
        # PL/Proxy finds the connection gone (at once, or after reconnecting): either way the
        # call fails and nothing is begun in a new epoch
        for _ in range(2):
            with self.assertRaises(psycopg.Error) as caught:
                worker.execute("SELECT * FROM durable_ledger.begin_effect(%s, 'mail.send', '{\"n\": 2}')", (run,))
            self.assertIn(caught.exception.sqlstate, ("08006", "55000"), str(caught.exception))
        self.assertEqual(shard.execute("SELECT epochs FROM durable_ledger.runs WHERE run = %s",
                                       (run,)).fetchone()[0], epochs)
        self.assertEqual(shard.execute("SELECT count(*) FROM durable_ledger.effects WHERE run = %s",
                                       (run,)).fetchone()[0], 1)
        # a new attempt finds the lost one's effect unknown
        worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        decision, status = worker.execute(
            "SELECT decision, status FROM durable_ledger.begin_effect(%s, 'mail.send', '{\"n\": 1}')",
            (run,)).fetchone()
        self.assertEqual((decision, status), ("pause", "unknown"))
        self.assertEqual(self.proxy("reader").execute(
            "SELECT count(*) FROM durable_ledger.unresolved WHERE key = %s AND shard = 'p2'",
            (key,)).fetchone()[0], 1)

    # -- token leases ----------------------------------------------------------------------

    def test_a_token_lease_through_the_proxy(self) -> None:
        run = self.run_on(0)
        conn = self.proxy()
        token, epoch = conn.execute(
            "SELECT token, epoch FROM durable_ledger.take_lease(%s, '1 minute', 'w1')", (run,)).fetchone()
        self.assertRegex(token, r"^-?\d+\.[0-9a-f]{64}$")
        self.assertIsNone(conn.execute("SELECT (durable_ledger.take_lease(%s)).token", (run,)).fetchone()[0],
                          "a live lease holds the run")
        # any proxy connection may carry the call
        d = self.proxy().execute(
            "SELECT key, decision FROM durable_ledger.begin_effect(%s, 'ticket.open', '{}', lease => %s)",
            (run, token)).fetchone()
        self.assertEqual(d[1], "execute")
        self.assertIsNotNone(self.proxy().execute("SELECT durable_ledger.renew_lease(%s)", (token,)).fetchone()[0])
        self.proxy().execute("SELECT durable_ledger.complete_effect(%s, '{}', 1)", (d[0],))
        self.assertTrue(conn.execute("SELECT durable_ledger.release_lease(%s)", (token,)).fetchone()[0])
        self.assertFalse(conn.execute("SELECT durable_ledger.release_lease(%s)", (token,)).fetchone()[0])
        for bad in (token, "not-a-token", "12.ab", f"{token}x"):
            with self.assertRaises(psycopg.Error) as caught:
                conn.execute("SELECT durable_ledger.renew_lease(%s)", (bad,))
            self.assertEqual(caught.exception.sqlstate, "55L01", bad)
        with self.assertRaises(psycopg.Error) as caught:
            conn.execute("SELECT * FROM durable_ledger.begin_effect(%s, 'ticket.open', '{}', lease => %s)",
                         (run, token))
        self.assertEqual(caught.exception.sqlstate, "55L01")
        self.assertEqual(self.shard(0).execute(
            "SELECT epochs FROM durable_ledger.runs WHERE run = %s", (run,)).fetchone()[0], epoch)

    # -- reports and keys ------------------------------------------------------------------

    def test_a_report_without_its_run_finds_the_one_shard_that_has_the_key(self) -> None:
        run = self.run_on(1)
        conn = self.proxy()
        token = conn.execute("SELECT token FROM durable_ledger.take_lease(%s)", (run,)).fetchone()[0]
        key = conn.execute("SELECT key FROM durable_ledger.begin_effect(%s, 'bank.pay', '{\"a\": 1}', lease => %s)",
                           (run, token)).fetchone()[0]
        row = conn.execute("SELECT run, status FROM durable_ledger.complete_effect(%s, '{\"ok\": 1}', 1)",
                           (key,)).fetchone()
        self.assertEqual(row, (run, "completed"))
        self.assertEqual([r[0] for r in conn.execute("SELECT status FROM durable_ledger.effect_status(%s)", (key,))],
                         ["completed"])
        with self.assertRaises(errors.UndefinedObject):
            conn.execute("SELECT * FROM durable_ledger.complete_effect(%s, '{}')", ("0" * 64,))
        with self.assertRaises(errors.UndefinedObject):
            conn.execute("SELECT * FROM durable_ledger.complete_effect(%s, '{}', run => %s)", ("0" * 64, run))

    def test_runs_of_one_routing_key_share_their_business_keys(self) -> None:
        tenant = f"acme-{self.tag}"
        invoice = f"INV-{self.tag}"
        first, second = self.proxy(), self.proxy()
        first.execute("SELECT durable_ledger.acquire_run(%s)", (f"{{{tenant}}}run-1",))
        second.execute("SELECT durable_ledger.acquire_run(%s)", (f"{{{tenant}}}run-2",))
        key, decision = first.execute(
            "SELECT key, decision FROM durable_ledger.begin_effect(%s, 'bank.pay', '{\"amount\": 5}', %s)",
            (f"{{{tenant}}}run-1", invoice)).fetchone()
        self.assertEqual((key, decision), (invoice, "execute"))
        self.assertEqual(second.execute(
            "SELECT decision FROM durable_ledger.begin_effect(%s, 'bank.pay', '{\"amount\": 5}', %s)",
            (f"{{{tenant}}}run-2", invoice)).fetchone()[0], "in_progress")
        first.execute("SELECT durable_ledger.complete_effect(%s, '{\"paid\": 1}', 1, run => %s)",
                      (invoice, f"{{{tenant}}}run-1"))
        self.assertEqual(second.execute(
            "SELECT decision FROM durable_ledger.begin_effect(%s, 'bank.pay', '{\"amount\": 5}', %s)",
            (f"{{{tenant}}}run-2", invoice)).fetchone()[0], "replay")

    def test_a_business_key_of_two_routing_keys_is_on_two_shards_and_a_report_must_name_its_run(self) -> None:
        invoice = f"DUP-{self.tag}"
        runs = [self.run_on(0, "dup"), self.run_on(2, "dup")]
        for run in runs:
            conn = self.proxy()
            conn.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
            self.assertEqual(conn.execute(
                "SELECT decision FROM durable_ledger.begin_effect(%s, 'bank.pay', '{}', %s)",
                (run, invoice)).fetchone()[0], "execute",
                "each shard holds its own business keys (the routing rules say: one routing key)")
        conn = self.proxy()
        with self.assertRaises(errors.InvalidParameterValue) as caught:
            conn.execute("SELECT * FROM durable_ledger.complete_effect(%s, '{}', 1)", (invoice,))
        self.assertIn("p0, p2", str(caught.exception))
        for shard in (0, 2):
            self.assertEqual(self.shard(shard).execute(
                "SELECT status FROM durable_ledger.effects WHERE key = %s", (invoice,)).fetchone()[0],
                "started", "the ambiguous report was applied nowhere")
        self.assertEqual(conn.execute(
            "SELECT status FROM durable_ledger.complete_effect(%s, '{}', 1, run => %s)",
            (invoice, runs[1])).fetchone()[0], "completed")
        self.assertEqual(self.shard(0).execute(
            "SELECT status FROM durable_ledger.effects WHERE key = %s", (invoice,)).fetchone()[0], "started")
        self.assertEqual(sorted(r[0] for r in conn.execute(
            "SELECT status FROM durable_ledger.effect_status(%s)", (invoice,))), ["completed", "started"])

    # -- people's decisions ----------------------------------------------------------------

    def test_a_person_resolves_an_unknown_outcome_on_its_shard_through_the_proxy(self) -> None:
        run = self.run_on(1)
        worker = self.proxy()
        worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        key = worker.execute("SELECT key FROM durable_ledger.begin_effect(%s, 'bank.pay', '{\"x\": 1}')",
                             (run,)).fetchone()[0]
        pid = self.shard_backend_of(1, run)
        worker.close()
        self.wait_for(self.shard(1), "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)", (pid,))
        oncall = self.proxy("oncall")
        self.assertEqual(oncall.execute(
            "SELECT shard, status FROM durable_ledger.unresolved WHERE key = %s", (key,)).fetchone(),
            ("p1", "unknown"))
        with self.assertRaises(errors.InsufficientPrivilege):
            self.proxy("agent").execute(
                "SELECT * FROM durable_ledger.resolve_effect(%s, 'completed', '{}', 'agent')", (key,))
        row = oncall.execute(
            "SELECT status, resolved_by FROM durable_ledger.resolve_effect(%s, 'completed', '{\"paid\": 1}', 'maria', 'seen at the bank')",
            (key,)).fetchone()
        self.assertEqual(row, ("completed", "maria"))
        role = self.shard(1).execute(
            "SELECT role_name FROM durable_ledger.audit_log WHERE key = %s AND event = 'resolved'",
            (key,)).fetchone()[0]
        self.assertEqual(role, "oncall", "the shard's audit log names the person's own role")
        again = self.proxy()
        again.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        self.assertEqual(again.execute(
            "SELECT decision FROM durable_ledger.begin_effect(%s, 'bank.pay', '{\"x\": 1}')",
            (run,)).fetchone()[0], "replay")

    def test_the_registry_is_changed_on_every_shard(self) -> None:
        tool = f"bank.pay.{self.tag}"
        oncall = self.proxy("oncall")
        row = oncall.execute(
            "SELECT tool, key_fields FROM durable_ledger.register_tool(%s, 'maria', key_fields => '{invoice}')",
            (tool,)).fetchone()
        self.assertEqual(row, (tool, ["invoice"]))
        for i in range(len(SHARD_DSNS)):
            self.assertEqual(self.shard(i).execute(
                "SELECT key_fields FROM durable_ledger.tools WHERE tool = %s", (tool,)).fetchone()[0], ["invoice"])
        with self.assertRaises(errors.UniqueViolation) as caught:
            oncall.execute("SELECT * FROM durable_ledger.register_tool(%s, 'maria')", (tool,))
        self.assertNotIn("took it", str(caught.exception), "the first shard refused: nothing changed anywhere")
        self.assertEqual(oncall.execute(
            "SELECT count(*) FROM durable_ledger_proxy.registry_drift WHERE what = %s",
            (f"tool {tool}",)).fetchone()[0], 0)
        # one shard changed behind the proxy's back: the drift shows it, shard by shard
        self.shard(1).execute("SELECT durable_ledger.change_tool(%s, 'ana', divergence => 'warn')", (tool,))
        drift = oncall.execute(
            "SELECT shard, setting ->> 'divergence' FROM durable_ledger_proxy.registry_drift WHERE what = %s ORDER BY shard",
            (f"tool {tool}",)).fetchall()
        self.assertEqual(drift, [("p0", "pause"), ("p1", "warn"), ("p2", "pause")])
        self.assertEqual(oncall.execute(
            "SELECT divergence FROM durable_ledger.change_tool(%s, 'ana', divergence => 'warn')",
            (tool,)).fetchone()[0], "warn")
        self.assertEqual(oncall.execute(
            "SELECT count(*) FROM durable_ledger_proxy.registry_drift WHERE what = %s",
            (f"tool {tool}",)).fetchone()[0], 0)
        with self.assertRaises(errors.InsufficientPrivilege):
            self.proxy("agent").execute("SELECT * FROM durable_ledger.retire_tool(%s, 'agent')", (tool,))

    # -- what people read ------------------------------------------------------------------

    def test_the_views_people_read_are_the_union_of_the_shards_own(self) -> None:
        # something unresolved and a live lease on every shard
        for i in range(len(SHARD_DSNS)):
            run = self.run_on(i, "view")
            worker = self.proxy()
            worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
            worker.execute("SELECT durable_ledger.begin_effect(%s, 'mail.send', '{}')", (run,))
            pid = self.shard_backend_of(i, run)
            worker.close()
            self.wait_for(self.shard(i), "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)", (pid,))
            self.proxy().execute("SELECT durable_ledger.take_lease(%s, '1 minute')", (run + "-held",))
        reader = self.proxy("reader")
        for view, columns in (("unresolved", "key, run, tool, status, conflict, attempt, downstream_key"),
                              ("leases", "run, lease_epoch, kind, holder, expires_at"),
                              ("metrics", "session_leases, token_leases, unresolved, counters_kept"),
                              ("audit_heads", "chain, chain_seq, id, row_hash")):
            def union() -> List[Tuple[Any, ...]]:
                return sorted((f"p{i}",) + tuple(r)
                              for i in range(len(SHARD_DSNS))
                              for r in self.shard(i).execute(f"SELECT {columns} FROM durable_ledger.{view}"))
            # earlier tests' closed sessions end on the shards asynchronously: compare once
            # the shards' own views read the same before and after the proxy's
            for _ in range(100):
                before = union()
                seen = sorted(tuple(r) for r in reader.execute(f"SELECT shard, {columns} FROM durable_ledger.{view}"))
                if union() == before:
                    break
            self.assertEqual(seen, before, f"the proxy's {view} is the union of the shards' own")
        self.assertGreaterEqual(len({r[0] for r in reader.execute("SELECT shard FROM durable_ledger.unresolved")}),
                                len(SHARD_DSNS))

    def test_the_auditors_cookbook_over_every_shard_answers_as_each_shard(self) -> None:
        run = self.run_on(2, "book")
        worker = self.proxy()
        worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        invoice = f"INV-{self.tag}"
        key = worker.execute("SELECT key FROM durable_ledger.begin_effect(%s, 'bank.pay', %s)",
                             (run, json.dumps({"invoice": invoice, "amount": 3}))).fetchone()[0]
        worker.execute("SELECT durable_ledger.complete_effect(%s, '{\"ok\": true}', 1, %s)", (key, run))
        worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        worker.execute("SELECT durable_ledger.begin_effect(%s, 'bank.pay', %s)",
                       (run, json.dumps({"invoice": invoice, "amount": 3})))
        reader = self.proxy("reader")
        questions = {
            "audit_by_args": ("SELECT * FROM durable_ledger_proxy.audit_by_args('invoice', %s)", (invoice,),
                              """SELECT a.logged_at, a.run, a.event, e.tool, a.role_name, a.session_user_name,
                                        a.application_name, a.client_addr, a.lease_epoch, a.detail,
                                        e.args, e.meta, e.result
                                   FROM durable_ledger.audit_log a
                                   JOIN durable_ledger.effects e ON e.key = a.key
                                  WHERE e.args ->> 'invoice' = %s ORDER BY a.id""", (invoice,)),
            "audit_of_run": ("SELECT * FROM durable_ledger_proxy.audit_of_run(%s)", (run,),
                             """SELECT a.logged_at, a.event, a.key, e.tool, a.lease_epoch, a.role_name,
                                       a.application_name, a.backend_pid, a.detail
                                  FROM durable_ledger.audit_log a
                                  LEFT JOIN durable_ledger.effects e ON e.key = a.key
                                 WHERE a.run = %s ORDER BY a.id""", (run,)),
            "replays_per_tool": ("SELECT * FROM durable_ledger_proxy.replays_per_tool()", (),
                                 """SELECT coalesce(a.detail ->> 'tool',
                                                   (SELECT e.tool FROM durable_ledger.effects e WHERE e.key = a.key)) AS tool,
                                           count(*) AS replays, count(DISTINCT a.run) AS runs,
                                           count(DISTINCT a.key) AS effects
                                      FROM durable_ledger.audit_log a
                                     WHERE a.event = 'replay' AND a.logged_at >= now() - interval '1 day'
                                     GROUP BY 1 ORDER BY replays DESC""", ()),
        }
        for name, (proxy_sql, proxy_args, shard_sql, shard_args) in questions.items():
            seen = reader.execute(proxy_sql, proxy_args).fetchall()
            union = [(f"p{i}",) + tuple(r) for i in range(len(SHARD_DSNS))
                     for r in self.shard(i).execute(shard_sql, shard_args)]
            if name == "replays_per_tool":
                seen, union = sorted(seen), sorted(union)
            self.assertEqual(seen, union, f"{name}: the proxy's answer is the shards' answers, each named")
            self.assertTrue(seen, f"{name} has something to answer")

    def test_the_audit_chains_of_every_shard_verify_against_kept_heads(self) -> None:
        reader = self.proxy("reader")
        heads = reader.execute(
            "SELECT jsonb_object_agg(shard, heads) FROM (SELECT shard, jsonb_agg(to_jsonb(h) - 'shard') AS heads"
            "  FROM durable_ledger.audit_heads h GROUP BY shard) x").fetchone()[0]
        self.assertEqual(sorted(heads), [f"p{i}" for i in range(len(SHARD_DSNS))])
        self.assertEqual(reader.execute("SELECT count(*) FROM durable_ledger.verify_audit(%s)",
                                        (json.dumps(heads),)).fetchone()[0], 0)
        partial = {k: v for k, v in heads.items() if k != "p1"}
        self.assertEqual(reader.execute("SELECT shard, problem FROM durable_ledger.verify_audit(%s)",
                                        (json.dumps(partial),)).fetchall(),
                         [("p1", "no heads were given for this shard: its newest rows were not checked against kept heads")])

    # -- what the proxy refuses ------------------------------------------------------------

    def test_a_local_effect_cannot_be_begun_through_the_proxy(self) -> None:
        run = self.run_on(0)
        with self.assertRaises(errors.FeatureNotSupported) as caught:
            self.proxy().execute("SELECT * FROM durable_ledger.begin_local(%s, 'db.write', '{}')", (run,))
        self.assertIn("p0", caught.exception.diag.message_hint or "")

    def test_a_fork_keeps_its_sources_routing_key(self) -> None:
        run = self.run_on(1, "fork")
        worker = self.proxy()
        worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        key = worker.execute("SELECT key FROM durable_ledger.begin_effect(%s, 'bank.pay', '{}')", (run,)).fetchone()[0]
        worker.execute("SELECT durable_ledger.complete_effect(%s, '{}', 1, %s)", (key, run))
        worker.execute("SELECT durable_ledger.release_run(%s)", (run,))
        oncall = self.proxy("oncall")
        with self.assertRaises(errors.InvalidParameterValue) as caught:
            oncall.execute("SELECT durable_ledger.fork_run(%s, %s, %s, 'maria')", (run, run + "-again", key))
        self.assertIn(f"{{{run}}}", caught.exception.diag.message_hint or "")
        fork = f"{{{run}}}again"
        self.assertEqual(oncall.execute("SELECT durable_ledger.fork_run(%s, %s, %s, 'maria')",
                                        (run, fork, key)).fetchone()[0], 1)
        again = self.proxy()
        again.execute("SELECT durable_ledger.acquire_run(%s)", (fork,))
        self.assertEqual(again.execute("SELECT decision FROM durable_ledger.begin_effect(%s, 'bank.pay', '{}')",
                                       (fork,)).fetchone()[0], "replay")

    def test_the_shards_audit_log_names_the_callers_role_and_application(self) -> None:
        run = self.run_on(2, "named")
        worker = psycopg.connect(PROXY_DSN, autocommit=True, user="agent", application_name="worker-7")
        self.addCleanup(worker.close)
        worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        key = worker.execute("SELECT key FROM durable_ledger.begin_effect(%s, 'bank.pay', '{}')", (run,)).fetchone()[0]
        worker.execute("SET application_name = 'worker-7-report'")
        worker.execute("SELECT durable_ledger.complete_effect(%s, '{}', 1, %s)", (key, run))
        oncall = psycopg.connect(PROXY_DSN, autocommit=True, user="oncall", application_name="ledger-console")
        self.addCleanup(oncall.close)
        oncall.execute("SELECT durable_ledger.set_run_budget(%s, 'maria', 'more attempts', max_attempts => 7)", (run,))
        rows = self.shard(2).execute(
            "SELECT event, role_name, application_name FROM durable_ledger.audit_log WHERE run = %s ORDER BY id",
            (run,)).fetchall()
        self.assertEqual(rows, [("lease_acquired", "agent", "worker-7"), ("intent", "agent", "worker-7"),
                                ("completed", "agent", "worker-7-report"),
                                ("budget_changed", "oncall", "ledger-console")])

    def other_proxy(self, options: str) -> str:
        """A proxy database of this test's own, whose server durable_ledger_shards has
        these options (the shards' connection strings as p0, p1, … in them are given as
        {0}, {1}, …); its DSN."""
        self.proxies = getattr(self, "proxies", 0) + 1
        db = f"proxy_{self.tag}_{self.proxies}"
        admin = self.connect(PROXY_DSN)
        admin.execute(f"CREATE DATABASE {db}")
        self.addCleanup(lambda: self.connect(PROXY_DSN).execute(f"DROP DATABASE {db} WITH (FORCE)"))
        dsn = psycopg.conninfo.make_conninfo(PROXY_DSN, dbname=db)
        conn = self.connect(dsn)
        conn.execute("CREATE EXTENSION durable_ledger_proxy CASCADE")
        quoted = [d.replace("'", "''") for d in SHARD_DSNS]
        conn.execute("CREATE SERVER durable_ledger_shards FOREIGN DATA WRAPPER plproxy OPTIONS ("
                     + options.format(*quoted) + ")")
        conn.execute("CREATE USER MAPPING FOR PUBLIC SERVER durable_ledger_shards")
        return dsn

    def test_the_shard_named_is_the_one_pl_proxy_routes_to_whatever_the_mapping(self) -> None:
        # (options, the database of each partition: an index of SHARD_DSNS)
        for options, databases in (("p0 '{0}', p1 '{1}'", [0, 1]),                  # PL/Proxy's bitmask
                                   ("modular_mapping '1', partition_0 '{0}', partition_1 '{1}', "
                                    "partition_2 '{2}'", [0, 1, 2]),
                                   ("p0 '{0}', p1 '{1}', p2 '{2}', p3 '{0}'", [0, 1, 2, 0])):
            with self.subTest(options=options):
                conn = self.connect(self.other_proxy(options))
                self.assertEqual(conn.execute("SELECT durable_ledger_proxy.shard_count()").fetchone()[0],
                                 len(databases))
                for i in range(16):
                    run = f"map-{self.tag}-{len(databases)}-{i}"
                    conn.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
                    shard = conn.execute("SELECT durable_ledger_proxy.shard_of(%s)", (run,)).fetchone()[0]
                    where = [d for d in range(len(SHARD_DSNS)) if self.shard_runs(d, run)]
                    self.assertEqual(where, [databases[int(shard[1:])]], f"{run}: shard_of says {shard}")

    def test_the_calls_on_one_shard_are_granted_as_the_ledger_grants_them(self) -> None:
        for role, call in (("reader", "durable_ledger_proxy.resolve_effect_on(0, '', 'k', 'failed', NULL, 'x', NULL, NULL)"),
                           ("reader", "durable_ledger_proxy.begin_effect_held(0, '', 'r', 't', '{}', NULL, NULL, false)"),
                           ("approver", "durable_ledger_proxy.register_tool_on(0, '', 't', 'x', true, NULL, NULL, NULL)"),
                           ("agent", "durable_ledger_proxy.approve_effect_on(0, '', 'k', 'x', NULL)")):
            with self.subTest(role=role, call=call):
                with self.assertRaises(errors.InsufficientPrivilege) as caught:
                    self.proxy(role).execute(f"SELECT {call}")
                self.assertIn("permission denied for function", str(caught.exception))

    def test_shard_health_names_what_is_wrong_with_the_setup(self) -> None:
        conn = self.connect(self.other_proxy(
            "modular_mapping '1', connection_lifetime '60', p0 '{0}', p1 '{1} password=not-here'"))
        problems = dict(conn.execute("SELECT shard, problem FROM durable_ledger_proxy.shard_health()").fetchall())
        self.assertIn("connection_lifetime", problems["p0"])
        self.assertIn("password", problems["p1"])

    def test_a_lease_wait_honours_the_callers_lock_timeout(self) -> None:
        run = self.run_on(0, "waiting")
        self.assertTrue(self.proxy().execute("SELECT durable_ledger.acquire_run(%s)", (run,)).fetchone()[0])
        waiter = self.proxy()
        waiter.execute("SET lock_timeout = '300ms'")
        started = time.monotonic()
        with self.assertRaises(errors.LockNotAvailable):
            waiter.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        self.assertLess(time.monotonic() - started, 4.5, "not the shard's own 5 s default")
        waiter.execute("SET durable_ledger.lease_wait_timeout = '200ms'")
        waiter.execute("SET lock_timeout = 0")
        with self.assertRaises(errors.LockNotAvailable):
            waiter.execute("SELECT durable_ledger.acquire_run(%s)", (run,))

    def test_a_lease_broken_by_a_person_says_so_to_its_worker(self) -> None:
        run = self.run_on(2, "broken")
        worker = self.proxy()
        worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        self.assertTrue(self.proxy("oncall").execute(
            "SELECT durable_ledger.break_lease(%s, 'maria', 'hung')", (run,)).fetchone()[0])
        with self.assertRaises(psycopg.Error) as caught:
            worker.execute("SELECT * FROM durable_ledger.begin_effect(%s, 'bank.pay', '{}')", (run,))
        # at once: the connection's end is read (08006, "terminated"); after PL/Proxy's idle
        # check (2 s): a new connection, without the lease (55000)
        if caught.exception.sqlstate == "08006":
            self.assertIn("was terminated", str(caught.exception))
        else:
            self.assertEqual(caught.exception.sqlstate, "55000")
            self.assertIn("holds no lease", str(caught.exception))
        self.assertEqual(self.shard(2).execute("SELECT count(*) FROM durable_ledger.effects WHERE run = %s",
                                               (run,)).fetchone()[0], 0)

    def test_a_new_attempt_after_a_broken_lease_goes_on_at_once(self) -> None:
        # PL/Proxy reads the end of the broken lease's connection at the next call: a
        # new attempt (acquire_run), which relies on nothing of it, is made once more
        run = self.run_on(1, "again")
        worker = self.proxy()
        worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,))
        pid = self.shard_backend_of(1, run)
        self.proxy("oncall").execute("SELECT durable_ledger.break_lease(%s, 'maria', 'hung')", (run,))
        self.wait_for(self.shard(1), "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)", (pid,))
        self.assertTrue(worker.execute("SELECT durable_ledger.acquire_run(%s)", (run,)).fetchone()[0])
        self.assertEqual(worker.execute("SELECT decision FROM durable_ledger.begin_effect(%s, 'mail.send', '{}')",
                                        (run,)).fetchone()[0], "execute")

    def test_an_auditor_reads_and_may_not_call(self) -> None:
        reader = self.proxy("reader")
        reader.execute("SELECT count(*) FROM durable_ledger.unresolved")
        with self.assertRaises(errors.InsufficientPrivilege):
            reader.execute("SELECT durable_ledger.acquire_run(%s)", (self.run_on(0),))


if __name__ == "__main__":
    unittest.main()
