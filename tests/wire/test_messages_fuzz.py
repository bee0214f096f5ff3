"""Fuzz /v1/messages through the real server: structural mutations of valid Anthropic requests (a tool
loop with big results, thinking, cache_control, images) under a policy where every layer acts. Client
mistakes are Anthropic-shaped 4xx, never 5xx; a 2xx is archived; what goes upstream obeys the API's
rules whenever the client's request did."""

from __future__ import annotations

import os
from typing import Any

import httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.wire.messages_rules import problems

SMALL_POLICY = """
tool_results: {threshold_tokens: 40, keep_recent: 1}
budget: {max_input_tokens: 6000, keep_recent: 1}
window: {max_tokens: 1500, low_water_pct: 0.5}
summary: {max_tokens: 300}
folded: {enabled: true, max_episodes: 2}
"""
EXAMPLES = int(os.environ.get("CTXPROXY_FUZZ_EXAMPLES", "150"))
WORDS = st.sampled_from(["alpha", "INV-2024-000871", "src/app.py", "Error: boom", "42", "toolu_x", "é", ""])


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": draw(st.text(min_size=1, max_size=40))}]
    for turn in range(draw(st.integers(0, 6))):
        call_id = f"toolu_{turn}"
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": "hmm", "signature": f"sig{turn}"})
        blocks.append({"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": "ls"}})
        messages.append({"role": "assistant", "content": blocks})
        size = draw(st.integers(1, 400))
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id,
                                  "content": " ".join(draw(st.lists(WORDS, min_size=size, max_size=size)))}
        user: list[dict[str, Any]] = [result]
        if draw(st.booleans()):
            user.append({"type": "text", "text": "continue", "cache_control": {"type": "ephemeral"}})
        messages.append({"role": "user", "content": user})
    return {"model": "claude-sonnet-4-5", "max_tokens": 100, "system": [{"type": "text", "text": "sys"}],
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}], "messages": messages,
            "stream": draw(st.booleans())}


INT = st.integers(-(2**63), 2**63 - 1)
JUNK = st.one_of(st.none(), INT, st.text(max_size=5), st.lists(INT, max_size=2),
                 st.dictionaries(st.text(max_size=3), INT, max_size=2))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    body = draw(requests())
    for _ in range(draw(st.integers(0, 3))):
        paths = list(_paths(body))
        path = draw(st.sampled_from(paths))
        parent, key = _resolve(body, path)
        action = draw(st.sampled_from(["junk", "drop", "type"]))
        if action == "drop" and isinstance(parent, dict):
            parent.pop(key, None)
        elif action == "type" and isinstance(parent, dict):
            parent[key] = {"type": draw(st.sampled_from(["compaction", "image", "tool_result", "x"]))}
        else:
            parent[key] = draw(JUNK)
    if draw(st.integers(0, 20)) == 0:
        return orjson.dumps(body)[: draw(st.integers(0, 40))]  # cut JSON
    return orjson.dumps(body)


def _paths(node: Any, at: tuple[Any, ...] = ()) -> Any:
    if at:
        yield at
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield from _paths(value, (*at, key))


def _resolve(body: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    node = body
    for key in path[:-1]:
        node = node[key]
    return node, path[-1]


def test_messages_fuzz_never_5xx(proxy, fake_upstream):
    (proxy.policies_dir / "small.yaml").write_text(SMALL_POLICY)
    client = httpx.Client(base_url=proxy.url, timeout=60)
    counts = {"2xx": 0, "4xx": 0, "rewritten": 0}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(raw=mutated(), route=st.sampled_from(["/v1/messages", "/p/small/v1/messages"]))
    def check(raw: bytes, route: str) -> None:
        before = len(fake_upstream.messages_requests)
        response = client.post(route, content=raw,
                               headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            counts["4xx"] += 1
            payload = response.json()
            assert payload["type"] == "error" and payload["error"]["type"] and payload["error"]["message"]
            return
        counts["2xx"] += 1
        sent = fake_upstream.messages_requests[before]
        if sent.body != raw:
            counts["rewritten"] += 1
            client_body = orjson.loads(raw)
            if not problems(client_body):
                assert problems(sent.json()) == []

    check()
    proxy.flush()
    archived = next(proxy.query("select count(*) as n from exchanges where route = 'messages'"))["n"]
    assert archived >= counts["2xx"] > 0 and counts["4xx"] > 0 and counts["rewritten"] > 0, counts
