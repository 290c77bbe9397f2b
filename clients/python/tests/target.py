"""Where the tests' connections go.

DURABLE_LEDGER_DSN names the database the client talks to: a ledger, or the proxy of a
sharded ledger (durable_ledger_proxy, docs/scale-out.md) whose one shard is then
DURABLE_LEDGER_ADMIN_DSN, on the same cluster (roles are the cluster's).  What the tests
read or lock in the ledger's own tables, and the backends they wait for, are found
there; the clients' calls go through DSN.  Without DURABLE_LEDGER_ADMIN_DSN both are
DSN.  test/apps/030_python_client.pl runs the suite both ways.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

DSN = os.environ.get("DURABLE_LEDGER_DSN")
ADMIN_DSN = os.environ.get("DURABLE_LEDGER_ADMIN_DSN") or DSN
#: the client talks to a proxy, whose shard is ADMIN_DSN
THROUGH_PROXY = ADMIN_DSN != DSN


def _dbname(dsn: Optional[str]) -> Optional[str]:
    import psycopg
    return psycopg.conninfo.conninfo_to_dict(dsn or "").get("dbname") if dsn else None


#: the database the client's own connections are in (the proxy's, through one)
CLIENT_DB = _dbname(DSN)

#: Through a proxy, an error a shard returns ends the session leases the session holds
#: on it (PL/Proxy drops the failed call's connection at the next call,
#: docs/scale-out.md): a session attempt that must go on after one starts anew there.
ERROR_ENDS_SESSION_LEASE = THROUGH_PROXY


def ledger_backend(conn: Any, run: str) -> int:
    """The backend that holds ``conn``'s session on the ledger for ``run``, as the
    ledger's ``leases.holder_pid`` names it: the connection's own, or through a proxy,
    the shard's process of PL/Proxy's connection (opened by this call if need be)."""
    query = ("SELECT durable_ledger_proxy.shard_backend(%s)" if THROUGH_PROXY
             else "SELECT pg_backend_pid() WHERE %s::text IS NOT NULL")  # (through a pooler: this statement's)
    return int(conn.execute(query, (run,)).fetchone()[0])


async def ledger_backend_async(conn: Any, run: str) -> int:
    """`ledger_backend` of an ``AsyncConnection``."""
    cur = await conn.execute("SELECT durable_ledger_proxy.shard_backend(%s)" if THROUGH_PROXY
                             else "SELECT pg_backend_pid() WHERE %s::text IS NOT NULL", (run,))
    row = await cur.fetchone()
    return int(row[0])


def session_backends(conn: Any) -> list[int]:
    """Every backend of the ledger that serves ``conn``'s session: its own, and through a
    proxy also the shard's (a closed session's leases end once all of them are gone)."""
    pids = [int(conn.info.backend_pid)]
    if THROUGH_PROXY:
        pids += [int(r[0]) for r in conn.execute("SELECT pid FROM durable_ledger_proxy.shard_backends()")]
    return pids


def wait_gone(admin: Any, pids: list[int], patience: float = 60) -> bool:
    """Polls ``pg_stat_activity`` (on the admin's connection: the cluster of them all)
    until none of ``pids`` is left; False if ``patience`` seconds passed first."""
    deadline = time.monotonic() + patience
    while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone()[0]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def client_dsn(user: Optional[str] = None, **more: Any) -> str:
    """DSN, as another role (or with more libpq options)."""
    import psycopg
    if user is not None:
        more["user"] = user
    return psycopg.conninfo.make_conninfo(DSN or "", **more)


#: Through a proxy, the test harness (030_python_client.pl) makes this PL/Proxy function
#: in the proxy's database: pg_advisory_unlock_all() on the session's connection to every
#: shard, what a pooler's reset (DISCARD ALL) of that connection would do.
UNLOCK_SHARDS = """
CREATE OR REPLACE FUNCTION public.unlock_shard_connections() RETURNS SETOF boolean
LANGUAGE plproxy AS $$
    CLUSTER 'durable_ledger_shards'; RUN ON ALL;
    SELECT true AS unlock_shard_connections FROM (SELECT pg_catalog.pg_advisory_unlock_all()) x;
$$"""


def drop_leases(conn: Any) -> None:
    """Every session lease of ``conn``'s session dropped behind the ledger's back, as a
    pooler's reset does: pg_advisory_unlock_all() where the session holds them."""
    conn.execute("SELECT public.unlock_shard_connections()" if THROUGH_PROXY
                 else "SELECT pg_advisory_unlock_all()")


async def drop_leases_async(conn: Any) -> None:
    """`drop_leases` of an ``AsyncConnection``."""
    await conn.execute("SELECT public.unlock_shard_connections()" if THROUGH_PROXY
                       else "SELECT pg_advisory_unlock_all()")
