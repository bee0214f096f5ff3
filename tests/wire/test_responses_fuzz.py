"""Fuzz /v1/responses through the real server: structural mutations of valid stateless Responses requests
(message items, reasoning with encrypted_content, function_call / custom_tool_call and their outputs of
random sizes, sometimes a compaction item) under a policy where every layer acts. Client mistakes are
OpenAI-shaped 4xx, never 5xx; a 2xx is archived; what goes upstream obeys the API's rules (every call
answered, every output called, no reasoning without the item it led to) whenever the client's did."""

from __future__ import annotations

import os
from typing import Any

import httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SMALL_POLICY = """
tool_results: {threshold_tokens: 40, keep_recent: 1}
budget: {max_input_tokens: 6000, keep_recent: 1}
window: {max_tokens: 1500, low_water_pct: 0.5}
summary: {max_tokens: 300}
folded: {enabled: true, max_episodes: 2}
"""
EXAMPLES = int(os.environ.get("CTXPROXY_FUZZ_EXAMPLES", "150"))
WORDS = st.sampled_from(["alpha", "INV-2024-000871", "src/app.py", "Error: boom", "42", "call_x", "é", ""])
CALLS = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
OUTPUTS = {output: call for call, output in CALLS.items()}


def _message(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    items: list[dict[str, Any]] = [_message("user", draw(st.text(min_size=1, max_size=40)))]
    for turn in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 8)) == 0:
            items.append({"type": "compaction", "id": f"cmp_{turn}", "encrypted_content": f"COMPACTED{turn}"})
        call_id = f"call_{turn}"
        if draw(st.booleans()):
            items.append({"type": "reasoning", "id": f"rs_{turn}", "encrypted_content": f"ENC{turn}",
                          "summary": [{"type": "summary_text", "text": "thinking"}] if draw(st.booleans())
                          else []})
        if draw(st.integers(0, 3)) == 0:
            items.append(_message("assistant", "let me look"))
        size = draw(st.integers(1, 400))
        output = " ".join(draw(st.lists(WORDS, min_size=size, max_size=size)))
        if draw(st.booleans()):
            items.append({"type": "function_call", "id": f"fc_{turn}", "call_id": call_id, "name": "shell",
                          "arguments": '{"cmd":"ls"}'})
            items.append({"type": "function_call_output", "call_id": call_id, "output": output})
        else:
            items.append({"type": "custom_tool_call", "id": f"ctc_{turn}", "call_id": call_id,
                          "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"})
            items.append({"type": "custom_tool_call_output", "call_id": call_id, "output": output})
        if draw(st.integers(0, 3)) == 0:
            items.append(_message("user", "continue"))
    body: dict[str, Any] = {"model": "gpt-5", "instructions": "sys", "input": items,
                            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
                                      {"type": "custom", "name": "apply_patch"}],
                            "store": False, "include": ["reasoning.encrypted_content"],
                            "stream": draw(st.booleans())}
    if draw(st.booleans()):
        body["prompt_cache_key"] = "conv-1"
    return body


INT = st.integers(-(2**63), 2**63 - 1)
JUNK = st.one_of(st.none(), INT, st.text(max_size=5), st.lists(INT, max_size=2),
                 st.dictionaries(st.text(max_size=3), INT, max_size=2))
TYPES = ["compaction", "reasoning", "function_call", "function_call_output", "custom_tool_call_output",
         "message", "item_reference", "x"]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    body = draw(requests())
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):  # uniform: integers() favours extremes
        paths = list(_paths(body))
        path = draw(st.sampled_from(paths))
        parent, key = _resolve(body, path)
        action = draw(st.sampled_from(["junk", "drop", "type", "remove", "move"]))
        if action == "drop" and isinstance(parent, dict):
            parent.pop(key, None)
        elif action == "remove" and isinstance(parent, list):
            del parent[key]  # an item gone: may orphan a call, its output or a reasoning item
        elif action == "move" and isinstance(parent, list):
            parent.insert(draw(st.integers(0, len(parent) - 1)), parent.pop(key))  # an output before its call
        elif action == "type" and isinstance(parent, (dict, list)):
            parent[key] = {"type": draw(st.sampled_from(TYPES))}
        else:
            parent[key] = draw(JUNK)
    if draw(st.sampled_from(range(20))) == 0:
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


