"""Requests/s with one and two ctxproxy replicas on PostgreSQL, against one process on SQLite (issue 13).

Run: `python bench/replicas.py [--quick] [--json] [--rounds N] [--src DIR]` with the project's venv python
(PostgreSQL's `initdb`/`pg_ctl` must be installed: `apt-get install -y postgresql`, as scripts/test does).
`--quick` is a smoke run (about a minute, most of it starting things); the full run takes about 7 minutes on
an idle machine, more when other work makes it wait and repeat batches (`--quiet-wait 0 --retries 0`: no).

What runs, all on 127.0.0.1 of this machine, each in its own process:
- a throwaway PostgreSQL server (tests/postgres_server.py: initdb in /tmp, TCP; fsync and
  synchronous_commit off, as in the tests), one database per PostgreSQL target;
- the scripted fake upstream of the other benches (bench/fake_upstream.py: a fixed completion, or a
  20-event stream, whatever it is sent);
- four ctxproxy processes, default policy and default config (`archive.pool_size` 20), each with its own
  data_dir (bench/services.py `start_ctxproxy`). The targets:
  (a) `sqlite`: one process, SQLite archive in its data_dir (the default; the reference);
  (b) `pg 1 replica`: one process with `archive.url` on PostgreSQL;
  (c) `pg 2 replicas`: two processes on one PostgreSQL database; the client alternates requests between
      them round-robin per request (one counter over all the target's requests, as a load balancer does),
      so consecutive turns of a session land on either replica: the per-session ledger lock, the state
      commit and the catch-up after the other replica moved the session on are all exercised.
- the load generator: this process, aiohttp on uvloop. httpx (the other benches' client) spends ~1.4 ms
  of CPU per 50 KB request here, aiohttp ~0.1 ms: the client shares the two CPUs with what it measures.

Traffic, the same bodies for every target (fixed seeds; session ids fresh per target and round):
- `agent`: agent sessions of 10..50 turns (uniform). Every request resends the whole history so far
  under the session's `x-ctxproxy-session`: a ~2 KB system prompt, the task, three tool definitions, then
  per turn one assistant tool call and its result (85 % of results 1-4 KB of log/code-like text, 15 %
  9-12 KB, ~3,000 tokens): ~3.7 KB a turn, up to ~190 KB. Two thirds of the sessions are on gpt-4o
  (128k window: the default policy forwards them whole), a third on gpt-3.5-turbo (16k window: past ~15
  turns the policy masks old results, decisions the ledger commits with the session's snapshot). 1.5 x
  concurrency sessions a batch, pulled from a queue by `concurrency` workers; a worker runs its session's
  turns one after another, as an agent waits for each answer (so a session never has two requests in
  flight: the per-session lock is taken on every request but not waited for).
- `small`: one-shot requests (1-3 short messages, ~0.3 KB, a quarter with `stream: true`), each its own
  session; 1,500 a batch.
Each scenario at concurrency 16 and 64. The targets are interleaved: after a warm-up batch per target,
every round runs each scenario on each target in a shuffled order; the tables sum the rounds.

Measured, per scenario and target:
- req/s: requests completed while all workers were busy ÷ that time (the agent queue runs dry before the
  end and the last sessions run with fewer workers); `req/s all`: every request ÷ the whole batch; p50 and
  p99 of each request's time to its last byte; errors (a status other than 200, or a transport error).
- CPU seconds per 1,000 requests, utime+stime from /proc, read before and after each batch once every
  process has gone quiet (background work such as archive writes counts): the target's proxies;
  PostgreSQL (the postmaster and every process under it, plus what its exited children used); the fake
  upstream; the load generator (during the batch only). `ceiling req/s` = CPUs x 1,000 ÷ their sum: the
  rate these costs allow if nothing else ran and every CPU were kept busy.
- Cores each used during the batch (CPU seconds ÷ batch seconds), and `other`: the machine's non-idle
  time (/proc/stat) minus all of the above, i.e. work on this machine that is not the benchmark's. Before
  each batch the benchmark waits (up to --quiet-wait s) for the machine to be idle; a batch during which
  other work used more than --max-other cores is run again (--retries), and the least disturbed attempt
  is kept. Every attempt is listed.
- Archive: each target's proxies are stopped with SIGINT (a clean shutdown: the writer flushes its
  spool), then `select count(*), count(distinct id) from exchanges` in its database (SQLite file or
  PostgreSQL database) is compared with every request sent to that target (warm-up and repeated batches
  included). They must be equal. Also what the policy did (ctxproxy_actions from each proxy's /metrics).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import platform
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop
from measure import percentile
from procstat import TICKS
from replicas_load import (
    Batch,
    Jobs,
    Meters,
    agent_jobs,
    agent_plans,
    log,
    machine_busy_ticks,
    run_batch,
    self_cpu_seconds,
    small_jobs,
    tree_cpu_seconds,
)
from replicas_report import print_report
from services import Service, ServiceError, start_ctxproxy, start_fake

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.postgres_server import PostgresNotInstalled, PostgresServer  # noqa: E402

# ------------------------------------------------------------------------------------ the run


@dataclass
class Target:
    name: str
    services: list[Service]
    archive: str  # the SQLite file, or the PostgreSQL database's URL
    sent: int = 0

    @property
    def bases(self) -> list[str]:
        return [s.base for s in self.services]


@dataclass
class Tally:
    """One scenario on one target, summed over the rounds."""

    scenario: str
    concurrency: int
    target: str
    latencies: list[float] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    steady_requests: int = 0
    steady_seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # settled: background work after the batch counts
    during: dict[str, float] = field(default_factory=dict)  # between the batch's first and last request
    busy_s: float = 0.0  # the machine's non-idle CPU seconds during the batches
    replica_cpu: list[float] = field(default_factory=list)  # during, each replica
    quiet_waits: float = 0.0

    def add(self, batch: Batch, cpu: dict[str, float], during: dict[str, float], busy_s: float,
            replicas: list[float], waited: float) -> None:
        self.latencies += batch.latencies
        self.requests += batch.sent
        self.errors += batch.errors
        self.seconds += batch.seconds
        self.steady_requests += batch.steady_requests
        self.steady_seconds += batch.steady_seconds
        for into, values in ((self.cpu, cpu), (self.during, during)):
            for name, value in values.items():
                into[name] = into.get(name, 0.0) + value
        self.busy_s += busy_s
        pairs = itertools.zip_longest(self.replica_cpu, replicas, fillvalue=0.0)
        self.replica_cpu = [a + b for a, b in pairs]
        self.quiet_waits += waited

    def row(self, cpus: int) -> dict[str, Any]:
        per_1000 = {name: value / self.requests * 1000 if self.requests else None
                    for name, value in self.cpu.items()}
        total = sum(v for v in per_1000.values() if v is not None)
        seconds = self.seconds or math.nan
        other = self.busy_s - sum(self.during.values())  # processes of no component: not ours
        return {
            "scenario": self.scenario, "concurrency": self.concurrency, "target": self.target,
            "requests": self.requests, "errors": self.errors, "seconds": self.seconds,
            "rps": self.steady_requests / self.steady_seconds if self.steady_seconds else None,
            "rps_all": (self.requests - self.errors) / seconds,
            "p50_ms": percentile(self.latencies, 50), "p99_ms": percentile(self.latencies, 99),
            "cpu_s": dict(self.cpu), "cpu_per_1000": per_1000, "cpu_per_1000_total": total,
            "ceiling_rps": cpus * 1000 / total if total else None,
            "busy_pct": self.busy_s / (seconds * cpus) * 100,
            "cores": {name: value / seconds for name, value in self.during.items()},
            "replica_cores": [value / seconds for value in self.replica_cpu],
            "other_cores": other / seconds,
            "quiet_wait_s": self.quiet_waits,
        }


def wait_for_quiet_machine(limit: float, share: float = 0.1) -> float:
    """Once our processes are quiet: wait (at most `limit` s) until the machine's non-idle share over
    half a second is below `share` (other work on this machine, e.g. a test suite, distorts throughput).
    Returns the seconds waited."""
    began = time.monotonic()
    while True:
        busy0, total0 = machine_busy_ticks()
        time.sleep(0.5)
        busy1, total1 = machine_busy_ticks()
        load = (busy1 - busy0) / max(total1 - total0, 1)
        waited = time.monotonic() - began
        if load < share:
            return waited
        if waited >= limit:
            log(f"the machine is still {load * 100:.0f} % busy with other work after {waited:.0f} s")
            return waited


def scenarios(args: argparse.Namespace) -> list[tuple[str, int]]:
    return [(kind, c) for kind in ("agent", "small") for c in args.concurrency]


def make_jobs(kind: str, concurrency: int, args: argparse.Namespace, seed: int, label: str) -> Jobs:
    if kind == "agent":
        return agent_jobs(agent_plans(round(args.sessions_per_worker * concurrency), seed, args.min_turns,
                                      args.max_turns), label)
    return small_jobs(args.small_requests, seed, label)


def measure(targets: list[Target], meters: dict[str, Meters], args: argparse.Namespace,
            cpus: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    batches: list[dict[str, Any]] = []
    tallies = {(kind, c, t.name): Tally(kind, c, t.name) for kind, c in scenarios(args) for t in targets}
    everyone = Meters({name if name != "proxies" else f"proxies of {t.name}": reader
                       for t in targets for name, reader in meters[t.name].readers.items()})
    log("warm-up")
    for target in targets:  # opens the pools (64 at once), loads what the first requests load
        for kind, concurrency in (("small", max(args.concurrency)), ("agent", min(args.concurrency))):
            warm = argparse.Namespace(**{**vars(args), "small_requests": 2 * max(args.concurrency),
                                         "sessions_per_worker": 1, "min_turns": 3, "max_turns": 3})
            batch = uvloop.run(run_batch(target.bases, concurrency,
                                         make_jobs(kind, concurrency, warm, 99, f"warm-{target.name}")))
            target.sent += batch.sent
    order = list(targets)
    rng = random.Random(13)
    for round_ in range(args.rounds):
        for kind, concurrency in scenarios(args):
            rng.shuffle(order)
            for target in order:
                seed = 1000 * round_ + concurrency + (0 if kind == "agent" else 500)  # same for every target
                attempts: list[tuple[float, dict[str, Any], tuple[Any, ...]]] = []
                for attempt in range(args.retries + 1):
                    everyone.settle()
                    waited = wait_for_quiet_machine(args.quiet_wait)
                    actions_before = proxy_metrics(target.services)["actions"]
                    meter = meters[target.name]
                    before = meter.read()
                    replicas_before = [tree_cpu_seconds(s.proc.pid) for s in target.services]
                    busy0, _ = machine_busy_ticks()
                    jobs = make_jobs(kind, concurrency, args, seed, f"{target.name[:6]}-r{round_}")
                    batch = uvloop.run(run_batch(target.bases, concurrency, jobs))
                    busy1, _ = machine_busy_ticks()
                    end = meter.read()
                    replicas = [tree_cpu_seconds(s.proc.pid) - b
                                for s, b in zip(target.services, replicas_before, strict=True)]
                    during = {name: end[name] - before[name] for name in meter.readers}
                    everyone.settle()
                    after = meter.read()
                    cpu = {name: after[name] - before[name] for name in meter.readers}
                    cpu["load generator"] = during["load generator"]  # not its polling while settling
                    actions = proxy_metrics(target.services)["actions"]
                    actions = {k: v - actions_before.get(k, 0) for k, v in actions.items()
                               if v != actions_before.get(k, 0)}
                    target.sent += batch.sent
                    busy_s = (busy1 - busy0) / TICKS
                    other = (busy_s - sum(during.values())) / batch.seconds
                    record = {"round": round_ + 1, "scenario": kind, "concurrency": concurrency,
                              "target": target.name, "attempt": attempt + 1, "requests": batch.sent,
                              "errors": batch.errors, "seconds": batch.seconds,
                              "rps": batch.steady_requests / batch.steady_seconds, "other_cores": other,
                              "failures": batch.failures, "actions": actions, "kept": False}
                    batches.append(record)
                    attempts.append((other, record, (batch, cpu, during, busy_s, replicas, waited)))
                    again = other > args.max_other and attempt < args.retries
                    log(f"round {round_ + 1}/{args.rounds} {kind} c={concurrency} {target.name}: "
                        f"{batch.sent} requests in {batch.seconds:.1f}s, {batch.errors} errors, "
                        f"other work {other:.2f} cores" + (": run again" if again else ""))
                    if not again:
                        break
                _, record, measured = min(attempts, key=lambda a: a[0])  # the least disturbed
                record["kept"] = True
                tallies[(kind, concurrency, target.name)].add(*measured)
    return [t.row(cpus) for t in tallies.values()], batches


def proxy_metrics(services: list[Service]) -> dict[str, Any]:
    """From the proxies' /metrics, summed over replicas: what the default policy did (ctxproxy_actions) and
    the mean of ctxproxy_added_seconds (handler time outside the upstream call), warm-up included."""
    actions: dict[str, float] = {}
    added_sum = added_count = 0.0
    for service in services:
        for line in httpx.get(service.base + "/metrics", timeout=30).text.splitlines():
            if line.startswith("ctxproxy_actions_total{"):
                labels, value = line.rsplit(" ", 1)
                action = labels.partition('action="')[2].partition('"')[0]
                actions[action] = actions.get(action, 0.0) + float(value)
            elif line.startswith("ctxproxy_added_seconds_sum{"):
                added_sum += float(line.rsplit(" ", 1)[1])
            elif line.startswith("ctxproxy_added_seconds_count{"):
                added_count += float(line.rsplit(" ", 1)[1])
    return {"actions": {k: int(v) for k, v in sorted(actions.items())},
            "added_mean_ms": added_sum / added_count * 1000 if added_count else None}


def count_archived(target: Target) -> dict[str, Any]:
    """Stop the target's proxies cleanly (SIGINT: the writer flushes), then count its exchanges."""
    try:
        metrics = proxy_metrics(target.services)
    except httpx.HTTPError as exc:
        metrics = {"error": repr(exc)}
    codes = [s.stop(signal.SIGINT, timeout=90) for s in target.services]
    query = "select count(*), count(distinct id) from exchanges"
    database: dict[str, Any] = {}
    try:
        if target.archive.startswith("postgresql://"):
            import psycopg

            with psycopg.connect(target.archive) as conn:
                row = conn.execute(query).fetchone()
                stats = conn.execute(
                    "select xact_commit, xact_rollback, deadlocks, tup_inserted, tup_updated, tup_fetched "
                    "from pg_stat_database where datname = current_database()").fetchone()
                names = ("commits", "rollbacks", "deadlocks", "rows_inserted", "rows_updated", "rows_fetched")
                database = dict(zip(names, stats or (), strict=False))
        else:
            with contextlib.closing(sqlite3.connect(f"file:{target.archive}?mode=ro", uri=True)) as db:
                row = db.execute(query).fetchone()
    except Exception as exc:  # reported, not raised: the other targets' counts still matter
        return {"target": target.name, "sent": target.sent, "exit_codes": codes, "error": repr(exc),
                "metrics": metrics}
    total, distinct = row or (0, 0)  # an aggregate always returns a row
    return {"target": target.name, "sent": target.sent, "exchanges": total, "distinct_ids": distinct,
            "exit_codes": codes, "equal": total == distinct == target.sent, "metrics": metrics,
            "database": database}


