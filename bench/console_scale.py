"""make bench, section "console": the operator console's pages with the audit section's
ledger (ten million effects, bench/audit_scale.py's fill, made once for both sections).

A console (console/bin/console.js) is started against that database; a role of its own
logs in with a SCRAM password (a pg_hba.conf line for it; the console refuses a login
PostgreSQL did not ask a password of), and each page is fetched over loopback
HTTP, as a browser would, 7 times after a warm-up: the queue (what waits for a person),
the page of a run with the story's resolution and lease break (ap-run-42), the page of a
filled run retried once (100 effects, two attempts: its timeline has ~400 events), an
effect's page, the tools, the leases and the metrics.  The figure is the median time from
the request to the last byte of the page; target < 200 ms.
"""

import http.cookiejar
import os
import re
import secrets
import socket
import statistics
import subprocess
import time
import urllib.parse
import urllib.request

import psycopg
import psycopg.sql

from audit_scale import STORY, fill

HERE = os.path.dirname(os.path.abspath(__file__))
CONSOLE = os.path.join(HERE, "..", "console", "bin", "console.js")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def console_url(dsn):
    """The console's --database for a libpq DSN (a Unix socket directory or a host)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    query = urllib.parse.urlencode({"host": info["host"], "port": info.get("port", 5432)})
    return f"postgresql:///{info.get('dbname', 'postgres')}?{query}"


def start_console(dsn):
    port = free_port()
    proc = subprocess.Popen(["node", CONSOLE, "--database", console_url(dsn), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()  # "durable_ledger console: http://127.0.0.1:PORT"
    if "console:" not in line:
        proc.kill()
        raise SystemExit(f"the console did not start: {line}{proc.stdout.read()}")
    return proc, f"http://127.0.0.1:{port}"


def scram_login(conn):
    """A role of the admin group that logs in with a SCRAM password, as the console
    requires (the bench cluster trusts everyone else on its socket); its password."""
    password = secrets.token_urlsafe(12)
    if not conn.execute("SELECT FROM pg_roles WHERE rolname = 'bench_console'").fetchone():
        conn.execute("CREATE ROLE bench_console LOGIN")
        conn.execute("GRANT durable_ledger_admin TO bench_console")
    hashed = conn.pgconn.encrypt_password(password.encode(), b"bench_console", b"scram-sha-256").decode()
    conn.execute(psycopg.sql.SQL("ALTER ROLE bench_console PASSWORD {}").format(psycopg.sql.Literal(hashed)))
    hba = conn.execute("SHOW hba_file").fetchone()[0]
    with open(hba, encoding="utf-8") as f:
        rules = f.read()
    line = "local all bench_console scram-sha-256\n"
    if line not in rules:
        with open(hba, "w", encoding="utf-8") as f:
            f.write(line + rules)
        conn.execute("SELECT pg_reload_conf()")
    return password


def login(url, user, password):
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{url}/login").read().decode()
    token = re.search(r'name="_csrf" value="([^"]+)"', page).group(1)
    body = urllib.parse.urlencode({"_csrf": token, "user": user, "password": password}).encode()
    landed = opener.open(f"{url}/login", body)
    if not landed.geturl().endswith("/"):
        raise SystemExit(f"the bench's console login failed: {landed.geturl()}")
    return opener


def timed_page_ms(opener, url, rounds=7):
    opener.open(url).read()  # warm
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        with opener.open(url) as r:
            r.read()
            if r.status != 200:
                raise SystemExit(f"{url}: HTTP {r.status}")
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def console_section(args, dsn, say):
    rows = []
    say(f"the console at scale: the ledger filled to {args.audit_effects:,} effects (the audit section's fill) ...")
    n, _ = fill(dsn, args.audit_effects, 2, say)
    conn = psycopg.connect(dsn, autocommit=True)
    if not conn.execute("SELECT FROM durable_ledger.runs WHERE run = 'ap-run-42'").fetchone():
        for statement in STORY:
            conn.execute(statement)
    password = scram_login(conn)
    retried = conn.execute("SELECT run FROM durable_ledger.runs WHERE run LIKE 'audit-%' AND epochs = 2"
                           " ORDER BY run LIMIT 1").fetchone()[0]
    key = conn.execute("SELECT key FROM durable_ledger.audit_log WHERE run = %s AND key IS NOT NULL"
                       " ORDER BY id LIMIT 1", (retried,)).fetchone()[0]
    waiting = conn.execute("SELECT count(*) FROM durable_ledger.unresolved").fetchone()[0]
    proc, url = start_console(dsn)
    try:
        opener = login(url, "bench_console", password)
        pages = [
            ("the queue (what waits for a person)", "/", f"{waiting} waiting"),
            ("a run's page: ap-run-42", "/run?run=ap-run-42", "the story's run: a resolution, a replay"),
            (f"a run's page: {retried}", "/run?" + urllib.parse.urlencode({"run": retried}),
             "100 effects, two attempts"),
            ("an effect's page", "/effect?" + urllib.parse.urlencode({"key": key}), "with its events"),
            ("the tools", "/tools", ""),
            ("the leases", "/leases", ""),
            ("the metrics", "/metrics", ""),
        ]
        for name, path, context in pages:
            ms = timed_page_ms(opener, url + path)
            rows.append((f"console: {name} at {n:,} effects (ms)", ms, "< 200",
                         f"GET {path.split('?')[0]}, loopback HTTP, to the last byte; {context}".rstrip("; ")))
            say("  ", rows[-1])
    finally:
        proc.terminate()
        proc.wait()
    return rows
