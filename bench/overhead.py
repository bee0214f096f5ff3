"""How much latency ctxproxy adds over calling the upstream directly, compared with LiteLLM's proxy.

Run: `python bench/overhead.py [--quick] [--json] [--no-litellm]` with the project's venv python.
Everything runs on 127.0.0.1: a fake upstream (OpenAI- and Anthropic-shaped), ctxproxy and LiteLLM each
in their own process. The `*_by_route` scenarios send the same small request through ctxproxy's chat
route, its Anthropic Messages route and its OpenAI Responses route (each against the fake upstream's own
route, called directly), interleaved in one loop, so the routes' added latency compare (goal: each within
0.3 ms of chat at p50).
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
from fake_upstream import ANSWERS
from payloads import big_history, chat_body
from report import print_report
from services import Service, ServiceError, start_ctxproxy, start_fake, start_litellm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.to_responses import to_responses

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
# What the last bytes of a complete stream hold, by format (chat, Messages, Responses).
STREAM_ENDS = (b"[DONE]", b"event: message_stop", b"event: response.completed")
TAIL_BYTES = 4096  # response.completed carries the whole Response (~1.5 KB here) after its name
ANTHROPIC_VERSION = "2023-06-01"


@dataclass
class Target:
    name: str
    url: str
    body: bytes | None = None  # this target's own request (another wire format); None: the scenario's
    headers: dict[str, str] | None = None  # added to the client's
    base: str | None = None  # the direct target `added` is measured against; None: the first target


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


def one_request(client: httpx.Client, url: str, body: bytes, stream: bool,
                headers: dict[str, str] | None = None) -> float:
    """Seconds to the last byte of the response; raises on a wrong status or a cut stream."""
    started = time.perf_counter()
    with client.stream("POST", url, content=body, headers=headers) as response:
        tail = b""
        for chunk in response.iter_raw():
            tail = (tail + chunk)[-TAIL_BYTES:]
        elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {response.status_code}")
    if stream and not any(end in tail for end in STREAM_ENDS):
        raise RuntimeError(f"{url}: stream did not end with [DONE], message_stop or response.completed")
    return elapsed


def measure_latency(client: httpx.Client, targets: list[Target], scenario: str, body: bytes, stream: bool,
                    iterations: int, warmup: int) -> list[LatencyRow]:
    """Sequential requests; each iteration calls every target once, in a shuffled order."""
    rng = random.Random(scenario)
    for target in targets:  # warm-up also checks every target answers correctly
        for _ in range(warmup):
            one_request(client, target.url, target.body or body, stream, target.headers)
    samples: dict[str, list[float]] = {t.name: [] for t in targets}
    errors = dict.fromkeys(samples, 0)
    order = list(targets)
    for _ in range(iterations):
        rng.shuffle(order)  # so drift and any target's background work touch all of them alike
        for target in order:
            try:
                samples[target.name].append(
                    one_request(client, target.url, target.body or body, stream, target.headers) * 1000)
            except (httpx.HTTPError, RuntimeError):
                errors[target.name] += 1
    rows = []
    for target in targets:
        got = samples[target.name]
        base = samples[target.base or targets[0].name]
        p50, p99 = percentile(got, 50), percentile(got, 99)
        direct = target.name == (target.base or targets[0].name)
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


def ctxproxy_self_report(client: httpx.Client, base: str) -> tuple[float | None, dict[str, float]]:
    """Mean of ctxproxy's own `ctxproxy_added_seconds` histogram (non-stream: total minus upstream), over
    all its requests and by route."""
    text = client.get(base + "/metrics").text
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for name, into in (("ctxproxy_added_seconds_sum", sums), ("ctxproxy_added_seconds_count", counts)):
            if line.startswith(name + "{"):
                labels, value = line.rsplit(" ", 1)
                route = labels.partition('route="')[2].partition('"')[0]
                into[route] = into.get(route, 0.0) + float(value)
    by_route = {r: sums.get(r, 0.0) / n * 1000 for r, n in counts.items() if n}
    total = sum(counts.values())
    return (sum(sums.values()) / total * 1000 if total else None), by_route


SMALL = [{"role": "user", "content": "Say hello in five words."}]
ROUTES = ("messages", "responses")  # compared with chat


def route_targets(fake: Service, ctx: Service, key: str, stream: bool) -> list[Target]:
    """Direct and through ctxproxy, for each route the proxy serves; the messages targets send the same
    request in Anthropic's shape with its headers, the responses targets in the Responses shape."""
    anthropic = {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION}
    targets = [Target("direct chat", fake.base + CHAT),
               Target("ctxproxy chat", ctx.base + CHAT, base="direct chat")]
    if ctx.extra.get("messages"):
        body = messages_body(SMALL, stream=stream)
        targets += [Target("direct messages", fake.base + MESSAGES, body, anthropic, base="direct messages"),
                    Target("ctxproxy messages", ctx.base + MESSAGES, body, anthropic, base="direct messages")]
    if ctx.extra.get("responses"):
        body = responses_body(SMALL, stream=stream)
        targets += [Target("direct responses", fake.base + RESPONSES, body, base="direct responses"),
                    Target("ctxproxy responses", ctx.base + RESPONSES, body, base="direct responses")]
    return targets


