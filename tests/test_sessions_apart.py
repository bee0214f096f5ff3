"""A session's forwarded requests do not depend on what other sessions send meanwhile.

The same agent sessions go through one proxy one at a time and through another all at once (a thread
each, the official SDKs), on each route in its agent's shape; the upstream must get the same bodies from
both, turn for turn. Every session and both proxies share the process-wide memos (remembered bodies and
their parses, token counts, where the task statement ends, whether the client's tools name ours), and
three sessions share an opening (the same agent on the same task, parting after two turns), so a memo
that answered one session with another's findings would show here. A tight window makes every layer
act: summaries, placeholders, evictions with their auto-summary, working memory.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from proxy.layers.auto_summary import AGE_LABELS

SESSIONS, TURNS, SHARING, SHARED_TURNS = 4, 24, 3, 2
TIGHT = {"tool_results": {"threshold_tokens": 800, "keep_recent": 2},
         "budget": {"max_input_tokens": 8000, "keep_recent": 2}}
TOOL = {"name": "run", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}


def _agent(session: int) -> int:
    return 0 if session < SHARING else session  # the sessions that share an opening are one agent's


def task(session: int) -> str:
    return f"Fix the failing checkout test in repository shop-{_agent(session)}; report the cause."


def command(session: int, turn: int) -> str:
    owner = _agent(session) if turn < SHARED_TURNS else session
    return f"grep -rn order /srv/shop-{owner}/step-{turn}"


def output(session: int, turn: int) -> str:
    """In turn: a ~9 KB log with ids, paths and an error (summarized), an order record (an entity for
    working memory), ~1 KB of matches."""
    owner = _agent(session) if turn < SHARED_TURNS else session
    if turn % 3 == 1:
        return json.dumps({"order": {"id": f"ORD-{owner}-{turn}", "status": "failed", "total": turn * 3,
                                     "customer": f"cust-{owner}"}})
    if turn % 3:
        return "\n".join(f"/srv/shop-{owner}/app/orders_{k}.py:{turn * 10 + k}: total = order.amount * rate"
                         for k in range(16))
    lines = [f"2026-12-07 10:{turn:02d}:{k:02d} INFO worker-{owner} processed ORD-{owner}{turn}{k:03d} "
             f"from /srv/shop-{owner}/app/module_{k}.py in {k * 7 % 90} ms" for k in range(90)]
    lines.insert(45, f"2026-12-07 10:{turn:02d}:45 ERROR checkout failed for ORD-{owner}{turn}045: "
                     "KeyError 'currency'")
    return "\n".join(lines)


def thought(session: int, turn: int) -> str:
    return (f"Step {turn} of session {session}: the checkout total is computed in orders.py before the "
            "currency is set, so the last run's KeyError is likely that path. ") * 4


def call_id(session: int, turn: int) -> str:
    return f"call_{_agent(session) if turn < SHARED_TURNS else session}_{turn}"


def chat_requests(session: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."},
                                     {"role": "user", "content": task(session)}]
    requests = []
    for turn in range(TURNS):
        requests.append({"messages": copy.deepcopy(history)})
        history.append({"role": "assistant", "content": thought(session, turn), "tool_calls": [{
            "id": call_id(session, turn), "type": "function",
            "function": {"name": "run", "arguments": json.dumps({"command": command(session, turn)})}}]})
        history.append({"role": "tool", "tool_call_id": call_id(session, turn),
                        "content": output(session, turn)})
    return requests


def messages_requests(session: int) -> list[dict[str, Any]]:
    """Claude Code's shape: content blocks, and the cache marker on the newest block, moving every turn."""
    history: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": task(session)}]}]
    requests = []
    for turn in range(TURNS):
        sent = copy.deepcopy(history)
        sent[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        requests.append({"messages": sent})
        history.append({"role": "assistant", "content": [{"type": "text", "text": thought(session, turn)},
                                                         {"type": "tool_use", "id": call_id(session, turn),
                                                          "name": "run",
                                                          "input": {"command": command(session, turn)}}]})
        history.append({"role": "user", "content": [{"type": "tool_result",
                                                     "tool_use_id": call_id(session, turn),
                                                     "content": output(session, turn)}]})
    return requests


def responses_requests(session: int) -> list[dict[str, Any]]:
    """Codex's shape: `store: false`, the whole history as input items every turn."""
    history: list[dict[str, Any]] = [{"type": "message", "role": "user",
                                      "content": [{"type": "input_text", "text": task(session)}]}]
    requests = []
    for turn in range(TURNS):
        requests.append({"input": copy.deepcopy(history)})
        history.append({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": thought(session, turn)}]})
        history.append({"type": "function_call", "call_id": call_id(session, turn), "name": "run",
                        "arguments": json.dumps({"command": command(session, turn)})})
        history.append({"type": "function_call_output", "call_id": call_id(session, turn),
                        "output": output(session, turn)})
    return requests


def senders(proxy, run: str) -> dict[str, Callable[[int, dict[str, Any]], None]]:
    """route -> send(session, request) through that route's official SDK."""
    def headers(session: int) -> dict[str, str]:
        return {"x-ctxproxy-session": f"agent-{session}", "x-test-run": run, "x-test-session": str(session)}

    chat = proxy.client(base_url=f"{proxy.url}/p/tight/v1")
    claude = proxy.anthropic(policy="tight")
    return {
        "chat": lambda s, r: chat.chat.completions.create(
            model="gpt-4o", messages=r["messages"], tools=[{"type": "function", "function": TOOL}],
            extra_headers=headers(s)),
        "messages": lambda s, r: claude.messages.create(
            model="claude-sonnet-4-5", max_tokens=1024, system="You are a careful coding agent.",
            tools=[{"name": TOOL["name"], "description": TOOL["description"],
                    "input_schema": TOOL["parameters"]}],
            messages=r["messages"], extra_headers=headers(s)),
        "responses": lambda s, r: chat.responses.create(
            model="gpt-4o", instructions="You are a careful coding agent.", input=r["input"], store=False,
            tools=[{"type": "function", **TOOL}], extra_headers=headers(s)),
    }


BUILDERS = {"chat": chat_requests, "messages": messages_requests, "responses": responses_requests}
# The auto-summary dates each exchange that left (`Mon 02:36`, under a day's heading): the wall clock's,
# which may turn a minute (or a day) between the two runs.
WALL_CLOCK = re.compile(rb"\((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d\d:\d\d, |## (?:"
                        + "|".join(AGE_LABELS).encode() + rb")")


def undated(body: bytes) -> bytes:
    return WALL_CLOCK.sub(b"<time>", body)


@pytest.mark.parametrize("route", sorted(BUILDERS))
def test_each_session_is_forwarded_the_same_alone_or_among_others(make_proxy, fake_upstream, tmp_path, route):
    sessions = [BUILDERS[route](session) for session in range(SESSIONS)]
    (tmp_path / "policies").mkdir(exist_ok=True)
    (tmp_path / "policies" / "tight.yaml").write_text(yaml.safe_dump(TIGHT))
    alone, among = make_proxy({"data_dir": "alone"}), make_proxy({"data_dir": "among"})

    send = senders(alone, "alone")[route]
    for session, requests in enumerate(sessions):
        for request in requests:
            send(session, request)

    send = senders(among, "among")[route]
    start = threading.Barrier(SESSIONS)

    def one_session(session: int) -> None:
        start.wait(timeout=30)
        for request in sessions[session]:
            send(session, request)

    with ThreadPoolExecutor(SESSIONS) as pool:
        list(pool.map(one_session, range(SESSIONS)))

    seen = [s for s in fake_upstream.seen if s.headers.get("x-test-run")]
    bodies: dict[tuple[str, int], list[bytes]] = {}
    for request in seen:
        bodies.setdefault((request.headers["x-test-run"], int(request.headers["x-test-session"])), []) \
            .append(undated(request.body))
    for session in range(SESSIONS):
        assert len(bodies[("alone", session)]) == TURNS
        assert bodies[("among", session)] == bodies[("alone", session)], f"session {session}"

    # Not vacuous: the sessions were interleaved, and every layer rewrote something.
    order = [int(s.headers["x-test-session"]) for s in seen if s.headers["x-test-run"] == "among"]
    assert sum(a != b for a, b in itertools.pairwise(order)) > SESSIONS
    forwarded = b"".join(b for (run, _), sent in bodies.items() if run == "alone" for b in sent)
    for mark in (b"[ctxproxy summary of tool result", b"[summarized: call_id=", b"ctxproxy auto-summary",
                 b"[WORKING MEMORY]"):
        assert mark in forwarded, mark
