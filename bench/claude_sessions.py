"""Agent sessions on the Anthropic Messages, OpenAI Responses and chat routes, for the overhead benchmark
(issue 14).

Real conversations from ../shared/traces (read in place): the longest mini-swe-agent ones (long tool
outputs) and the longest tau2-bench ones (tool calls and results), each turned into the request its agent
would send at every model call:
- Claude-style (`/v1/messages`, bench/to_messages.py), shaped as Claude Code sends it (the messages first,
  then the system prompt and Claude Code's 16 tools), with the cache markers Claude Code sets: on the
  system prompt, and on the last block of the newest message, so the marker moves every turn; streamed,
  as Claude Code asks every turn;
- Codex-style (`/v1/responses`, bench/to_responses.py), shaped as Codex sends it with `store: false`: the
  whole history in `input`, its `prompt_cache_key` naming the conversation, streamed;
- chat-style (`/v1/chat/completions`), as the traces' own agents sent them through litellm: the whole
  history every turn, not streamed.

Measured interleaved: every server is up at once and each request goes to each of them in turn (the order
rotating), `concurrency` sessions at a time, so a change in the machine's speed during the run moves every
server alike (measured one after another, the same pair's ratio swung from 1.4 to 2.7 here). CPU per
request is each server's own (/proc) over the whole run, after one warm-up request of the same shape each
(as the other scenarios warm up): what a server does once in its life (ctxproxy builds Claude's tokenizer
at its first Claude request, 0.1-0.3 s) is its start's, not every request's.
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
from bench.measure import in_turn
from bench.procstat import rss_mb, settled_cpu_seconds
from bench.session_replay import TRACES
from bench.to_messages import to_messages
from bench.to_responses import to_responses

MARK = {"type": "ephemeral"}
HEADERS = {"x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01", "content-type": "application/json"}
CODEX_HEADERS = {"authorization": "Bearer sk-bench", "content-type": "application/json"}
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
            "max_tokens": body["max_tokens"], "stream": True}


def session_requests(messages: list[dict[str, Any]], session: str = "0") -> list[bytes]:
    """One request per model call: each prefix that ends before an assistant message."""
    return [orjson.dumps(claude_code_shaped(marked(to_messages(messages[:end], called_in=messages)), session))
            for end, message in enumerate(messages) if end and message.get("role") == "assistant"]


def codex_requests(messages: list[dict[str, Any]], session: str = "0") -> list[bytes]:
    """The same model calls as Codex sends them (`store: false`): instructions, the whole input, tools."""
    out = []
    for end, message in enumerate(messages):
        if end and message.get("role") == "assistant":
            body = to_responses(messages[:end], called_in=messages)
            out.append(orjson.dumps({**body, "tool_choice": "auto", "parallel_tool_calls": False,
                                     "reasoning": {"effort": "medium", "summary": "auto"}, "stream": True,
                                     "include": ["reasoning.encrypted_content"],
                                     "prompt_cache_key": f"codex-{session}"}))
    return out


def chat_requests(messages: list[dict[str, Any]], session: str = "0") -> list[bytes]:
    """The same model calls as the traces' own agents made them (mini-swe-agent and tau2-bench through
    litellm): chat completions, the whole history every turn, not streamed."""
    return [orjson.dumps({"model": "gpt-4o", "messages": messages[:end]})
            for end, message in enumerate(messages) if end and message.get("role") == "assistant"]


SHAPES: dict[str, tuple[str, dict[str, str], Callable[[list[dict[str, Any]], str], list[bytes]]]] = {
    "claude": ("/v1/messages", HEADERS, session_requests),
    "codex": ("/v1/responses", CODEX_HEADERS, codex_requests),
    "chat": ("/v1/chat/completions", CODEX_HEADERS, chat_requests)}


def claude_sessions(sessions: int, traces: Path = TRACES, shape: str = "claude") -> list[list[bytes]]:
    """The longest `sessions` conversations, half from each source."""
    requests_of = SHAPES[shape][2]
    found: list[list[bytes]] = []
    for number, name in enumerate(SOURCES):
        lines = (traces / name).read_bytes().splitlines()
        conversations = sorted((orjson.loads(line)["messages"] for line in lines if line.strip()),
                               key=lambda m: len(orjson.dumps(m)), reverse=True)
        wanted = sessions // len(SOURCES) + (number < sessions % len(SOURCES))
        found += [requests_of(messages, f"{number}-{n}") for n, messages in enumerate(conversations[:wanted])]
    return found


async def run_sessions(urls: list[str], headers: dict[str, str], sessions: list[list[bytes]],
                       concurrency: int) -> tuple[list[list[float]], list[int], list[str]]:
    """Every session's requests in turn, `concurrency` sessions at a time, each request sent to every url
    in turn (the order rotating): per url, (milliseconds, errors, the first error's text)."""
    limits = httpx.Limits(max_connections=concurrency * len(urls),
                          max_keepalive_connections=concurrency * len(urls))
    gate = asyncio.Semaphore(concurrency)
    took: list[list[float]] = [[] for _ in urls]
    errors = [0] * len(urls)
    first_error = [""] * len(urls)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=60.0) as client:
        async def session(number: int, requests: list[bytes]) -> None:
            async with gate:
                for turn, body in enumerate(requests):
                    for at in in_turn(len(urls), number + turn):
                        began = time.perf_counter()
                        try:
                            response = await client.post(urls[at], content=body,
                                                         headers={"x-ctxproxy-session": f"agent-{number}"})
                            await response.aread()
                            failed = "" if response.status_code == 200 else \
                                f"{response.status_code} {response.text[:300]}"
                        except httpx.HTTPError as exc:
                            failed = f"{type(exc).__name__}: {exc}"
                        if failed:
                            errors[at] += 1
                            first_error[at] = first_error[at] or failed
                        took[at].append((time.perf_counter() - began) * 1000)

        await asyncio.gather(*(session(n, requests) for n, requests in enumerate(sessions)))
    return took, errors, first_error


