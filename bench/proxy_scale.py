"""make bench, section "proxy": the ledger sharded behind durable_ledger_proxy (PL/Proxy).

Four clusters of its own, with the bench's settings (bench/settings.sh, passed in):
three shards, each a cluster with durable_ledger, and a proxy cluster whose databases
proxy1, proxy2 and proxy3 route to the first 1, 2 and 3 shards.  Every side runs
begin+complete pairs with pgbench, interleaved round by round: a session lease taken once
per client (acquire_run; through the proxy a call takes none implicitly), each report
naming its run (routed) through the proxy (bench/proxy_pair.sql, bench/direct_pair.sql).

- The proxy's cost per call: pairs through proxy1 against the same pairs straight to that
  shard (the same cluster, the same clients): throughput, latency, and CPU per effect of
  the shard, of the proxy and of the client (pgbench).
- Scaling: pairs through proxy1, proxy2 and proxy3 (runs spread over 1, 2, 3 shards on
  separate clusters), the same clients at the same rate, a quarter of what a shard takes
  directly (pgbench -R): effects per CPU-second of the shards, and of every process
  (shards, proxy, client).  Unthrottled, the two cores would be saturated, and what would
  be measured is contention among more processes than cores, not what an effect costs.  On two cores the shards compete for the same CPU and
  the same disk, so throughput cannot grow; what adding a shard must keep is the work an
  effect costs: effects per shard CPU-second with N shards against the same figure with
  one (the goal: >= 0.9, i.e. each added shard's CPU does at least 0.9 of the first
  one's work: linear scaling, given the CPU).

CPU is read from /proc: a cluster's is its postmaster's own and reaped children's
(utime+stime+cutime+cstime) plus its live processes', before and after each round, once
the round's backends have exited; the client's from getrusage of the pgbench child.
"""

import os
import pwd
import resource
import shutil
import statistics
import subprocess
import tempfile
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
TICKS = os.sysconf("SC_CLK_TCK")


def as_cluster_user():
    """initdb and postgres refuse root: run them as the postgres OS user then."""
    if os.geteuid() != 0:
        return {}
    pw = pwd.getpwnam("postgres")

    def demote():
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
    return {"preexec_fn": demote}


class Cluster:
    """A throwaway cluster on a Unix socket in a folder of its own."""

    def __init__(self, bindir, name, port, settings):
        self.bindir, self.port = bindir, port
        self.dir = tempfile.mkdtemp(prefix=f"durable_ledger_bench_{name}.")
        os.chmod(self.dir, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = os.path.join(self.dir, "data")
        subprocess.run([os.path.join(bindir, "initdb"), "-D", self.data, "-A", "trust", "-U", "postgres"],
                       check=True, stdout=subprocess.DEVNULL, cwd=self.dir, **as_cluster_user())
        with open(os.path.join(self.data, "postgresql.conf"), "a") as conf:
            conf.write("\n".join(["listen_addresses = ''", f"unix_socket_directories = '{self.dir}'",
                                  f"port = {port}"] + list(settings)) + "\n")
        subprocess.run([os.path.join(bindir, "pg_ctl"), "-D", self.data, "-l", os.path.join(self.dir, "log"),
                        "-w", "start"], check=True, stdout=subprocess.DEVNULL, cwd=self.dir, **as_cluster_user())
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            self.pid = int(f.readline())

    def dsn(self, dbname="postgres"):
        return f"host={self.dir} port={self.port} dbname={dbname} user=postgres"

    def sql(self, dbname, *statements):
        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def cpu(self):
        """Seconds of CPU the cluster has used: the postmaster's, its reaped children's
        and its live children's."""
        total = 0
        for pid in [self.pid] + children(self.pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue  # ended meanwhile: its time is its parent's cutime by the next read
            total += int(fields[11]) + int(fields[12])  # utime, stime
            if pid == self.pid:
                total += int(fields[13]) + int(fields[14])  # cutime, cstime of reaped children
        return total / TICKS

    def client_backends(self):
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                                " AND pid <> pg_backend_pid()").fetchone()[0]

    def stop(self):
        subprocess.run([os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "fast", "stop"],
                       stdout=subprocess.DEVNULL, cwd=self.dir, **as_cluster_user())
        shutil.rmtree(self.dir, ignore_errors=True)


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def quiet(clusters):
    """Waits until no client backend is left on any cluster (a round's have exited and
    been reaped: their CPU is in the postmaster's cutime)."""
    deadline = time.monotonic() + 60
    while any(c.client_backends() for c in clusters):
        if time.monotonic() > deadline:
            raise SystemExit("proxy section: client backends did not end")
        time.sleep(0.02)


def pgbench_round(args, script, clients, dsn, logdir, tag, defines, rate=None):
    """One pgbench round (``rate``: at most that many pairs a second, spread over the
    clients): (effects/s, p50 ms, p99 ms, effects, client CPU seconds)."""
    prefix = os.path.join(logdir, tag)
    cmd = [args.pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, os.cpu_count() or 2)),
           "-T", str(args.seconds), "-l", f"--log-prefix={prefix}", "-f", os.path.join(HERE, script)]
    if rate:
        cmd += ["-R", str(rate)]
    for name, value in defines.items():
        cmd += ["-D", f"{name}={value}"]
    cmd.append(dsn)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"pgbench failed: {done.stderr.strip()}")
    latencies = []
    for name in os.listdir(logdir):
        if name.startswith(tag + "."):
            with open(os.path.join(logdir, name)) as f:
                for line in f:
                    fields = line.split()
                    if fields[2] == "failed":
                        raise SystemExit(f"pgbench: a transaction of {script} failed")
                    latencies.append(int(fields[2]))
            os.remove(os.path.join(logdir, name))
    latencies.sort()
    q = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))] / 1000.0
    tps = next(float(line.split("=")[1].split()[0]) for line in done.stdout.splitlines() if line.startswith("tps ="))
    client_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return tps, q(0.50), q(0.99), len(latencies), client_cpu


