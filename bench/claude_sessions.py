"""Claude-style sessions on the Anthropic Messages route, for the overhead benchmark (issue 14).

Real conversations from ../shared/traces (read in place): the longest mini-swe-agent ones (long tool
outputs) and the longest tau2-bench ones (tool calls and results), each turned into the Messages request
its agent would send at every model call (bench/to_messages.py), shaped as Claude Code sends it (the
messages first, then the system prompt and Claude Code's 16 tools), with the cache markers Claude Code
sets: on the system prompt, and on the last block of the newest message, so the marker moves every turn. The
sessions run `concurrency` at a time through a fresh server; CPU per request is the server's (/proc).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.procstat import rss_mb, settled_cpu_seconds
from bench.session_replay import TRACES
from bench.to_messages import to_messages

MARK = {"type": "ephemeral"}
HEADERS = {"x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01", "content-type": "application/json"}
SOURCES = ("miniswe_gemini3pro_swebv_dev.jsonl", "tau2bench_dev.jsonl")


# Claude Code's own tools (16, ~15 KB: tests/fixtures/make_claude_code_request.py), sent every turn.
CLAUDE_CODE_TOOLS = orjson.loads((Path(__file__).resolve().parent.parent / "tests" / "fixtures" /
                                  "claude_code_request.json").read_bytes())["tools"]


def marked(body: dict[str, Any]) -> dict[str, Any]:
    """The body with Claude Code's markers: the system prompt, and the newest message's last block."""
    if isinstance(body.get("system"), str):
        body["system"] = [{"type": "text", "text": body["system"], "cache_control": MARK}]
    last = body["messages"][-1]
    last["content"] = [*last["content"][:-1], {**last["content"][-1], "cache_control": MARK}]
    return body


def claude_code_shaped(body: dict[str, Any], session: str) -> dict[str, Any]:
    """As Claude Code sends it: the messages first, then the system prompt and its tools (the
    conversation's own after them), metadata, max_tokens, stream."""
    theirs = {tool["name"] for tool in CLAUDE_CODE_TOOLS}
    own = [tool for tool in body.get("tools") or () if tool["name"] not in theirs]
    return {"model": body["model"], "messages": body["messages"],
            **({"system": body["system"]} if "system" in body else {}),
            "tools": [*CLAUDE_CODE_TOOLS, *own], "metadata": {"user_id": f"user_{session}"},
            "max_tokens": body["max_tokens"], "stream": False}


def session_requests(messages: list[dict[str, Any]], session: str = "0") -> list[bytes]:
    """One request per model call: each prefix that ends before an assistant message."""
    return [orjson.dumps(claude_code_shaped(marked(to_messages(messages[:end], called_in=messages)), session))
            for end, message in enumerate(messages) if end and message.get("role") == "assistant"]


def claude_sessions(sessions: int, traces: Path = TRACES) -> list[list[bytes]]:
    """The longest `sessions` conversations, half from each source."""
    found: list[list[bytes]] = []
    for number, name in enumerate(SOURCES):
        lines = (traces / name).read_bytes().splitlines()
        conversations = sorted((orjson.loads(line)["messages"] for line in lines if line.strip()),
                               key=lambda m: len(orjson.dumps(m)), reverse=True)
        wanted = sessions // len(SOURCES) + (number < sessions % len(SOURCES))
        found += [session_requests(messages, f"{number}-{n}")
                  for n, messages in enumerate(conversations[:wanted])]
    return found


async def run_sessions(url: str, headers: dict[str, str], sessions: list[list[bytes]],
                       concurrency: int) -> tuple[list[float], int]:
    """Every session's requests in turn, `concurrency` sessions at a time: (milliseconds, errors)."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    took: list[float] = []
    errors = 0
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=60.0) as client:
        async def session(number: int, requests: list[bytes]) -> None:
            nonlocal errors
            async with gate:
                for body in requests:
                    began = time.perf_counter()
                    try:
                        response = await client.post(url, content=body,
                                                     headers={"x-ctxproxy-session": f"claude-{number}"})
                        errors += response.status_code != 200
                    except httpx.HTTPError:
                        errors += 1
                    took.append((time.perf_counter() - began) * 1000)

        await asyncio.gather(*(session(n, requests) for n, requests in enumerate(sessions)))
    return took, errors


def measure(starters: dict[str, Callable[[], Any]], started: list[Any], sessions: int,
            concurrency: int = 16) -> dict[str, Any]:
    """Each target in a fresh server (`starters`: name -> a function starting it; they go in `started`
    to be stopped on failure): requests, errors, seconds, server CPU, p50/p99 ms, RSS after."""
    requests = claude_sessions(sessions)
    found: dict[str, Any] = {"sessions": sessions, "concurrency": concurrency,
                             "requests_per_run": sum(map(len, requests)),
                             "mb_sent": sum(map(len, (b for s in requests for b in s))) / 1e6}
    for name, start in starters.items():
        service = start()
        started.append(service)
        print(f"... Claude-style sessions: {name}, {sessions} sessions on /v1/messages", file=sys.stderr)
        cpu_before, began = settled_cpu_seconds(service.proc.pid), time.perf_counter()
        url = service.base + "/v1/messages"
        took, errors = asyncio.run(run_sessions(url, HEADERS, requests, concurrency))
        seconds = time.perf_counter() - began
        took.sort()
        found[name] = {"requests": len(took), "errors": errors, "seconds": seconds,
                       "cpu_s": settled_cpu_seconds(service.proc.pid) - cpu_before,
                       "p50_ms": took[len(took) // 2], "p99_ms": took[int(len(took) * 0.99)],
                       "rss_mb": rss_mb(service.proc.pid)}
        service.stop()
    return found