def measure(starters: dict[str, Callable[[], Any]], started: list[Any], sessions: int,
            concurrency: int = 16, shape: str = "claude",
            prefixes: dict[str, str] | None = None) -> dict[str, Any]:
    """The targets, each in a fresh server (`starters`: name -> a function starting it; they go in
    `started` to be stopped on failure), measured interleaved: requests, errors, seconds (the whole run,
    shared), server CPU, p50/p99 ms, RSS after. `prefixes`: name -> what goes before the route's path
    (`/p/passthrough`: ctxproxy with every layer off)."""
    path, headers, _ = SHAPES[shape]
    requests = claude_sessions(sessions, shape=shape)
    found: dict[str, Any] = {"sessions": sessions, "concurrency": concurrency, "shape": shape, "path": path,
                             "interleaved": True, "warmed_up": True,
                             "requests_per_run": sum(map(len, requests)),
                             "mb_sent": sum(map(len, (b for s in requests for b in s))) / 1e6}
    services = {}
    for name, start in starters.items():
        services[name] = start()
        started.append(services[name])
    print(f"... {shape}-style sessions: {', '.join(services)} interleaved, {sessions} sessions on {path}",
          file=sys.stderr)
    urls = [service.base + (prefixes or {}).get(name, "") + path for name, service in services.items()]
    greeting = [{"role": "user", "content": "Warm up."}, {"role": "assistant", "content": "Ok."}]
    warm_up = SHAPES[shape][2](greeting, "warm-up")
    _, failed, first_error = asyncio.run(run_sessions(urls, headers, [warm_up], 1))
    if any(failed):
        raise RuntimeError(f"the warm-up request failed: {first_error}")
    cpu_before = {name: settled_cpu_seconds(s.proc.pid) for name, s in services.items()}
    began = time.perf_counter()
    took, errors, first_error = asyncio.run(run_sessions(urls, headers, requests, concurrency))
    seconds = time.perf_counter() - began
    for (name, service), times, failed, error in zip(services.items(), took, errors, first_error,
                                                     strict=True):
        times.sort()
        found[name] = {"requests": len(times), "errors": failed, "first_error": error, "seconds": seconds,
                       "cpu_s": settled_cpu_seconds(service.proc.pid) - cpu_before[name],
                       "p50_ms": times[len(times) // 2], "p99_ms": times[int(len(times) * 0.99)],
                       "rss_mb": rss_mb(service.proc.pid)}
    for service in services.values():
        service.stop()
    return found
