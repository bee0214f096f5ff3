"""bench/faults.py's parts on all three wire formats: silent truncations and kill -9, per route.

Each route is driven as its agents drive it: /v1/chat/completions and /v1/responses with the official
`openai` SDK, /v1/messages with the official `anthropic` SDK (truncation); plain HTTP for the kill -9 load,
whose acknowledgement is read off the bytes (a 200, and a stream's last event). The upstream is
bench/fault_upstream.py.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import openai

from bench.services import Service

CHAT_TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
StartProxy = Callable[[Path, str, str], Service]  # (workdir, upstream, name) -> a running proxy
ROUTES = ("chat", "messages", "responses")
ROUTE_NAMES = {"chat": "/v1/chat/completions (openai SDK)", "messages": "/v1/messages (anthropic SDK)",
               "responses": "/v1/responses (openai SDK)"}
MODES = ("cut", "stall", "short")
PATHS = ("plain", "internal")  # internal: /p/small, a 40 KB tool result summarized, the proxy's tools added


def _histories(big: str) -> dict[str, dict[str, list]]:
    """Per route, the plain conversation and one whose `big` tool result the small policy summarizes."""
    return {
        "chat": {"plain": [{"role": "user", "content": "hi"}], "internal": [
            {"role": "user", "content": "run it"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": big},
            {"role": "user", "content": "and now?"}]},
        "messages": {"plain": [{"role": "user", "content": "hi"}], "internal": [
            {"role": "user", "content": "run it"},
            {"role": "assistant",
             "content": [{"type": "tool_use", "id": "toolu_1", "name": "run", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": big},
                                         {"type": "text", "text": "and now?"}]}]},
        "responses": {"plain": [{"type": "message", "role": "user", "content": "hi"}], "internal": [
            {"type": "message", "role": "user", "content": "run it"},
            {"type": "function_call", "call_id": "call_1", "name": "run", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": big},
            {"type": "message", "role": "user", "content": "and now?"}]},
    }


def _stream_once(proxy: Service, route: str, mode: str, path: str,
                 conversation: list) -> tuple[str, dict[str, str]]:
    """One streamed request through the route's official SDK, read to its end: (how it ended, the
    response headers). `whole` when the SDK returned (for a faulty stream: a cut answer taken as whole),
    `error event` when it raised on the stream, `HTTP <status>` when the request failed before streaming,
    else the name of the exception the SDK let through (raised, not silent)."""
    prefix = "/p/small" if path == "internal" else ""
    headers = {"x-fake-mode": mode} if mode else {}
    seen: dict[str, str] = {}
    try:
        if route == "messages":
            client = anthropic.Anthropic(base_url=f"{proxy.base}{prefix}", api_key="sk-ant-trunc",
                                         max_retries=0, timeout=60, default_headers=headers)
            with warnings.catch_warnings():  # the SDK warns about the model's end of life
                warnings.simplefilter("ignore", DeprecationWarning)
                raw = client.messages.with_raw_response.create(
                    model="claude-sonnet-4-5", max_tokens=100, messages=conversation, stream=True,
                    tools=[{"name": "run", "input_schema": {"type": "object"}}])
        else:
            client = openai.OpenAI(base_url=f"{proxy.base}{prefix}/v1", api_key="sk-trunc", max_retries=0,
                                   timeout=60, default_headers=headers)
            if route == "chat":
                raw = client.chat.completions.with_raw_response.create(
                    model="gpt-4o", messages=conversation, tools=CHAT_TOOLS, stream=True)
            else:
                raw = client.responses.with_raw_response.create(
                    model="gpt-5", input=conversation, stream=True, store=False,
                    tools=[{"type": "function", "name": "run", "parameters": {"type": "object"}}])
        seen = dict(raw.headers)
        with raw.parse() as stream:
            for _event in stream:
                pass
        return "whole", seen
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        # anthropic raises a status error for an `error` event too, with the stream's own 200
        return ("error event" if exc.status_code == 200 else f"HTTP {exc.status_code}"), seen
    except (openai.APIError, anthropic.APIError):
        return "error event", seen
    except Exception as exc:  # a transport error the SDK let through: raised, not silent
        return type(exc).__name__, seen


def silent_truncations(proxy: Service, per_case: int, big: str) -> dict[tuple[str, str], dict[str, int]]:
    """Streams cut, stalled or ended short upstream, plain and internal-tools path, on every route:
    per (route, mode), how each ended for the client (`whole` is the failure: a silent truncation).
    First a control: without a fault every stream ends whole, and the internal path shrank the prompt."""
    histories = _histories(big)
    shrunk = []
    for route in ROUTES:
        for path in PATHS:
            ending, headers = _stream_once(proxy, route, "", path, histories[route][path])
            before, after = (int(headers.get(f"x-ctxproxy-tokens-{k}", 0)) for k in ("before", "after"))
            if ending != "whole" or (path == "internal" and not after < before):
                raise RuntimeError(f"control {route} {path}: {ending}, tokens {before} -> {after}")
            if path == "internal":
                shrunk.append(f"{route} {before} -> {after}")
    print(f"control (no fault): every route and path streams whole; internal path tokens {', '.join(shrunk)}")
    cases = [(route, mode, path) for route in ROUTES for mode in MODES for path in PATHS] * per_case
    with ThreadPoolExecutor(8) as pool:  # stalls each wait the proxy's read timeout: overlap them
        endings = list(pool.map(lambda c: _stream_once(proxy, *c, histories[c[0]][c[2]])[0], cases))
    out: dict[tuple[str, str], dict[str, int]] = {}
    for (route, mode, _path), ending in zip(cases, endings, strict=True):
        counts = out.setdefault((route, mode), {})
        counts[ending] = counts.get(ending, 0) + 1
    return out


def print_truncations(results: dict[tuple[str, str], dict[str, int]]) -> None:
    print("\nsilent truncations (streams cut / stalled / ended short upstream, plain and internal-tools "
          "path; silent = the SDK returned a cut answer as whole):\n")
    print("| route | " + " | ".join(f"{m}: silent" for m in MODES)
          + " | total silent | how the others ended |")
    print("|---|" + "---|" * (len(MODES) + 2))
    silent = total = 0
    for route in ROUTES:
        cells, endings = [], {}
        for mode in MODES:
            counts = results.get((route, mode), {})
            n = sum(counts.values())
            cells.append(f"{counts.get('whole', 0)} of {n}")
            for ending, k in counts.items():
                if ending != "whole":
                    endings[ending] = endings.get(ending, 0) + k
        route_silent = sum(results.get((route, m), {}).get("whole", 0) for m in MODES)
        route_total = sum(sum(results.get((route, m), {}).values()) for m in MODES)
        silent, total = silent + route_silent, total + route_total
        how = ", ".join(f"{k} {v}" for k, v in sorted(endings.items()))
        print(f"| {ROUTE_NAMES[route]} | " + " | ".join(cells)
              + f" | {route_silent} of {route_total} | {how} |")
    print(f"\nsilent truncations: {silent} of {total} cut/stalled/short streams")


ACK_MARK = {"chat": b"data: [DONE]", "messages": b"event: message_stop",
            "responses": b"event: response.completed"}


def _kill_request(base: str, route: str, n: int) -> tuple[str, bool]:
    """One exchange of session kill-<route>-<n>, streamed for even n: (session, acknowledged): the
    client got a whole answer (200, and a stream's last event)."""
    session, stream = f"kill-{route}-{n}", n % 2 == 0
    headers = {"x-ctxproxy-session": session}
    if route == "messages":
        path = "/v1/messages"
        headers |= {"x-api-key": "sk-ant-kill", "anthropic-version": "2023-06-01"}
        body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": stream,
                "messages": [{"role": "user", "content": f"turn {n}"}]}
    elif route == "responses":
        path, headers = "/v1/responses", headers | {"authorization": "Bearer sk-kill"}
        body = {"model": "gpt-5", "stream": stream, "store": False, "input": f"turn {n}"}
    else:
        path, headers = "/v1/chat/completions", headers | {"authorization": "Bearer sk-kill"}
        body = {"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": f"turn {n}"}]}
    try:
        response = httpx.post(f"{base}{path}", timeout=60, json=body, headers=headers)
    except httpx.HTTPError:
        return session, False  # the proxy died under it: no answer
    return session, response.status_code == 200 and (not stream or ACK_MARK[route] in response.content)