def source_of(args: argparse.Namespace) -> str:
    if args.src:
        return str(args.src)
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "proxy"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "installed package"
    return f"working tree at {head}" + (" (proxy/ has uncommitted changes)" if dirty else "")


def run(args: argparse.Namespace, workdir: Path, started: list[Service],
        servers: list[PostgresServer]) -> dict[str, Any]:
    began = time.monotonic()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    log("PostgreSQL")
    pg = PostgresServer.start(tcp=True)
    servers.append(pg)
    postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
    fake = start_fake(workdir)
    started.append(fake)
    pool = {"pool_size": args.pool_size} if args.pool_size else {}
    targets: list[Target] = []
    log("ctxproxy x4")
    sqlite_proxy = start_ctxproxy(workdir, fake.base, args.src, name="sqlite")
    started.append(sqlite_proxy)
    targets.append(Target("sqlite", [sqlite_proxy], sqlite_proxy.extra["archive"]))
    for name, count in (("pg 1 replica", 1), ("pg 2 replicas", 2)):
        database = f"bench_{count}"
        pg.create_database(database)
        url = pg.url(database, tcp=True)
        services = []
        for n in range(count):
            service = start_ctxproxy(workdir, fake.base, args.src, name=f"{database}_{'ab'[n]}",
                                     archive={"url": url, **pool})
            started.append(service)
            services.append(service)
        targets.append(Target(name, services, url))

    def cpu_of(services: list[Service]) -> Callable[[], float]:
        return lambda: sum(tree_cpu_seconds(s.proc.pid) for s in services)

    common: dict[str, Callable[[], float]] = {
        "postgres": lambda: tree_cpu_seconds(postmaster), "fake upstream": cpu_of([fake]),
        "load generator": self_cpu_seconds}  # settle() leaves this one out (its own polling)
    meters = {t.name: Meters({"proxies": cpu_of(t.services), **common}) for t in targets}
    rows, batches = measure(targets, meters, args, cpus)
    log("stopping the proxies, counting the archives")
    archives = [count_archived(t) for t in targets]
    return {
        "mode": "quick" if args.quick else "full", "python": platform.python_version(), "cpus": cpus,
        "ctxproxy_src": source_of(args), "postgres": str(pg.bin_dir), "pool_size": args.pool_size or 20,
        "rounds": args.rounds, "concurrency": args.concurrency,
        "agent": {"sessions_per_batch": [round(args.sessions_per_worker * c) for c in args.concurrency],
                  "turns": [args.min_turns, args.max_turns]},
        "small_requests_per_batch": args.small_requests,
        "rows": rows, "batches": batches, "retries": args.retries, "max_other": args.max_other,
        "archives": archives, "wall_s": time.monotonic() - began,
    }


