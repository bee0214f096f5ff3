"""How much latency ctxproxy adds over calling the upstream directly, compared with a bare forwarder
(the floor, bench/bare_forwarder.py) and LiteLLM's proxy.

Run: `python bench/overhead.py [--quick] [--json] [--no-litellm]` with the project's venv python.
Everything runs on 127.0.0.1: a fake upstream (OpenAI- and Anthropic-shaped), ctxproxy, the bare
Starlette + httpx forwarder and LiteLLM each in their own process, called interleaved in one loop. It
reports ctxproxy ÷ bare forwarder for added latency (small, stream time to first byte and to the last,
a 500 KB synthetic history, and real mini-swe-agent sessions resent turn by turn from 10 KB to 2 MB of
history, bench/session_replay.py), server CPU seconds per 1,000 requests (/proc) at concurrency 1 and 16,
cold start and RSS at start (issue 14). The `*_by_route` scenarios send the same small request through
ctxproxy's chat, Anthropic Messages and OpenAI Responses routes (each against the fake upstream's own
route, called directly), so the routes' added latency compare (goal: each within 0.3 ms of chat at p50).
Last, Claude-style sessions on the Messages route, Codex-style ones on the Responses route and the same
sessions on the chat route as their own agents sent them (bench/claude_sessions.py): real sessions with
Claude Code's moving cache marker, with Codex's whole history resent, and plain, CPU per request against
the floor's, each server fresh and all measured interleaved:
ctxproxy with the default policy, ctxproxy with every layer off (`/p/passthrough`), the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import platform
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import claude_sessions
import httpx
import orjson
from fake_upstream import ANSWERS
from measure import (
    LatencyRow,
    Target,
    ThroughputRow,
    latency_rows,
    measure_latency,
    send_ms,
    session_load,
    throughput,
)
from payloads import big_history, chat_body
from procstat import first_answer, rss_mb, settled_cpu_seconds
from ratios import cpu_ratios, latency_ratios
from report import print_report
from services import Service, ServiceError, start_bare, start_ctxproxy, start_fake, start_litellm
from session_replay import SIZES, TRACE, replay, session_bodies

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.to_responses import to_responses

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
ANTHROPIC_VERSION = "2023-06-01"


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
    turns, sessions = (3, 1) if quick else (16, 4)

    fake = start_fake(workdir)
    started.append(fake)
    probe = {"authorization": "Bearer sk-bench", "content-type": "application/json"}
    ctx, bare, startup = _cold_starts(args, workdir, fake, probe, started)
    sent = 1  # ctxproxy's cold-start probe
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
               Target("ctxproxy passthrough", ctx.base + "/p/passthrough" + CHAT),
               Target("bare forwarder", bare.base + CHAT)]
    if litellm is not None:
        targets.append(Target("litellm", litellm.base + CHAT))
    # Every target gets the same bytes and headers; LiteLLM checks the key, the others forward it.
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    history = big_history()
    payloads: dict[str, tuple[bytes, bool]] = {
        "small": (chat_body(SMALL), False),
        "stream": (chat_body([{"role": "user", "content": "Count to twenty."}], stream=True), True),
        "history_500KB": (chat_body(history), False),
    }
    ctx_targets = sum(t.name.startswith("ctxproxy") for t in targets)
    latency: list[LatencyRow] = []
    with httpx.Client(headers=headers, timeout=60.0) as client:
        for scenario, (body, stream) in payloads.items():
            print(f"... {scenario}: {iters[scenario]} iterations x {len(targets)} targets", file=sys.stderr)
            latency += measure_latency(client, targets, scenario, body, stream, iters[scenario],
                                       warm[scenario], ttfb=stream)
        sent += sum((iters[s] + warm[s]) * ctx_targets for s in payloads)
        session_status, body_bytes = "ran", {}
        try:
            bodies = session_bodies(SIZES, turns, chat_body)
        except (OSError, ValueError) as exc:
            session_status = f"SKIPPED: {exc}"
            print(session_status, file=sys.stderr)
        else:
            body_bytes = {label: [len(turns_of[0]), len(turns_of[-1])] for label, turns_of in bodies.items()}
            replayed = [t for t in targets if t.name != "litellm"]
            print(f"... real session: {sessions} x {turns} turns at {', '.join(SIZES)}", file=sys.stderr)
            samples, errors = replay(lambda url, body, hdrs: send_ms(client, url, body, hdrs), replayed,
                                     bodies, sessions)
            for scenario in samples:
                latency += latency_rows(replayed, scenario, samples[scenario], errors[scenario])
            sent += len(SIZES) * sessions * turns * ctx_targets
        for scenario, stream in (("small_by_route", False), ("stream_by_route", True)):
            routes = route_targets(fake, ctx, key, stream)
            if len(routes) == 2:  # a --src snapshot with the chat route only: nothing to compare
                break
            print(f"... {scenario}: {iters[scenario]} iterations x {len(routes)} targets", file=sys.stderr)
            latency += measure_latency(client, routes, scenario, chat_body(SMALL, stream=stream), stream,
                                       iters[scenario], warm[scenario])
            sent += (iters[scenario] + warm[scenario]) * sum(t.name.startswith("ctxproxy") for t in routes)
        rows: list[ThroughputRow] = []
        cpu: list[dict[str, Any]] = []
        servers = {"direct": fake, "ctxproxy default": ctx, "bare forwarder": bare}
        levels = [int(n) for n in args.concurrency.split(",")]
        for concurrency in dict.fromkeys((1, *levels)):
            for target in [t for t in targets if t.name in servers or concurrency == levels[0]]:
                if target.name == "ctxproxy passthrough":
                    continue
                print(f"... throughput: {target.name}, concurrency {concurrency}", file=sys.stderr)
                server = servers.get(target.name)
                before = settled_cpu_seconds(server.proc.pid) if server else 0.0
                row = asyncio.run(throughput(target, headers, payloads["small"][0], total, concurrency,
                                             args.time_limit))
                requests = row.requests + concurrency  # with the warm-up requests
                if server:
                    seconds = settled_cpu_seconds(server.proc.pid) - before
                    cpu.append({"target": target.name, "concurrency": concurrency, "requests": requests,
                                "cpu_s": seconds, "cpu_per_1000": seconds / requests * 1000})
                sent += requests if target.name.startswith("ctxproxy") else 0
                rows.append(row)
        added_mean, added_by_route = ctxproxy_self_report(client, ctx.base)
    long_run = _long_run(args, workdir, fake, headers, started)
    startup["ctxproxy, restarted"] = long_run.pop("restart")
    # Each server fresh, all measured interleaved; ctxproxy once more with every layer off (its own process,
    # for its own CPU): what recording, decoding and counting cost apart from what the layers do.
    agents = {shape: claude_sessions.measure({
        "ctxproxy": functools.partial(start_ctxproxy, workdir, fake.base, args.src, name=f"ctxproxy-{shape}"),
        "ctxproxy passthrough": functools.partial(start_ctxproxy, workdir, fake.base, args.src,
                                                  name=f"ctxproxy-{shape}-passthrough"),
        "bare forwarder": functools.partial(start_bare, workdir, fake.base)}, started, args.claude_sessions,
        shape=shape, prefixes={"ctxproxy passthrough": "/p/passthrough"})
        for shape in ("claude", "codex", "chat")}
    return {
        "mode": "quick" if quick else "full", "ctxproxy_src": str(args.src or "installed package"),
        "python": platform.python_version(), "cpus": _cpus(),
        "concurrency": args.concurrency, "long_run": long_run, "claude_sessions": agents["claude"],
        "codex_sessions": agents["codex"], "chat_sessions": agents["chat"],
        "latency": [asdict(r) for r in latency],
        "throughput": [asdict(r) for r in rows], "big_bytes": len(payloads["history_500KB"][0]),
        "big_messages": len(history), "ctxproxy_added_mean_ms": added_mean,
        "ctxproxy_added_mean_ms_by_route": added_by_route, "route_gap": route_gap(latency),
        "ratios": latency_ratios([asdict(r) for r in latency]), "cpu": cpu_ratios(cpu), "startup": startup,
        "session": {"status": session_status, "trace": str(TRACE), "turns": turns, "sessions": sessions,
                    "sizes": SIZES, "body_bytes": body_bytes},
        "stream_events": {route: len(events) for route, (_, _, events) in ANSWERS.items()},
        "ctxproxy_requests": sent,
        "archive": archive_summary(ctx), "litellm": litellm_status,
    }


def _long_run(args: argparse.Namespace, workdir: Path, fake: Service, headers: dict[str, str],
              started: list[Service]) -> dict[str, Any]:
    """RSS and CPU after many sessions: `--long-run S,T` sessions of T turns each (the history resent every
    turn), 16 sessions at a time, through a fresh ctxproxy and a fresh floor (nothing else ran in them
    before), measured interleaved: each turn goes to both in turn, so the two see the same stretch of this
    machine's speed (one after the other, the same code's ratio read 0.86 to 1.46)."""
    sessions, turns = (int(n) for n in args.long_run.split(","))
    found: dict[str, Any] = {"sessions": sessions, "turns": turns, "interleaved": True}
    services = {"ctxproxy": start_ctxproxy(workdir, fake.base, args.src, name="ctxproxy-long"),
                "bare forwarder": start_bare(workdir, fake.base)}
    started.extend(services.values())
    at_start = {name: rss_mb(s.proc.pid) for name, s in services.items()}
    cpu_start = {name: settled_cpu_seconds(s.proc.pid) for name, s in services.items()}
    print(f"... long run: {', '.join(services)} interleaved, {sessions} sessions x {turns} turns",
          file=sys.stderr)
    began = time.perf_counter()
    urls = [service.base + CHAT for service in services.values()]
    counts = asyncio.run(session_load(urls, headers, sessions, turns, 16))
    seconds = time.perf_counter() - began
    for (name, service), (requests, errors) in zip(services.items(), counts, strict=True):
        found[name] = {"requests": requests, "errors": errors, "seconds": seconds,
                       "rss_start_mb": at_start[name], "rss_mb": rss_mb(service.proc.pid),
                       "cpu_s": settled_cpu_seconds(service.proc.pid) - cpu_start[name]}
    ctx = services["ctxproxy"]
    found["ctxproxy"]["gc"] = gc_pauses(ctx.base)
    services["bare forwarder"].stop(signal.SIGTERM)
    resumed = session_bodies({RESUMED: SIZES[RESUMED]}, 6, chat_body)[RESUMED]
    resumed_headers = {**headers, "x-ctxproxy-session": "resumed-" + os.urandom(6).hex()}
    before = _turns(ctx.base, resumed[:4], resumed_headers)
    ctx.stop(signal.SIGINT)
    again = start_ctxproxy(workdir, fake.base, args.src, name="ctxproxy-long")  # its data dir found: the
    started.append(again)  # archive, the tokenizer's cached ranks, the token counts kept at shutdown
    probe = {"authorization": "Bearer sk-bench", "content-type": "application/json"}
    found["restart"] = _startup(again, again.base + CHAT, chat_body(SMALL), probe)
    after = _turns(again.base, resumed[4:], resumed_headers)
    found["resumed"] = {"size": RESUMED, "first_sight_ms": before[0], "turns_ms": before[1:],
                        "after_restart_ms": after[0], "next_ms": after[1:]}
    again.stop(signal.SIGINT)
    return found


RESUMED = "2MB"  # the size of a real session continued across that restart (the counts kept at shutdown)


def _turns(base: str, bodies: list[bytes], headers: dict[str, str]) -> list[float]:
    """Milliseconds of each turn of a session, sent one after another."""
    with httpx.Client(timeout=120.0) as client:
        return [send_ms(client, base + CHAT, body, headers) for body in bodies]


def gc_pauses(base: str) -> dict[str, dict[str, float]] | None:
    """The server's garbage-collector pauses by generation, from /metrics (ctxproxy_gc_pause_seconds):
    how many, their total ms, and how many took over 25 ms. None when it does not export them."""
    try:
        text = httpx.get(base + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("ctxproxy_gc_pause_seconds"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        generation = name_labels.split('generation="', 1)[1].split('"', 1)[0]
        row = found.setdefault(generation, {"count": 0.0, "ms": 0.0, "under_25ms": 0.0})
        if name_labels.startswith("ctxproxy_gc_pause_seconds_count"):
            row["count"] = float(value)
        elif name_labels.startswith("ctxproxy_gc_pause_seconds_sum"):
            row["ms"] = float(value) * 1000
        elif 'le="0.025"' in name_labels:
            row["under_25ms"] = float(value)
    for row in found.values():
        row["over_25ms"] = row["count"] - row.pop("under_25ms")
    return found or None


COLD_STARTS = 3  # starts of each server, in turn; their median is the figure (one start moved 1.0 to 1.8 s)


def _cold_starts(args: argparse.Namespace, workdir: Path, fake: Service, probe: dict[str, str],
                 started: list[Service]) -> tuple[Service, Service, dict[str, dict[str, Any]]]:
    """ctxproxy (each a first start: an empty data dir) and the floor, started in turn COLD_STARTS times:
    each's median cold start, every start's, and its RSS at start. The last of each serves the run."""
    starts: dict[str, list[dict[str, float | None]]] = {"ctxproxy": [], "bare forwarder": []}
    for attempt in range(COLD_STARTS):
        last = attempt == COLD_STARTS - 1
        ctx = start_ctxproxy(workdir, fake.base, args.src, name="ctxproxy" if last else f"ctxproxy-{attempt}")
        started.append(ctx)
        starts["ctxproxy"].append(_startup(ctx, ctx.base + CHAT, chat_body(SMALL), probe))
        bare = start_bare(workdir, fake.base)
        started.append(bare)
        starts["bare forwarder"].append(_startup(bare, bare.base + CHAT, chat_body(SMALL), probe))
        if not last:
            ctx.stop(signal.SIGINT)
            bare.stop()
    startup = {name: {"cold_start_s": statistics.median(float(s["cold_start_s"] or 0) for s in found),
                      "cold_starts_s": [s["cold_start_s"] for s in found], "rss_mb": found[-1]["rss_mb"]}
               for name, found in starts.items()}
    return ctx, bare, startup


def _startup(service: Service, url: str, body: bytes, headers: dict[str, str]) -> dict[str, float | None]:
    """Cold start (process start to its first answer) and resident memory right after it."""
    return {"cold_start_s": first_answer(service.spawned, url, body, headers),
            "rss_mb": rss_mb(service.proc.pid)}


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
    parser.add_argument("--concurrency", default="16,64", help="throughput levels beside 1 (comma-separated; "
                        "LiteLLM and passthrough only at the first)")
    parser.add_argument("--long-run", default="100,200", help="SESSIONS,TURNS for the RSS after a long run "
                        "(--quick: 10,20)")
    parser.add_argument("--claude-sessions", type=int, default=32, help="Claude-style sessions on the "
                        "Messages route and Codex-style ones on the Responses route, 16 at a time "
                        "(bench/claude_sessions.py; --quick: 4)")
    parser.add_argument("--requests", type=int, default=0, help="throughput requests per target")
    parser.add_argument("--time-limit", type=float, default=120.0, help="throughput seconds per target (cap)")
    args = parser.parse_args()
    if args.quick and args.long_run == "100,200":
        args.long_run = "10,20"
    if args.quick and args.claude_sessions == 32:
        args.claude_sessions = 4
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