def kill_nine(start_proxy: StartProxy, workdir: Path, upstream: str, requests: int, name: str,
              mid_load: bool) -> dict[str, tuple[int, int, int, int]]:
    """Load on all three routes from 6 threads, SIGKILL (right after the last answer, or `mid_load` when
    3/4 of the requests are answered, the rest in flight), restart (the spool replays): per route
    (acknowledged but not archived, acknowledged, sessions archived more than once, acknowledged but
    archived without a whole answer: an error, a status other than 200, an unparsed answer or no finish
    reason)."""
    proxy = start_proxy(workdir, upstream, name)
    results: list[tuple[str, str, bool]] = []
    lock = threading.Lock()
    enough = threading.Event()
    jobs = [(route, n) for n in range(requests) for route in ROUTES]

    def one(job: tuple[str, int]) -> None:
        session, acked = _kill_request(proxy.base, *job)
        with lock:
            results.append((job[0], session, acked))
            if sum(1 for r in results if r[2]) >= 3 * len(jobs) // 4:
                enough.set()

    def killer() -> None:
        enough.wait()
        proxy.stop(signal.SIGKILL)

    watch = threading.Thread(target=killer) if mid_load else None
    if watch:
        watch.start()
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(one, jobs))
    if watch:
        enough.set()
        watch.join()
    proxy.stop(signal.SIGKILL)
    restarted = start_proxy(workdir, upstream, name)  # replays its spool at start-up
    restarted.stop()
    with sqlite3.connect(proxy.extra["archive"]) as db:
        rows = db.execute("select session_id, count(*), min(status = 200 and error is null and parse_error "
                          "is null and finish_reason is not null) from exchanges group by session_id")
        rows = rows.fetchall()
    archived = {session: count for session, count, _whole in rows}
    whole = {session for session, _count, ok in rows if ok}
    out = {}
    for route in ROUTES:
        acked = [s for r, s, ok in results if r == route and ok]
        sent = {s for r, s, _ in results if r == route}
        out[route] = (sum(1 for s in acked if s not in archived), len(acked),
                      sum(1 for s in sent if archived.get(s, 0) > 1),
                      sum(1 for s in acked if s in archived and s not in whole))
    return out


def print_kill(label: str, results: dict[str, tuple[int, int, int, int]]) -> None:
    print(f"\nkill -9 {label}:\n")
    print("| route | acknowledged, not archived after restart | archived twice "
          "| archived without its answer |")
    print("|---|---|---|---|")
    for route in ROUTES:
        lost, acked, doubled, partial = results[route]
        print(f"| {ROUTE_NAMES[route].split(' (')[0]} | {lost} of {acked} | {doubled} | {partial} |")
    lost = sum(r[0] for r in results.values())
    acked = sum(r[1] for r in results.values())
    print(f"\nkill -9 {label}: {lost} of {acked} acknowledged exchanges not archived after restart")
