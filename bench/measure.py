"""Measuring for the overhead benchmark: sequential interleaved latency (with time to first byte) and
concurrent throughput, against a list of targets."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from dataclasses import dataclass

import httpx
import orjson

# What the last bytes of a complete stream hold, by format (chat, Messages, Responses).
STREAM_ENDS = (b"[DONE]", b"event: message_stop", b"event: response.completed")
TAIL_BYTES = 4096  # response.completed carries the whole Response (~1.5 KB here) after its name


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
                headers: dict[str, str] | None = None) -> tuple[float, float]:
    """Seconds to the first byte of the body and to its last; raises on a wrong status or a cut stream."""
    started = time.perf_counter()
    first = None
    with client.stream("POST", url, content=body, headers=headers) as response:
        tail = b""
        for chunk in response.iter_raw():
            if first is None:
                first = time.perf_counter() - started
            tail = (tail + chunk)[-TAIL_BYTES:]
        elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {response.status_code}")
    if stream and not any(end in tail for end in STREAM_ENDS):
        raise RuntimeError(f"{url}: stream did not end with [DONE], message_stop or response.completed")
    return (elapsed if first is None else first), elapsed


def send_ms(client: httpx.Client, url: str, body: bytes, headers: dict[str, str] | None) -> float:
    """Milliseconds to the last byte of a non-streaming answer."""
    return one_request(client, url, body, False, headers)[1] * 1000


def latency_rows(targets: list[Target], scenario: str, samples: dict[str, list[float]],
                 errors: dict[str, int]) -> list[LatencyRow]:
    """Percentiles of each target's samples (ms), and added = target minus its base (default: the first)."""
    rows = []
    for target in targets:
        got = samples[target.name]
        base_name = target.base or targets[0].name
        base = samples[base_name]
        p50, p99 = percentile(got, 50), percentile(got, 99)
        direct = target.name == base_name
        rows.append(LatencyRow(scenario, target.name, len(got), p50, p99,
                               None if direct else p50 - percentile(base, 50),
                               None if direct else p99 - percentile(base, 99), errors[target.name]))
    return rows


def measure_latency(client: httpx.Client, targets: list[Target], scenario: str, body: bytes, stream: bool,
                    iterations: int, warmup: int, ttfb: bool = False) -> list[LatencyRow]:
    """Sequential requests; each iteration calls every target once, in a shuffled order. With `ttfb`, also
    rows for the time to the first byte (scenario `<scenario>_ttfb`)."""
    rng = random.Random(scenario)
    for target in targets:  # warm-up also checks every target answers correctly
        for _ in range(warmup):
            one_request(client, target.url, target.body or body, stream, target.headers)
    samples: dict[str, list[float]] = {t.name: [] for t in targets}
    firsts: dict[str, list[float]] = {t.name: [] for t in targets}
    errors = dict.fromkeys(samples, 0)
    order = list(targets)
    for _ in range(iterations):
        rng.shuffle(order)  # so drift and any target's background work touch all of them alike
        for target in order:
            try:
                first, last = one_request(client, target.url, target.body or body, stream, target.headers)
            except (httpx.HTTPError, RuntimeError):
                errors[target.name] += 1
                continue
            samples[target.name].append(last * 1000)
            firsts[target.name].append(first * 1000)
    rows = latency_rows(targets, scenario, samples, errors)
    if ttfb:
        rows += latency_rows(targets, f"{scenario}_ttfb", firsts, errors)
    return rows


async def throughput(target: Target, headers: dict[str, str], body: bytes, total: int, concurrency: int,
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




def in_turn(targets: int, first: int) -> list[int]:
    """The targets' indexes from `first` round to the one before it: one request sent to every target in
    turn, the order rotating with `first`, so none is always the first (or the last) to get it."""
    first %= targets
    return [*range(first, targets), *range(first)]


async def session_load(urls: list[str], headers: dict[str, str], sessions: int, turns: int,
                       concurrency: int) -> list[tuple[int, int]]:
    """`sessions` conversations of `turns` turns each, every turn resending the whole history under its
    own x-ctxproxy-session (as agents do), `concurrency` conversations at a time; each turn sent to every
    url in turn (the order rotating), so a change in the machine's speed during the run moves every server
    alike: per url, (requests, errors)."""
    limits = httpx.Limits(max_connections=concurrency * len(urls),
                          max_keepalive_connections=concurrency * len(urls))
    gate = asyncio.Semaphore(concurrency)
    sent, errors = [0] * len(urls), [0] * len(urls)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=60.0) as client:
        async def conversation(number: int) -> None:
            messages: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful agent."}]
            async with gate:
                for turn in range(turns):
                    messages.append({"role": "user", "content": f"Session {number}, turn {turn}: what next? "
                                     + "Some context about the task at hand. " * 4})
                    body = orjson.dumps({"model": "gpt-4o", "messages": messages})
                    for at in in_turn(len(urls), number + turn):
                        try:
                            response = await client.post(urls[at], content=body,
                                                         headers={"x-ctxproxy-session": f"load-{number}"})
                            ok = response.status_code == 200
                        except httpx.HTTPError:
                            ok = False
                        sent[at], errors[at] = sent[at] + 1, errors[at] + (not ok)
                    messages.append({"role": "assistant", "content": f"Done step {turn}; next."})

        await asyncio.gather(*(conversation(n) for n in range(sessions)))
    return list(zip(sent, errors, strict=True))
