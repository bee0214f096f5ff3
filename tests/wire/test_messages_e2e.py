"""The Anthropic Messages API through the real server with the official `anthropic` SDK: plain and
streamed answers, a client tool loop forwarded byte for byte, a summarized result read back by the
model (the client never sees the internal tool_use), mixed internal and client calls, refusals and
errors in Anthropic's shape, the archive."""

from __future__ import annotations

import anthropic
import httpx
import orjson
import pytest

from tests.anthropic_upstream import error_body, message_stream, text, thinking, tool_result, tool_use
from tests.servers import CLOSE, Seen, Step

MODEL = "claude-sonnet-4-5"
BIG = "\n".join(f"line {i}: value={i * 7} path=src/mod_{i % 13}.py" for i in range(500))
TOOLS = [{"name": "read_file", "description": "Read a file", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}}}]
SYSTEM = [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}]


def history(result: str = BIG) -> list[dict]:
    return [
        {"role": "user", "content": "Summarize big.log"},
        {"role": "assistant", "content": [thinking("I should read it.", "sig-1"), text("Reading."),
                                          tool_use("toolu_read", "read_file", {"path": "big.log"})]},
        {"role": "user", "content": [tool_result("toolu_read", result), {
            "type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}}]},
    ]


def internal(name: str = "read_tool_result", **arguments) -> dict:
    return tool_use("toolu_internal", name, arguments or {"call_id": "toolu_read"})


def exchanges(proxy) -> list[dict]:
    proxy.flush()
    return list(proxy.query("select * from exchanges order by rowid"))


def test_plain_answer_headers_and_archive(proxy, fake_upstream):
    fake_upstream.then(Step(blocks=[text("hello")]))
    raw = proxy.anthropic().messages.with_raw_response.create(
        model=MODEL, max_tokens=100, system="Be brief.", messages=[{"role": "user", "content": "hi"}],
        metadata={"user_id": "user_abc_account_1_session_0123abcd-0000-4000-8000-000000000001"})
    assert raw.parse().content[0].text == "hello"
    assert raw.headers["x-ctxproxy-gate"] == "pass" and raw.headers["x-ctxproxy-policy"] == "default"
    assert raw.headers["x-ctxproxy-session"] == "0123abcd-0000-4000-8000-000000000001"
    seen = fake_upstream.messages_requests[0]
    assert seen.headers["anthropic-version"] and seen.path == "/v1/messages"
    [row] = exchanges(proxy)
    assert row["route"] == "messages" and row["status"] == 200 and row["session_source"] == "metadata"
    assert row["prompt_tokens"] == 25 and row["completion_tokens"] == 12 and row["cache_write_tokens"] == 0
    assert orjson.loads(row["usage"])["cache_creation"]["ephemeral_1h_input_tokens"] == 0


def test_unchanged_request_goes_upstream_byte_for_byte(proxy, fake_upstream):
    body = orjson.dumps({"model": MODEL, "max_tokens": 50, "system": SYSTEM, "tools": TOOLS,
                         "thinking": {"type": "enabled", "budget_tokens": 1024},
                         "messages": history("small result"), "x-unknown": {"kept": [1, 2]}})
    fake_upstream.then(Step(blocks=[text("done")]))
    response = httpx.post(f"{proxy.url}/v1/messages", content=body,
                          headers={"x-api-key": "k", "anthropic-version": "2023-06-01",
                                   "anthropic-beta": "interleaved-thinking-2025-05-14"})
    assert response.status_code == 200
    seen = fake_upstream.messages_requests[0]
    assert seen.body == body
    assert seen.headers["x-api-key"] == "k"
    assert seen.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


def second_round(seen: Seen) -> Step:
    body = seen.json()
    answer = body["messages"][-1]
    assert answer["role"] == "user" and answer["content"][0]["tool_use_id"] == "toolu_internal"
    assert answer["content"][0]["content"] == BIG  # the original, byte for byte
    assert body["messages"][-2]["content"][0] == thinking("Let me read the original.", "sig-2")
    return Step(blocks=[text("The log has 500 lines.")])


def test_summarized_result_is_read_back_and_the_client_never_sees_the_call(proxy, fake_upstream):
    fake_upstream.then(Step(blocks=[thinking("Let me read the original.", "sig-2"), internal()]),
                       second_round)
    raw = proxy.anthropic().messages.with_raw_response.create(
        model=MODEL, max_tokens=100, system=SYSTEM, tools=TOOLS, messages=history())
    result = raw.parse()
    assert [b.type for b in result.content] == ["thinking", "text"]
    assert result.content[1].text == "The log has 500 lines." and result.stop_reason == "end_turn"
    assert result.usage.input_tokens == 50  # both rounds
    first = fake_upstream.messages_requests[0].json()
    replaced = first["messages"][2]["content"][0]
    assert replaced["tool_use_id"] == "toolu_read" and "toolu_read" in replaced["content"]
    assert "read_tool_result" in replaced["content"] and len(replaced["content"]) < len(BIG) / 5
    assert first["messages"][2]["content"][1]["cache_control"] == {"type": "ephemeral"}
    assert first["messages"][1] == history()[1]  # the assistant turn (thinking, signature) untouched
    assert first["system"] == SYSTEM
    assert [t["name"] for t in first["tools"]] == ["read_file", "read_tool_result", "recall"]
    assert first["tools"][1]["input_schema"]["required"] == ["call_id"]
    assert int(raw.headers["x-ctxproxy-tokens-after"]) < int(raw.headers["x-ctxproxy-tokens-before"]) / 3
    assert [r["status"] for r in exchanges(proxy)] == [200, 200]


def test_streamed_rounds_are_one_message(proxy, fake_upstream):
    fake_upstream.then(
        Step(kind="stream", chunks=message_stream([text("Let me look. "), internal()], message_id="msg_A")),
        lambda seen: (second_round_stream(seen), Step(kind="stream", chunks=message_stream(
            [text("It has 500 lines.")], message_id="msg_B")))[1])
    client = proxy.anthropic()
    with client.messages.stream(model=MODEL, max_tokens=100, system=SYSTEM, tools=TOOLS,
                                messages=history()) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.id == "msg_A" and [b.type for b in final.content] == ["text", "text"]
    assert "".join(b.text for b in final.content) == "Let me look. It has 500 lines."
    assert final.stop_reason == "end_turn"
    assert [e.type for e in events].count("message_start") == 1
    assert not any(getattr(e, "content_block", None) is not None and e.content_block.type == "tool_use"
                   for e in events)
    assert [r["status"] for r in exchanges(proxy)] == [200, 200]


def second_round_stream(seen: Seen) -> None:
    body = seen.json()
    assert body["messages"][-1]["content"][0]["content"] == BIG
    assert body["messages"][-2]["content"][1]["name"] == "read_tool_result"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_mixed_internal_and_client_calls(proxy, fake_upstream, stream):
    blocks = [text("Both."), internal(), tool_use("toolu_client", "read_file", {"path": "b.txt"})]
    fake_upstream.then(Step(kind="stream", chunks=message_stream(blocks)) if stream else Step(blocks=blocks))
    client = proxy.anthropic()
    kwargs = {"model": MODEL, "max_tokens": 100, "system": SYSTEM, "tools": TOOLS, "messages": history()}
    if stream:
        with client.messages.stream(**kwargs) as events:
            result = events.get_final_message()
    else:
        result = client.messages.create(**kwargs)
    assert [b.type for b in result.content] == ["text", "tool_use"]
    assert result.content[1].id == "toolu_client" and result.stop_reason == "tool_use"
    # The client answers its call; the next request gets our call and its answer back in place.
    fake_upstream.then(Step(blocks=[text("ok")]))
    follow = [*history(), {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                            for b in result.content]},
              {"role": "user", "content": [tool_result("toolu_client", "B contents")]}]
    client.messages.create(**(kwargs | {"messages": follow}))
    sent = fake_upstream.messages_requests[-1].json()["messages"]
    assert [b.get("id") for b in sent[3]["content"] if b["type"] == "tool_use"] == \
        ["toolu_internal", "toolu_client"]
    assert [b["tool_use_id"] for b in sent[4]["content"]] == ["toolu_internal", "toolu_client"]
    assert sent[4]["content"][0]["content"] == BIG


def test_refusal_is_prompt_too_long_with_checkpoint(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "tiny.yaml").write_text(
        "budget: {max_input_tokens: 300}\nwindow: {enabled: false}\n")
    with pytest.raises(anthropic.BadRequestError) as raised:
        proxy.anthropic(policy="tiny").messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "word " * 2000}])
    error = raised.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith("prompt is too long: ")
    assert error["checkpoint_id"].startswith("ckpt-")
    assert (proxy.data_dir / "checkpoints" / f"{error['checkpoint_id']}.json").exists()
    assert fake_upstream.messages_requests == []


