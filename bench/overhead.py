"""How much latency ctxproxy adds over calling the upstream directly, compared with LiteLLM's proxy.

Run: `python bench/overhead.py [--quick] [--json] [--no-litellm]` with the project's venv python.
Everything runs on 127.0.0.1: a fake upstream, ctxproxy and LiteLLM each in their own process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import random
import signal
import sqlite3
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from payloads import big_history, chat_body
from report import print_report
from services import Service, ServiceError, start_ctxproxy, start_fake, start_litellm

CHAT = "/v1/chat/completions"


@dataclass
class Target:
    name: str
    url: str


@dataclass
class LatencyRow:
    scenario: str
    target: str
    n: int
    p50_ms: float
    p99_ms: float
    added_p50_ms: float | None
    added_p99_ms: float | None
    errors: int


@dataclass
class ThroughputRow:
    target: str
    requests: int
    concurrency: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


# ------------------------------------------------------------------------------------ measuring

def percentile(values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (as numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * pct / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def one_request(client: httpx.Client, url: str, body: bytes, stream: bool) -> float:
    """Seconds to the last byte of the response; raises on a wrong status or a cut stream."""
    started = time.perf_counter()
    with client.stream("POST", url, content=body) as response:
        tail = b""
        for chunk in response.iter_raw():
            tail = (tail + chunk)[-64:]
        elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {response.status_code}")
    if stream and b"[DONE]" not in tail:
        raise RuntimeError(f"{url}: stream did not end with [DONE]")
    return elapsed


def measure_latency(client: httpx.Client, targets: list[Target], scenario: str, body: bytes, stream: bool,
                    iterations: int, warmup: int) -> list[LatencyRow]:
    """Sequential requests; each iteration calls every target once, in a shuffled order."""
    rng = random.Random(scenario)
    for target in targets:  # warm-up also checks every target answers correctly
        for _ in range(warmup):
            one_request(client, target.url, body, stream)
    samples: dict[str, list[float]] = {t.name: [] for t in targets}
    errors = dict.fromkeys(samples, 0)
    order = list(targets)
    for _ in range(iterations):
        rng.shuffle(order)  # so drift and any target's background work touch all of them alike
        for target in order:
            try:
                samples[target.name].append(one_request(client, target.url, body, stream) * 1000)
            except (httpx.HTTPError, RuntimeError):
                errors[target.name] += 1
    base = samples[targets[0].name]
    rows = []
    for target in targets:
        got = samples[target.name]
        p50, p99 = percentile(got, 50), percentile(got, 99)
        direct = target is targets[0]
        rows.append(LatencyRow(scenario, target.name, len(got), p50, p99,
                               None if direct else p50 - percentile(base, 50),
                               None if direct else p99 - percentile(base, 99), errors[target.name]))
    return rows


async def _throughput(target: Target, headers: dict[str, str], body: bytes, total: int, concurrency: int,
                      time_limit: float) -> ThroughputRow:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30.0) as client:
        async def warm() -> None:
            with contextlib.suppress(httpx.HTTPError):
                await client.post(target.url, content=body)

        await asyncio.gather(*(warm() for _ in range(concurrency)))  # open every connection first
        latencies: list[float] = []
        errors = 0
        remaining = total
        deadline = time.perf_counter() + time_limit

        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0 and time.perf_counter() < deadline:
                remaining -= 1
                started = time.perf_counter()
                try:
                    response = await client.post(target.url, content=body)
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    done = len(latencies) + errors
    return ThroughputRow(target.name, done, concurrency, seconds, len(latencies) / seconds,
                         percentile(latencies, 50), percentile(latencies, 99), errors)


# ------------------------------------------------------------------------------------ reporting

def archive_summary(service: Service) -> dict[str, Any]:
    """Stop ctxproxy with SIGINT (graceful: the writer flushes), then count what it recorded."""
    code = service.stop(signal.SIGINT, timeout=60)
    path = Path(service.extra["archive"])
    if not path.exists():
        return {"exit_code": code, "error": f"no archive at {path}"}
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        total = db.execute("select count(*) from exchanges").fetchone()[0]
        by = db.execute("select policy, stream, status, count(*) from exchanges group by 1, 2, 3").fetchall()
        messages = db.execute("select count(*) from messages").fetchone()[0]
    return {"exit_code": code, "exchanges": total, "messages": messages, "db_bytes": path.stat().st_size,
            "by_policy_stream_status": [list(row) for row in by]}


def ctxproxy_self_report(client: httpx.Client, base: str) -> float | None:
    """Mean of ctxproxy's own `ctxproxy_added_seconds` histogram (non-stream: total minus upstream)."""
    text = client.get(base + "/metrics").text
    values: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("ctxproxy_added_seconds_sum", "ctxproxy_added_seconds_count"):
            if line.startswith(name + "{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    count = values.get("ctxproxy_added_seconds_count")
    return values["ctxproxy_added_seconds_sum"] / count * 1000 if count else None


# ----------------------------------------------------------------------------------------- main

def run(args: argparse.Namespace, workdir: Path, started: list[Service]) -> dict[str, Any]:
    quick = args.quick
    iters = {"small": 40, "stream": 30, "history_500KB": 8} if quick else {
        "small": 300, "stream": 200, "history_500KB": 50}
    warm = {"small": 10, "stream": 5, "history_500KB": 2} if quick else {
        "small": 30, "stream": 20, "history_500KB": 5}
    total = args.requests or (300 if quick else 2000)

    fake = start_fake(workdir)
    started.append(fake)
    ctx = start_ctxproxy(workdir, fake.base, args.src)
    started.append(ctx)
    litellm_status, key = "skipped (--no-litellm)", "sk-bench"
    litellm: Service | None = None
    if not args.no_litellm:
        try:
            litellm = start_litellm(workdir, fake.base)
            started.append(litellm)
            key, litellm_status = litellm.extra["key"], "ran (litellm proxy, uvicorn+uvloop, no DB)"
        except (ServiceError, OSError) as exc:
            litellm_status = f"SKIPPED: could not start LiteLLM's proxy: {exc}"
            print(litellm_status, file=sys.stderr)

    targets = [Target("direct", fake.base + CHAT), Target("ctxproxy default", ctx.base + CHAT),
               Target("ctxproxy passthrough", ctx.base + "/p/passthrough" + CHAT)]
    if litellm is not None:
        targets.append(Target("litellm", litellm.base + CHAT))
    # Every target gets the same bytes and headers; LiteLLM checks the key, the others forward it.
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    history = big_history()
    payloads: dict[str, tuple[bytes, bool]] = {
        "small": (chat_body([{"role": "user", "content": "Say hello in five words."}]), False),
        "stream": (chat_body([{"role": "user", "content": "Count to twenty."}], stream=True), True),
        "history_500KB": (chat_body(history), False),
    }
    ctx_targets = sum(t.name.startswith("ctxproxy") for t in targets)
    latency: list[LatencyRow] = []
    with httpx.Client(headers=headers, timeout=60.0) as client:
        for scenario, (body, stream) in payloads.items():
            print(f"... {scenario}: {iters[scenario]} iterations x {len(targets)} targets", file=sys.stderr)
            latency += measure_latency(client, targets, scenario, body, stream, iters[scenario],
                                       warm[scenario])
        sent = sum((iters[s] + warm[s]) * ctx_targets for s in payloads)
        throughput: list[ThroughputRow] = []
        for target in [t for t in targets if t.name != "ctxproxy passthrough"]:
            print(f"... throughput: {target.name}", file=sys.stderr)
            row = asyncio.run(_throughput(target, headers, payloads["small"][0], total, args.concurrency,
                                          args.time_limit))
            sent += (row.requests + args.concurrency) if target.name.startswith("ctxproxy") else 0
            throughput.append(row)
        added_mean = ctxproxy_self_report(client, ctx.base)
    return {
        "mode": "quick" if quick else "full", "ctxproxy_src": str(args.src or "installed package"),
        "python": platform.python_version(), "cpus": _cpus(),
        "concurrency": args.concurrency, "latency": [asdict(r) for r in latency],
        "throughput": [asdict(r) for r in throughput], "big_bytes": len(payloads["history_500KB"][0]),
        "big_messages": len(history), "ctxproxy_added_mean_ms": added_mean, "ctxproxy_requests": sent,
        "archive": archive_summary(ctx), "litellm": litellm_status,
    }


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="far fewer iterations (a smoke run)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    parser.add_argument("--no-litellm", action="store_true", help="do not start LiteLLM's proxy")
    parser.add_argument("--src", type=Path, help="run ctxproxy from this folder's proxy/ package (e.g. a "
                        "`git archive` snapshot) instead of the installed editable checkout")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=0, help="throughput requests per target")
    parser.add_argument("--time-limit", type=float, default=120.0, help="throughput seconds per target (cap)")
    args = parser.parse_args()
    started: list[Service] = []
    with tempfile.TemporaryDirectory(prefix="ctxproxy-bench-") as tmp:
        try:
            result = run(args, Path(tmp), started)
        except (ServiceError, RuntimeError, httpx.HTTPError) as exc:
            print(f"benchmark aborted: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        finally:
            for service in reversed(started):  # stop everything we started, by pid
                service.stop(signal.SIGINT if service.name == "ctxproxy" else signal.SIGTERM)
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