def _is_model_item(item: dict[str, Any]) -> bool:
    kind = item.get("type") or "message"
    if kind == "message":
        return item.get("role") == "assistant"
    return kind == "reasoning" or (kind.endswith("_call") and not kind.endswith("_output"))


def problems(body: Any) -> list[str]:
    """The rules the Responses API enforces on a stateless `input`, each broken one named with where:
    every call answered by a later output of its kind, every output answering an earlier call, a reasoning
    item followed by the model item it led to, call ids unique. A body not shaped for the rules (a client
    mistake the proxy answers with a 400) is a problem too."""
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return ["input is not a list of items"]
    items = body["input"]
    if not all(isinstance(item, dict) for item in items):
        return ["an item is not an object"]
    found: list[str] = []
    open_calls: dict[str, str] = {}
    answered: set[str] = set()
    for k, item in enumerate(items):
        kind = item.get("type") or "message"
        call_id = item.get("call_id")
        if kind in CALLS:
            if not isinstance(call_id, str) or call_id in open_calls or call_id in answered:
                found.append(f"input[{k}]: {kind} with call_id {call_id!r} (missing or repeated)")
            else:
                open_calls[call_id] = kind
        elif kind in OUTPUTS:
            if open_calls.get(call_id) != OUTPUTS[kind]:
                found.append(f"input[{k}]: {kind} {call_id!r} answers no earlier {OUTPUTS[kind]}")
            else:
                del open_calls[call_id]
                answered.add(call_id)
        elif kind == "reasoning":
            following = items[k + 1] if k + 1 < len(items) else None
            if following is None or not _is_model_item(following):
                found.append(f"input[{k}]: reasoning without a following model item")
    found += [f"{kind} {call_id!r} has no output" for call_id, kind in open_calls.items()]
    return found


def test_problems_sees_the_rules() -> None:
    call = {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c", "output": "x"}
    reasoning = {"type": "reasoning", "encrypted_content": "E", "summary": []}
    assert problems({"input": [reasoning, call, output]}) == []
    assert problems({"input": [call]}) and problems({"input": [output]})
    assert problems({"input": [output, call]})
    assert problems({"input": [reasoning, output]}) and problems({"input": [call, output, reasoning]})
    assert problems({"input": [{**call, "type": "custom_tool_call"}, output]})


def test_a_text_part_that_is_not_a_string_is_a_400(proxy, fake_upstream):
    body = {"model": "gpt-5", "input": [{"type": "message", "role": "user",
                                         "content": [{"type": "input_text", "text": None}]}]}
    response = httpx.post(f"{proxy.url}/v1/responses", json=body, headers={"authorization": "Bearer k"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith("input[0].content[0]")


def test_responses_fuzz_never_5xx(proxy, fake_upstream):
    (proxy.policies_dir / "small.yaml").write_text(SMALL_POLICY)
    client = httpx.Client(base_url=proxy.url, timeout=60)
    counts = {"2xx": 0, "4xx": 0, "rewritten": 0, "checked": 0}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(raw=mutated(), route=st.sampled_from(["/v1/responses", "/p/small/v1/responses"]))
    def check(raw: bytes, route: str) -> None:
        before = len(fake_upstream.responses_requests)
        response = client.post(route, content=raw, headers={"authorization": "Bearer sk-fuzz",
                                                            "content-type": "application/json"})
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            counts["4xx"] += 1
            error = response.json()["error"]
            assert isinstance(error["message"], str) and error["message"] and error["type"], error
            return
        counts["2xx"] += 1
        sent = fake_upstream.responses_requests[before]
        if sent.body != raw:
            counts["rewritten"] += 1
            if not problems(orjson.loads(raw)):
                counts["checked"] += 1
                assert problems(sent.json()) == [], sent.body[:2000]

    check()
    print(counts)
    proxy.flush()
    archived = next(proxy.query("select count(*) as n from exchanges where route = 'responses'"))["n"]
    assert archived >= counts["2xx"] > 0 and counts["4xx"] > 0 and counts["checked"] > 0, counts