@pytest.mark.parametrize("body, field", [
    (b"{", "invalid_json"),
    (b'{"model": "m", "max_tokens": 5}', "messages"),
    (b'{"model": "m", "messages": [{"role": "system", "content": "x"}]}', "messages.0.role"),
    (b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}',
     "messages.0.content.0.tool_use_id"),
], ids=["not-json", "no-messages", "bad-role", "result-without-id"])
def test_client_mistakes_are_anthropic_shaped_400s(proxy, fake_upstream, body, field):
    response = httpx.post(f"{proxy.url}/v1/messages", content=body,
                          headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert response.status_code == 400
    payload = response.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert field in payload["error"]["message"] or field == "invalid_json"
    assert fake_upstream.messages_requests == []


def test_other_anthropic_routes_pass_through(proxy, fake_upstream):
    fake_upstream.then(Step(payload={"input_tokens": 7}))
    response = httpx.post(f"{proxy.url}/v1/messages/count_tokens",
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                          headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert response.status_code == 200
    assert fake_upstream.seen[-1].path == "/v1/messages/count_tokens"
    assert fake_upstream.seen[-1].headers["x-api-key"] == "k"


def test_slash_command_answers_in_anthropic_shape(proxy, fake_upstream):
    client = proxy.anthropic()
    result = client.messages.create(model=MODEL, max_tokens=10,
                                    messages=[{"role": "user", "content": "/recall big.log"}])
    assert result.content[0].type == "text" and "big.log" in result.content[0].text
    with client.messages.stream(model=MODEL, max_tokens=10,
                                messages=[{"role": "user", "content": "/pins"}]) as stream:
        assert stream.get_final_message().content[0].text
    assert fake_upstream.messages_requests == []


@pytest.mark.parametrize("rounds", [False, True], ids=["relayed", "internal-rounds"])
def test_a_stream_cut_short_raises_in_the_sdk_and_is_archived_as_such(proxy, fake_upstream, rounds):
    """A Messages stream that ends without message_stop must not look like a short answer: the SDK
    only raises on an `error` event, so the proxy adds one."""
    cut = message_stream([text("partial answer")])[:5]  # no message_delta, no message_stop
    if rounds:  # the model reads a result first, then its second round breaks off
        fake_upstream.then(Step(kind="stream", chunks=message_stream([internal()])),
                           Step(kind="stream", chunks=cut, fault=CLOSE))
        messages = history()
    else:
        fake_upstream.then(Step(kind="stream", chunks=cut, fault=CLOSE))
        messages = [{"role": "user", "content": "hi"}]
    client = proxy.anthropic()
    with pytest.raises(anthropic.APIStatusError), client.messages.stream(
            model=MODEL, max_tokens=100, system=SYSTEM, tools=TOOLS, messages=messages) as stream:
        stream.get_final_message()
    rows = exchanges(proxy)
    assert rows[-1]["error"] and "stream" in rows[-1]["error"]


def test_upstream_error_status_reaches_the_sdk_as_sent(proxy, fake_upstream):
    fake_upstream.then(Step(kind="error", status=529, body=error_body("overloaded_error", "Overloaded")))
    with pytest.raises(anthropic.APIStatusError) as raised:
        proxy.anthropic().messages.create(model=MODEL, max_tokens=5,
                                          messages=[{"role": "user", "content": "x"}])
    assert raised.value.status_code == 529 and raised.value.body["error"]["type"] == "overloaded_error"
    assert exchanges(proxy)[-1]["status"] == 529


def test_recall_finds_an_anthropic_conversation(proxy, fake_upstream):
    client = proxy.anthropic()
    fake_upstream.then(Step(blocks=[text("noted")]))
    client.messages.create(model=MODEL, max_tokens=5, messages=history("invoice INV-2024-000871 failed"),
                           tools=TOOLS, system=SYSTEM)
    proxy.flush()
    answer = client.messages.create(model=MODEL, max_tokens=5,
                                    messages=[*history("invoice INV-2024-000871 failed"),
                                              {"role": "assistant", "content": "noted"},
                                              {"role": "user", "content": "/recall INV-2024-000871"}],
                                    tools=TOOLS, system=SYSTEM)
    assert "INV-2024-000871" in answer.content[0].text and "toolu_read" in answer.content[0].text


def test_an_assistant_prefill_stays_last(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "memory.yaml").write_text("working_memory: {inject: always}\n")
    fake_upstream.then(Step(blocks=[text('"id": 7}')]))
    messages = [*history('{"order_id": "ORD-1234", "customer_id": "C-77", "status": "pending"}'),
                {"role": "assistant", "content": "{"}]
    proxy.anthropic(policy="memory").messages.create(model=MODEL, max_tokens=20, system=SYSTEM, tools=TOOLS,
                                                     messages=messages)
    sent = fake_upstream.messages_requests[0].json()["messages"]
    assert sent[-1] == {"role": "assistant", "content": "{"}
    assert "<system-reminder>" in orjson.dumps(sent[-2]).decode()  # working memory, before the prefill


def test_a_client_tool_named_like_ours_turns_our_rewriting_off(proxy, fake_upstream):
    fake_upstream.then(Step(blocks=[text("ok")]))
    tools = [*TOOLS, {"name": "recall", "description": "the client's own",
                      "input_schema": {"type": "object"}}]
    body = orjson.dumps({"model": MODEL, "max_tokens": 5, "tools": tools, "messages": history()})
    httpx.post(f"{proxy.url}/v1/messages", content=body,
               headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert fake_upstream.messages_requests[0].body == body  # no summary, no tools of ours


def test_a_rewrite_the_api_would_reject_goes_as_received_and_says_so(proxy, fake_upstream, monkeypatch):
    """The safety net for a codec bug: the client's own bytes go, the headers and archive say so."""
    from proxy.wire import messages

    def ours_broken(body: dict) -> list[str]:
        return ["forced"] if any(t.get("name") == "read_tool_result" for t in body.get("tools") or []) else []

    monkeypatch.setattr(messages, "problems", ours_broken)
    body = orjson.dumps({"model": MODEL, "max_tokens": 5, "tools": TOOLS, "messages": history()})
    fake_upstream.then(Step(blocks=[text("ok")]))
    response = httpx.post(f"{proxy.url}/v1/messages", content=body,
                          headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert response.status_code == 200 and response.headers["x-ctxproxy-rewrite"] == "refused"
    assert response.headers["x-ctxproxy-tokens-after"] == response.headers["x-ctxproxy-tokens-before"]
    assert fake_upstream.messages_requests[0].body == body
    assert exchanges(proxy)[0]["forwarded_leaf"] == exchanges(proxy)[0]["request_leaf"]


def test_the_1m_context_beta_sizes_the_window(make_proxy, fake_upstream):
    """A request over 200k tokens is refused at Claude's usual window, and goes with the 1M beta."""
    proxy = make_proxy()
    (proxy.policies_dir / "plain.yaml").write_text(
        "window: {enabled: false}\ntool_results: {enabled: false}\n")
    huge = [{"role": "user", "content": "word " * 230_000}]
    with pytest.raises(anthropic.BadRequestError):
        proxy.anthropic(policy="plain").messages.create(model=MODEL, max_tokens=5, messages=huge)
    fake_upstream.then(Step(blocks=[text("ok")]))
    result = proxy.anthropic(policy="plain").messages.create(
        model=MODEL, max_tokens=5, messages=huge, extra_headers={"anthropic-beta": "context-1m-2025-08-07"})
    assert result.content[0].text == "ok"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses"])
def test_openai_routes_answer_in_openai_shape_whatever_headers_come(proxy, fake_upstream, route):
    response = httpx.post(f"{proxy.url}{route}", content=b"{", headers={
        "x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_an_anthropic_key_never_goes_to_the_summarizer_models_upstream(make_proxy, fake_upstream):
    """Summarizer models are called on the OpenAI-compatible upstream with the client's credentials: for
    an Anthropic client the policy's models are off (deterministic summaries and folding instead)."""
    proxy = make_proxy()
    (proxy.policies_dir / "models.yaml").write_text(
        "tool_results: {summarizer_model: gpt-4o-mini}\nsummary: {summarizer_model: gpt-4o-mini}\n"
        "folded: {enabled: true, summarizer_model: gpt-4o-mini}\n")
    fake_upstream.then(Step(blocks=[text("ok")]))
    proxy.anthropic(api_key="sk-ant-secret", policy="models").messages.create(
        model=MODEL, max_tokens=5, system=SYSTEM, tools=TOOLS, messages=history())
    assert fake_upstream.chat_requests == []  # no model call went to the OpenAI-compatible route
    summary = fake_upstream.messages_requests[0].json()["messages"][2]["content"][0]["content"]
    assert "read_tool_result" in summary  # a deterministic summary took its place
