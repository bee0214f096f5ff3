"""The Claude Code request fixture is current, well formed, and what the Messages API would accept."""

from __future__ import annotations

import json

import anthropic
import pytest

from tests.anthropic_upstream import message_stream, text
from tests.fixtures.make_claude_code_request import OUT, build, render
from tests.servers import Step


@pytest.fixture(scope="module")
def body() -> dict:
    return json.loads(OUT.read_text())


def test_fixture_is_regenerated_identically():
    assert OUT.read_text() == render(build()), "run: python -m tests.fixtures.make_claude_code_request"


def test_roles_alternate_and_every_call_is_answered(body):
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant"] * (len(msgs) // 2) + ["user"]
    for assistant, user in zip(msgs[1::2], msgs[2::2], strict=True):
        blocks = assistant["content"]
        assert blocks[0]["type"] == "thinking" and blocks[0]["signature"]
        calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
        answers = [b["tool_use_id"] for b in user["content"] if b["type"] == "tool_result"]
        assert calls and answers == calls
        assert [b["type"] for b in user["content"]][:len(answers)] == ["tool_result"] * len(answers)


def test_shape_of_a_long_claude_code_session(body):
    results = [b for m in body["messages"][2::2] for b in m["content"]]
    assert sum(b.get("is_error", False) for b in results) == 1
    assert sum(isinstance(b["content"], list) for b in results) == 1
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    marked = [(i, j) for i, m in enumerate(body["messages"]) for j, b in enumerate(m["content"])
              if "cache_control" in b]
    last_users = [i for i, m in enumerate(body["messages"]) if m["role"] == "user"][-2:]
    assert [i for i, _ in marked] == last_users
    assert all(j == len(body["messages"][i]["content"]) - 1 for i, j in marked)
    assert len(marked) + 1 <= 4  # the API allows four cache breakpoints
    assert body["thinking"]["budget_tokens"] < body["max_tokens"] and body["stream"] is True
    assert body["metadata"]["user_id"].startswith("user_") and "_session_" in body["metadata"]["user_id"]
    assert 1_000_000 > len(OUT.read_bytes()) > 200_000


def test_sdk_sends_the_fixture_unchanged(body, upstream_server, fake_upstream):
    _, server = upstream_server
    client = anthropic.Anthropic(api_key="sk-ant-test", base_url=server.url, max_retries=0, timeout=30)
    fake_upstream.then(Step(kind="stream", chunks=message_stream([text("done")])))
    params = {k: v for k, v in body.items() if k != "stream"}
    with client.messages.stream(**params) as stream:
        assert stream.get_final_message().content[0].text == "done"
    assert fake_upstream.messages_requests[0].json() == body