# ----------------------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run (seconds)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    parser.add_argument("--rounds", type=int, default=0, help="interleaved rounds (default 2; quick 1)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--sessions-per-worker", type=float, default=0,
                        help="agent sessions a batch per worker (default 1.5; quick 1)")
    parser.add_argument("--min-turns", type=int, default=0, help="default 10; quick 2")
    parser.add_argument("--max-turns", type=int, default=0, help="default 50; quick 6")
    parser.add_argument("--small-requests", type=int, default=0, help="default 1500; quick 200")
    parser.add_argument("--pool-size", type=int, default=0,
                        help="archive.pool_size (default: the config's, 20)")
    parser.add_argument("--quiet-wait", type=float, default=10.0, help="seconds to wait before a batch "
                        "for other work on the machine to stop (default 10)")
    parser.add_argument("--retries", type=int, default=1, help="run a batch again (at most this many times) "
                        "when other work on the machine used more than --max-other cores during it")
    parser.add_argument("--max-other", type=float, default=0.3, help="cores (default 0.3)")
    parser.add_argument("--src", type=Path, help="run ctxproxy from this folder's proxy/ package (e.g. a "
                        "`git archive` snapshot) instead of the installed editable checkout")
    args = parser.parse_args()
    for key, full, quick in (("rounds", 2, 1), ("sessions_per_worker", 1.5, 1), ("min_turns", 10, 2),
                             ("max_turns", 50, 6), ("small_requests", 1500, 200)):
        if not getattr(args, key):
            setattr(args, key, quick if args.quick else full)
    started: list[Service] = []
    servers: list[PostgresServer] = []
    with tempfile.TemporaryDirectory(prefix="ctxproxy-replicas-") as tmp:
        try:
            result = run(args, Path(tmp), started, servers)
        except (ServiceError, PostgresNotInstalled, RuntimeError, OSError, httpx.HTTPError) as exc:
            print(f"benchmark aborted: {type(exc).__name__}: {exc}", file=sys.stderr)
            for service in started:
                if service.name not in ("fake upstream",) and service.proc.poll() is not None:
                    print(f"--- {service.name} ---\n{service.log_tail()}", file=sys.stderr)
            return 1
        finally:
            for service in reversed(started):  # stop everything we started, by pid
                service.stop(signal.SIGTERM if service.name == "fake upstream" else signal.SIGINT)
            for server in servers:
                server.stop()
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