def messages_body(messages: list[dict[str, Any]], *, stream: bool = False) -> bytes:
    body: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": messages}
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def responses_body(messages: list[dict[str, Any]], *, stream: bool = False) -> bytes:
    """The same request as a stateless Responses client sends it (bench/to_responses.py)."""
    body = to_responses(messages, model="gpt-4o")
    body["max_output_tokens"] = 64
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def route_gap(rows: list[LatencyRow]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per route scenario and route: the route's added latency minus the chat route's (p50, p99)."""
    gaps: dict[str, dict[str, dict[str, float | None]]] = {}
    for scenario in dict.fromkeys(r.scenario for r in rows if r.scenario.endswith("_by_route")):
        by = {r.target: r for r in rows if r.scenario == scenario}
        chat = by["ctxproxy chat"]
        for route in ROUTES:
            row = by.get(f"ctxproxy {route}")
            if row is None:
                continue
            gaps.setdefault(scenario, {})[route] = {
                "p50_ms": None if chat.added_p50_ms is None or row.added_p50_ms is None
                else row.added_p50_ms - chat.added_p50_ms,
                "p99_ms": None if chat.added_p99_ms is None or row.added_p99_ms is None
                else row.added_p99_ms - chat.added_p99_ms}
    return gaps


# ----------------------------------------------------------------------------------------- main

def run(args: argparse.Namespace, workdir: Path, started: list[Service]) -> dict[str, Any]:
    quick = args.quick
    iters = {"small": 40, "stream": 30, "history_500KB": 8, "small_by_route": 100,
             "stream_by_route": 60} if quick else {
        "small": 300, "stream": 200, "history_500KB": 50, "small_by_route": 1000, "stream_by_route": 400}
    warm = {"small": 10, "stream": 5, "history_500KB": 2, "small_by_route": 10, "stream_by_route": 5} \
        if quick else {"small": 30, "stream": 20, "history_500KB": 5, "small_by_route": 50,
                       "stream_by_route": 20}
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
        for scenario, stream in (("small_by_route", False), ("stream_by_route", True)):
            routes = route_targets(fake, ctx, key, stream)
            if len(routes) == 2:  # a --src snapshot with the chat route only: nothing to compare
                break
            print(f"... {scenario}: {iters[scenario]} iterations x {len(routes)} targets", file=sys.stderr)
            latency += measure_latency(client, routes, scenario, chat_body(SMALL, stream=stream), stream,
                                       iters[scenario], warm[scenario])
            sent += (iters[scenario] + warm[scenario]) * sum(t.name.startswith("ctxproxy") for t in routes)
        throughput: list[ThroughputRow] = []
        for target in [t for t in targets if t.name != "ctxproxy passthrough"]:
            print(f"... throughput: {target.name}", file=sys.stderr)
            row = asyncio.run(_throughput(target, headers, payloads["small"][0], total, args.concurrency,
                                          args.time_limit))
            sent += (row.requests + args.concurrency) if target.name.startswith("ctxproxy") else 0
            throughput.append(row)
        added_mean, added_by_route = ctxproxy_self_report(client, ctx.base)
    return {
        "mode": "quick" if quick else "full", "ctxproxy_src": str(args.src or "installed package"),
        "python": platform.python_version(), "cpus": _cpus(),
        "concurrency": args.concurrency, "latency": [asdict(r) for r in latency],
        "throughput": [asdict(r) for r in throughput], "big_bytes": len(payloads["history_500KB"][0]),
        "big_messages": len(history), "ctxproxy_added_mean_ms": added_mean,
        "ctxproxy_added_mean_ms_by_route": added_by_route, "route_gap": route_gap(latency),
        "stream_events": {route: len(events) for route, (_, _, events) in ANSWERS.items()},
        "ctxproxy_requests": sent,
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
