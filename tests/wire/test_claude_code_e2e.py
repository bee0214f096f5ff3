"""The request shape Claude Code sends (tests/fixtures/claude_code_request.json: system blocks with
cache_control, 16 tools, thinking with signatures, a 25-turn tool loop with large results) through the
real server: the layers act, the breakpoints and the thinking stay, replacements are sticky across
turns, an evicted result reads back byte for byte, a removed breakpoint is re-anchored."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson

from proxy.wire.messages_rules import problems
from tests.anthropic_upstream import message_stream, text, tool_result, tool_use
from tests.servers import Seen, Step

FIXTURE = Path(__file__).parent.parent / "fixtures" / "claude_code_request.json"
HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01",
           "anthropic-beta": "interleaved-thinking-2025-05-14", "x-claude-code-session-id": "cc-session-1"}


def coding_proxy(make_proxy, window: int):
    proxy = make_proxy()
    (proxy.policies_dir / "coding.yaml").write_text(f"window: {{max_tokens: {window}}}\n")
    return proxy


def send(proxy, body: dict) -> httpx.Response:
    with httpx.stream("POST", f"{proxy.url}/p/coding/v1/messages?beta=true", content=orjson.dumps(body),
                      headers=HEADERS, timeout=60) as response:
        response.read()
    return response


def breakpoints(body: dict) -> list[tuple[str, int]]:
    found = [("system", i) for i, b in enumerate(body["system"]) if b.get("cache_control")]
    for k, message in enumerate(body["messages"]):
        content = message["content"]
        found += [(f"messages.{k}", i) for i, b in enumerate(content if isinstance(content, list) else [])
                  if b.get("cache_control")]
    return found


def test_layers_act_on_claude_codes_request_and_keep_what_must_stay(make_proxy, fake_upstream):
    proxy = coding_proxy(make_proxy, 24000)
    source = orjson.loads(FIXTURE.read_bytes())
    fake_upstream.then(Step(kind="stream", chunks=message_stream([text("Fixed.")])))
    response = send(proxy, source)
    assert response.status_code == 200 and b"event: message_stop" in response.content
    assert response.headers["x-ctxproxy-session"] == source["metadata"]["user_id"].rsplit("_", 1)[-1]
    before, after = (int(response.headers[f"x-ctxproxy-tokens-{k}"]) for k in ("before", "after"))
    assert after < before / 3
    sent = fake_upstream.messages_requests[0]
    assert sent.path == "/v1/messages?beta=true"
    assert sent.headers["anthropic-beta"] == HEADERS["anthropic-beta"]
    forwarded = sent.json()
    assert problems(forwarded) == []
    assert forwarded["system"] == source["system"] and forwarded["thinking"] == source["thinking"]
    assert forwarded["metadata"] == source["metadata"] and forwarded["max_tokens"] == source["max_tokens"]
    assert forwarded["tools"][:16] == source["tools"]
    assert [t["name"] for t in forwarded["tools"][16:]] == ["read_tool_result", "recall"]
    assert breakpoints(forwarded) == breakpoints(source)  # the same three, at the same places
    assert forwarded["messages"][-2:] == source["messages"][-2:]  # the latest turns untouched
    for sent_message, client_message in zip(forwarded["messages"], source["messages"], strict=True):
        if sent_message["role"] == "assistant":  # thinking, signatures, tool_use: never edited
            assert sent_message == client_message
    replaced = [b for m in forwarded["messages"] for b in m["content"] if isinstance(m["content"], list)
                and b.get("type") == "tool_result" and isinstance(b.get("content"), str)
                and "read_tool_result" in b["content"]]
    assert len(replaced) >= 5 and all(b["tool_use_id"] in b["content"] for b in replaced)


def test_replacements_are_sticky_from_one_turn_to_the_next(make_proxy, fake_upstream):
    proxy = coding_proxy(make_proxy, 24000)
    first = orjson.loads(FIXTURE.read_bytes())
    fake_upstream.then(Step(kind="stream", chunks=message_stream([text("Running it.")])),
                       Step(kind="stream", chunks=message_stream([text("Done.")])))
    send(proxy, first)
    second = dict(first, messages=[*first["messages"],
                                   {"role": "assistant", "content": [text("Running it.")]},
                                   {"role": "user", "content": "thanks, now commit"}])
    send(proxy, second)
    one, two = (s.json()["messages"] for s in fake_upstream.messages_requests)
    # The prefix the provider cached stays byte-identical (the newest turns carry their own breakpoints).
    assert orjson.dumps(two[:len(one) - 2]) == orjson.dumps(one[:-2])


def test_evicted_result_reads_back_and_its_breakpoint_is_reanchored(make_proxy, fake_upstream):
    proxy = coding_proxy(make_proxy, 9000)
    body = orjson.loads(FIXTURE.read_bytes())
    evicted_id = body["messages"][4]["content"][0]["tool_use_id"]
    original = body["messages"][4]["content"][0]["content"]
    body["messages"][4]["content"][0]["cache_control"] = {"type": "ephemeral"}  # an old breakpoint
    body["stream"] = False

    def second(seen: Seen) -> Step:
        page = seen.json()["messages"][-1]["content"][0]["content"]
        header, _, lines = page.partition("\n")  # a long result comes back in pages of whole lines
        assert header.startswith("[lines 1-") and f"call_id={evicted_id}" in header
        assert original.startswith(lines) and len(lines) > 2000  # byte for byte
        return Step(blocks=[text("It was the leap day.")])

    fake_upstream.then(Step(blocks=[tool_use("toolu_int", "read_tool_result", {"call_id": evicted_id})]),
                       second)
    response = httpx.post(f"{proxy.url}/p/coding/v1/messages", content=orjson.dumps(body), headers=HEADERS,
                          timeout=60)
    assert response.status_code == 200
    assert [b["type"] for b in response.json()["content"]] == ["text"]
    forwarded = fake_upstream.messages_requests[0].json()
    assert problems(forwarded) == []
    assert all(evicted_id not in orjson.dumps(m).decode() for m in forwarded["messages"])
    marks = breakpoints(forwarded)
    assert len(marks) == 4 and ("messages.0", len(forwarded["messages"][0]["content"]) - 1) in marks
    assert forwarded["messages"][0]["content"][-1]["text"].startswith("<system-reminder>")


def test_compaction_block_leaves_what_precedes_it_to_the_provider(make_proxy, fake_upstream):
    proxy = coding_proxy(make_proxy, 9000)
    body = orjson.loads(FIXTURE.read_bytes())
    body["messages"][9]["content"].insert(0, {"type": "compaction", "content": "Earlier: the job crashed."})
    body["stream"] = False
    fake_upstream.then(Step(blocks=[text("ok")]))
    assert httpx.post(f"{proxy.url}/p/coding/v1/messages", content=orjson.dumps(body), headers=HEADERS,
                      timeout=60).status_code == 200
    forwarded = fake_upstream.messages_requests[0].json()["messages"]
    assert forwarded[:9] == body["messages"][:9]  # the compacted span, as sent
    assert forwarded[9]["content"][0] == body["messages"][9]["content"][0]  # and its summary, kept
    assert len(orjson.dumps(forwarded)) < len(orjson.dumps(body["messages"])) / 2  # ours acts after it


def test_native_context_management_is_the_providers_unless_the_policy_takes_it(make_proxy, fake_upstream):
    proxy = coding_proxy(make_proxy, 9000)
    body = orjson.loads(FIXTURE.read_bytes())
    body.update(stream=False, context_management={"edits": [{"type": "clear_tool_uses_20250919"}]})
    raw = orjson.dumps(body)
    fake_upstream.then(Step(blocks=[text("ok")]), Step(blocks=[text("ok")]))
    httpx.post(f"{proxy.url}/p/coding/v1/messages", content=raw, headers=HEADERS, timeout=60)
    assert fake_upstream.messages_requests[0].body == raw  # the provider manages it: untouched
    (proxy.policies_dir / "ours.yaml").write_text("window: {max_tokens: 9000, native: proxy}\n")
    httpx.post(f"{proxy.url}/p/ours/v1/messages", content=raw, headers=HEADERS, timeout=60)
    taken = fake_upstream.messages_requests[1].json()
    assert "context_management" not in taken and len(taken["messages"]) < len(body["messages"])


def test_tool_result_with_images_and_text_is_left_whole(make_proxy, fake_upstream):
    proxy = coding_proxy(make_proxy, 9000)
    body = orjson.loads(FIXTURE.read_bytes())
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    body["messages"][-1]["content"] = [tool_result(body["messages"][-1]["content"][0]["tool_use_id"],
                                                   [text("screenshot:"), image])]
    body["stream"] = False
    fake_upstream.then(Step(blocks=[text("ok")]))
    httpx.post(f"{proxy.url}/p/coding/v1/messages", content=orjson.dumps(body), headers=HEADERS, timeout=60)
    assert fake_upstream.messages_requests[0].json()["messages"][-1] == body["messages"][-1]
