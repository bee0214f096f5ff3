"""The Anthropic-shaped fake upstream is what the official `anthropic` SDK expects (no proxy in between)."""

from __future__ import annotations

import anthropic
import orjson
import pytest

from tests.anthropic_upstream import (
    ERROR_STATUS,
    error_body,
    error_event,
    message,
    message_stream,
    redacted_thinking,
    text,
    thinking,
    tool_use,
)
from tests.servers import Step

TOOLS = [{"name": "Bash", "description": "Run a shell command.",
          "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                           "required": ["command"]}}]
USER = [{"role": "user", "content": "run the tests"}]
SIGNATURE = "EqQBCkYIBxgCKkB" + "x" * 120
BLOCKS = [
    thinking("The user wants the test suite run. I'll call Bash with pytest.", SIGNATURE),
    redacted_thinking("EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw"),
    text("Running the test suite now."),
    tool_use("toolu_01A09q90qw90lq917835lq9", "Bash",
             {"command": "pytest -x -q tests/test_app.py", "description": "Run tests", "timeout": 120000}),
]


@pytest.fixture
def client(upstream_server) -> anthropic.Anthropic:
    _, server = upstream_server
    return anthropic.Anthropic(api_key="sk-ant-test", base_url=server.url, max_retries=0, timeout=30)


def test_non_streamed_message_parses(client, fake_upstream):
    fake_upstream.then(Step(blocks=BLOCKS, headers={"x-extra": "1"}))
    msg = client.messages.create(model="claude-sonnet-4-5", max_tokens=1024, messages=USER, tools=TOOLS)
    assert [b.type for b in msg.content] == ["thinking", "redacted_thinking", "text", "tool_use"]
    assert msg.stop_reason == "tool_use"
    assert msg.content[0].signature == SIGNATURE
    assert msg.content[3].input == BLOCKS[3]["input"]
    assert msg.usage.cache_creation.ephemeral_5m_input_tokens == 0
    assert msg.usage.cache_read_input_tokens == 0
    assert msg._request_id == "req_fake"
    (seen,) = fake_upstream.messages_requests
    assert seen.method == "POST" and seen.path == "/v1/messages"
    # SDK 2.x sends the key as a Bearer token; Claude Code and older SDKs send `x-api-key`.
    assert seen.headers.get("x-api-key", seen.headers.get("authorization")) in (
        "sk-ant-test", "Bearer sk-ant-test")
    assert "anthropic-version" in seen.headers
    assert seen.json()["tools"] == TOOLS


def test_text_reply_and_echo_default(client, fake_upstream):
    fake_upstream.then(Step(content="plain answer"))
    msg = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=USER)
    assert msg.content[0].text == "plain answer" and msg.stop_reason == "end_turn"
    # Empty script: echo of the last user text, streamed when asked.
    msg = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                     {"type": "text", "text": "hello"}]}])
    assert msg.content[0].text == "echo: hello"
    with client.messages.stream(model="claude-sonnet-4-5", max_tokens=64, messages=USER) as stream:
        assert stream.get_final_message().content[0].text == "echo: run the tests"
    assert len(fake_upstream.messages_requests) == 3


def test_payload_is_sent_verbatim(client, fake_upstream):
    custom = message([text("cut")], stop_reason="max_tokens", message_id="msg_custom",
                     usage={"input_tokens": 7, "cache_read_input_tokens": 9000,
                            "cache_creation": {"ephemeral_1h_input_tokens": 3}})
    fake_upstream.then(Step(payload=custom))
    msg = client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=USER)
    assert msg.id == "msg_custom" and msg.stop_reason == "max_tokens"
    assert msg.usage.cache_read_input_tokens == 9000
    assert msg.usage.cache_creation.ephemeral_1h_input_tokens == 3
    assert msg.usage.cache_creation.ephemeral_5m_input_tokens == 0


def test_streamed_message_assembles(client, fake_upstream):
    chunks = message_stream(BLOCKS, usage={"output_tokens": 77, "cache_read_input_tokens": 4096})
    fake_upstream.then(Step(kind="stream", chunks=chunks))
    kinds = []
    with client.messages.stream(model="claude-sonnet-4-5", max_tokens=1024, messages=USER,
                                tools=TOOLS) as stream:
        for ev in stream:
            kinds.append(ev.type)
        final = stream.get_final_message()
    assert final.model_dump(exclude_none=True)["content"] == BLOCKS
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens == 77 and final.usage.cache_read_input_tokens == 4096
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"thinking", "signature", "text", "input_json"} <= set(kinds)
    assert orjson.loads(fake_upstream.messages_requests[0].body)["stream"] is True


def test_stream_wire_sequence():
    events = [c.decode() for c in message_stream([text("ab"), tool_use("toolu_1", "Bash", {"k": "v"})])]
    names = [e.split("\n", 1)[0].removeprefix("event: ") for e in events]
    assert names == ["message_start", "ping",
                     "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "ping",
                     "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert all(e.endswith("\n\n") and "\ndata: " in e for e in events)
    data = [orjson.loads(e.split("data: ", 1)[1]) for e in events]
    assert data[0]["message"]["content"] == [] and data[0]["message"]["stop_reason"] is None
    assert data[7]["content_block"] == {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}
    pieces = [d["delta"]["partial_json"] for d in data[8:11]]
    assert len([p for p in pieces if p]) >= 2 and "".join(pieces) == '{"k":"v"}'
    assert data[12]["delta"]["stop_reason"] == "tool_use" and data[12]["usage"] == {"output_tokens": 12}


def test_error_body_raises(client, fake_upstream):
    fake_upstream.then(Step(kind="error", status=ERROR_STATUS["invalid_request_error"],
                            body=error_body("invalid_request_error", "prompt is too long: 250000 tokens")))
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=USER)
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "prompt is too long" in info.value.message


def test_mid_stream_error_raises(client, fake_upstream):
    chunks = [*message_stream([text("partial answer")])[:4], error_event("overloaded_error", "Overloaded")]
    fake_upstream.then(Step(kind="stream", chunks=chunks))
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"), \
            client.messages.stream(model="claude-sonnet-4-5", max_tokens=64, messages=USER) as stream:
        stream.get_final_message()


def test_chat_route_unchanged(upstream_server, fake_upstream):
    import openai

    _, server = upstream_server
    oai = openai.OpenAI(api_key="sk", base_url=f"{server.url}/v1", max_retries=0)
    fake_upstream.then(Step(content="hi"))
    assert oai.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}]) \
        .choices[0].message.content == "hi"
    assert len(fake_upstream.chat_requests) == 1 and fake_upstream.messages_requests == []