def measured(args, script, clients, dsn, logdir, tag, defines, shards, proxy, rate=None):
    """A round with the CPU each part used: a dict."""
    quiet(shards + ([proxy] if proxy else []))
    shard_cpu = [c.cpu() for c in shards]
    proxy_cpu = proxy.cpu() if proxy else 0.0
    tps, p50, p99, effects, client_cpu = pgbench_round(args, script, clients, dsn, logdir, tag, defines, rate)
    quiet(shards + ([proxy] if proxy else []))
    return {"tps": tps, "p50": p50, "p99": p99, "effects": effects, "client": client_cpu,
            "shards": sum(c.cpu() - b for c, b in zip(shards, shard_cpu)),
            "proxy": (proxy.cpu() - proxy_cpu) if proxy else 0.0}


def median(results, key):
    return statistics.median(r[key] for r in results)


def per_effect_us(results, key):
    return statistics.median(r[key] / r["effects"] * 1e6 for r in results)


def per_cpu_second(results, *keys):
    return statistics.median(r["effects"] / sum(r[k] for k in keys) for r in results)


def proxy_section(args, bindir, settings, logdir, clients=8):
    """The section's rows: (measure, ratio, target, context)."""
    base = args.port + 10
    shards = [Cluster(bindir, f"shard{i}", base + i, settings) for i in range(3)]
    proxy = Cluster(bindir, "proxy", base + 3, [s for s in settings if "shared_preload_libraries" not in s])
    rows = []
    try:
        for shard in shards:
            shard.sql("postgres", "CREATE EXTENSION durable_ledger",
                      # new calls in every attempt, as the bench's other sections (bench.py)
                      "SELECT durable_ledger.register_tool('bank.pay', 'bench', divergence => 'off')")
        for n in (1, 2, 3):
            partitions = ", ".join(f"p{i} 'host={s.dir} port={s.port} dbname=postgres'"
                                   for i, s in enumerate(shards[:n]))
            proxy.sql("postgres", f"CREATE DATABASE proxy{n}")
            proxy.sql(f"proxy{n}", "CREATE EXTENSION durable_ledger_proxy CASCADE",
                      f"CREATE SERVER durable_ledger_shards FOREIGN DATA WRAPPER plproxy"
                      f" OPTIONS (modular_mapping '1', {partitions})",
                      "CREATE USER MAPPING FOR PUBLIC SERVER durable_ledger_shards")
        rounds = iter(range(10**6))

        def direct():
            return measured(args, "direct_pair.sql", clients, shards[0].dsn(), logdir, "direct",
                            {"have_lease": 0, "round": next(rounds)}, shards[:1], None)

        def through(n, rate=None):
            return lambda: measured(args, "proxy_pair.sql", clients, proxy.dsn(f"proxy{n}"), logdir, f"proxy{n}",
                                    {"have_lease": 0, "round": next(rounds)}, shards[:n], proxy, rate)

        d, p = [], []
        for r in range(args.rounds):
            for side in ((direct, d), (through(1), p)) if r % 2 == 0 else ((through(1), p), (direct, d)):
                side[1].append(side[0]())
        rows.append((f"begin+complete through the proxy vs direct, 1 shard, {clients} clients (throughput)",
                     median(p, "tps") / median(d, "tps"), "(context)",
                     f"proxy {median(p, 'tps'):.0f} pairs/s (p50 {median(p, 'p50'):.2f} ms, p99 {median(p, 'p99'):.2f} ms); "
                     f"direct {median(d, 'tps'):.0f} pairs/s (p50 {median(d, 'p50'):.2f} ms, p99 {median(d, 'p99'):.2f} ms)"))
        rows.append(("CPU per effect through the proxy vs direct (shard + proxy + client)",
                     per_effect_us(p, "shards") / per_effect_us(d, "shards"), "(context)",
                     f"through the proxy: shard {per_effect_us(p, 'shards'):.0f} µs, proxy {per_effect_us(p, 'proxy'):.0f} µs, "
                     f"client {per_effect_us(p, 'client'):.0f} µs per pair; direct: shard {per_effect_us(d, 'shards'):.0f} µs, "
                     f"client {per_effect_us(d, 'client'):.0f} µs (the ratio is the shard's)"))

        # the same load whatever the number of shards, short of what the two cores can
        # carry: the CPU an effect costs then, not the machine's saturation, is measured
        rate = int(median(d, "tps") * 0.25)
        scaled = {n: [] for n in (1, 2, 3)}
        for r in range(args.rounds):
            for n in ((1, 2, 3) if r % 2 == 0 else (3, 2, 1)):
                scaled[n].append(through(n, rate)())
        one = per_cpu_second(scaled[1], "shards")
        for n in (1, 2, 3):
            rows.append((f"{n} shard{'s' if n > 1 else ''}: effects per shard CPU-second vs 1 shard",
                         per_cpu_second(scaled[n], "shards") / one, "≥ 0.9" if n > 1 else "(baseline)",
                         f"{median(scaled[n], 'tps'):.0f} pairs/s (p50 {median(scaled[n], 'p50'):.2f} ms, "
                         f"p99 {median(scaled[n], 'p99'):.2f} ms); {per_cpu_second(scaled[n], 'shards'):.0f} per shard "
                         f"CPU-second, {per_cpu_second(scaled[n], 'shards', 'proxy', 'client'):.0f} per CPU-second of "
                         f"everything ({clients} clients, at most {rate} pairs/s)"))
    finally:
        for cluster in shards + [proxy]:
            cluster.stop()
    return rows
