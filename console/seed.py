#!/usr/bin/python3
"""What `make console` shows: the demo's story (demo/demo.py: paused, replayed and
resolved effects), then two payments left for a person to decide on the page (a
worker killed mid-payment, and a replay whose model reworded the memo), and
SCRAM password logins for an admin (maria) and an auditor (ines).

The passwords are new on every run and printed; they are sent to the server
already hashed (libpq's PQencryptPasswordConn), never in clear text.
"""

import argparse
import os
import secrets
import sys

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "demo"))
import demo  # noqa: E402  (the demo's workers and orchestration)


def paused_payments(dsn, worker_dsn):
    """A worker evicted between the bank's answer and complete_effect, and its retry,
    which pauses; then a run whose retry has the model reword the memo."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        demo.heading(10, "Left for the console: a worker evicted mid-payment, its retry paused")
        w = demo.spawn(worker_dsn, "ledger", "--run", "ap-10", "--die-after", "intent",
                       "--invoice", "INV-10", "--amount", "1250")
        demo.follow(w, until="calling the bank")
        demo.evict_once_paid(conn, w, "ap-10")
        demo.follow(demo.spawn(worker_dsn, "ledger", "--run", "ap-10", "--invoice", "INV-10", "--amount", "1250"))

        demo.heading(11, "Left for the console: a replay that rewords the memo, paused as a divergence")
        w = demo.spawn(worker_dsn, "ledger", "--run", "ap-11", "--die-after", "paid", "--invoice", "INV-11",
                       "--amount", "980", "--memo", "Invoice INV-11, thank you")
        demo.follow(w, until="acknowledging")
        demo.evict(w)
        demo.follow(demo.spawn(worker_dsn, "ledger", "--run", "ap-11", "--invoice", "INV-11", "--amount", "980",
                               "--memo", "Paying INV-11 as agreed"))


def logins(dsn):
    """maria (the demo's admin) and ines (an auditor) with new passwords."""
    passwords = {"maria": secrets.token_urlsafe(12), "ines": secrets.token_urlsafe(12)}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE ines LOGIN")
        conn.execute("GRANT durable_ledger_auditor TO ines")
        for role, password in passwords.items():
            hashed = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256")
            conn.execute(psycopg.sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                psycopg.sql.Identifier(role), psycopg.sql.Literal(hashed.decode())))
    return passwords


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="a superuser's libpq connection string")
    parser.add_argument("--logins", required=True, help="where to write the two logins (mode 0600)")
    args = parser.parse_args()
    if not demo.story(args.dsn):
        sys.exit("the demo's story did not end as told")
    worker_dsn = psycopg.conninfo.make_conninfo(args.dsn, user="ap_worker", application_name="ap-worker")
    paused_payments(args.dsn, worker_dsn)
    passwords = logins(args.dsn)
    fd = os.open(args.logins, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"admin:   maria / {passwords['maria']}\nauditor: ines / {passwords['ines']}\n")


if __name__ == "__main__":
    main()
