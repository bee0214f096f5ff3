"""The request shape Codex sends (tests/fixtures/codex_request.json: instructions, shell / apply_patch /
web_search tools, reasoning with encrypted content, a stateless 23-turn tool loop with large outputs)
through the real server: the layers act, reasoning and instructions stay byte for byte, every call keeps
its output and every reasoning item the item it led to, replacements are sticky, an evicted output reads
back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson

from proxy.wire.responses import is_model_item
from tests.responses_upstream import function_call, message_item
from tests.servers import Seen, Step

FIXTURE = Path(__file__).parent.parent / "fixtures" / "codex_request.json"
HEADERS = {"authorization": "Bearer sk-codex", "session_id": "codex-session-1", "originator": "codex_cli_rs"}


def violations(body: dict[str, Any]) -> list[str]:
    """What the Responses API rejects in a stateless input."""
    items, found = body["input"], []
    calls = {i["call_id"] for i in items if i.get("type") in ("function_call", "custom_tool_call")}
    outputs = {i["call_id"] for i in items
               if i.get("type") in ("function_call_output", "custom_tool_call_output")}
    if calls != outputs:
        found.append(f"calls without outputs {calls - outputs}, outputs without calls {outputs - calls}")
    for index, item in enumerate(items):
        following = items[index + 1] if index + 1 < len(items) else None
        if item.get("type") == "reasoning" and (following is None or not is_model_item(following)):
            found.append(f"input[{index}]: reasoning without the item it led to")
    return found


def coding_proxy(make_proxy, window: int):
    proxy = make_proxy()
    (proxy.policies_dir / "coding.yaml").write_text(f"window: {{max_tokens: {window}}}\n")
    return proxy


def post(proxy, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{proxy.url}/p/coding/v1/responses", content=orjson.dumps(body), headers=HEADERS,
                      timeout=60)


def test_layers_act_on_codexs_request_and_keep_what_must_stay(make_proxy, fake_upstream):
    proxy = coding_proxy(make_proxy, 16000)
    source = orjson.loads(FIXTURE.read_bytes())
    fake_upstream.then(Step(kind="stream", items=[message_item("Fixed.")]))
    with httpx.stream("POST", f"{proxy.url}/p/coding/v1/responses", content=orjson.dumps(source),
                      headers=HEADERS, timeout=60) as response:
        response.read()
    assert response.status_code == 200 and b"response.completed" in response.content
    assert response.headers["x-ctxproxy-session"] == source["prompt_cache_key"]
    before, after = (int(response.headers[f"x-ctxproxy-tokens-{k}"]) for k in ("before", "after"))
    assert after < before / 2
    forwarded = fake_upstream.responses_requests[0].json()
    assert violations(forwarded) == []
    for key in ("instructions", "include", "prompt_cache_key", "reasoning", "store", "parallel_tool_calls"):
        assert forwarded[key] == source[key]
    assert forwarded["tools"][:5] == source["tools"]
    assert [t["name"] for t in forwarded["tools"][5:]] == ["read_tool_result", "recall"]
    kept = [i for i in forwarded["input"] if i.get("type") != "function_call_output"]
    originals = [i for i in source["input"] if i.get("type") != "function_call_output"]
    model_items = [i for i in originals if is_model_item(i)]
    assert all(i in model_items for i in kept if is_model_item(i))  # reasoning, calls: never edited
    assert forwarded["input"][-3:] == source["input"][-3:]  # the newest exchange untouched
    replaced = [i for i in forwarded["input"] if i.get("type") == "function_call_output"
                and "read_tool_result" in i["output"]]
    assert len(replaced) >= 4 and all(i["call_id"] in i["output"] for i in replaced)


def test_replacements_are_sticky_from_one_turn_to_the_next(make_proxy, fake_upstream):
    proxy = coding_proxy(make_proxy, 16000)
    first = orjson.loads(FIXTURE.read_bytes())
    first["stream"] = False
    fake_upstream.then(Step(content="Running it."), Step(content="Done."))
    post(proxy, first)
    second = dict(first, input=[*first["input"], message_item("Running it."),
                                {"type": "message", "role": "user", "content": "now commit"}])
    post(proxy, second)
    one, two = (s.json()["input"] for s in fake_upstream.responses_requests)
    assert orjson.dumps(two[:len(one)]) == orjson.dumps(one)  # the cached prefix, byte for byte


def test_an_evicted_output_reads_back(make_proxy, fake_upstream):
    proxy = coding_proxy(make_proxy, 9000)
    body = orjson.loads(FIXTURE.read_bytes())
    body["stream"] = False
    target = max((i for i in body["input"][:30] if i.get("type") == "function_call_output"),
                 key=lambda i: len(i["output"]))

    def second(seen: Seen) -> Step:
        page = seen.json()["input"][-1]["output"]
        header, _, lines = page.partition("\n")
        assert f"call_id={target['call_id']}" in header and target["output"].startswith(lines)
        return Step(content="It was the leap day.")

    fake_upstream.then(Step(items=[function_call("call_rb", "read_tool_result",
                                                 orjson.dumps({"call_id": target["call_id"]}).decode())]),
                       second)
    response = post(proxy, body)
    assert response.status_code == 200 and response.json()["output"][-1]["content"][0]["text"] == \
        "It was the leap day."
    forwarded = fake_upstream.responses_requests[0].json()
    assert violations(forwarded) == [] and target["call_id"] not in orjson.dumps(
        [i for i in forwarded["input"] if i.get("type") != "message"]).decode()
