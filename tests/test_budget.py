"""The four-state gate: pass, warn (once), prune (one batch, sticky), refuse (checkpoint + 400)."""

from __future__ import annotations

import logging
import os
import stat

import httpx
import openai
import orjson
import pytest

from proxy import pipeline
from proxy.policy import LoadedPolicy, Policy
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter

TOKENS = TokenCounter()


def policy(**budget) -> LoadedPolicy:
    """Layer 2 on its own: the sliding window (which would evict first) is off here."""
    return LoadedPolicy("t", Policy.model_validate({"budget": {"max_input_tokens": 2000, **budget},
                                                    "window": {"enabled": False}}), None)


def tool_history(results: int, words: int = 150) -> list[dict]:
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    for k in range(results):
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{k}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"result {k}: " + "ok " * words}]
    return [*messages, {"role": "user", "content": "continue"}]


def run(messages, loaded, store=None, session="s"):
    context = pipeline.PipelineContext(loaded, Session(session, "header"), "t", TOKENS, store or StateStore())
    return pipeline.run(pipeline.Conversation("gpt-4o", messages, None), context)


def test_pass_below_soft_warn():
    outcome = run(tool_history(2), policy())
    assert outcome.gate == "pass" and not outcome.changed


def test_warn_band_logs_once_per_session(caplog):
    store, loaded = StateStore(), policy()
    messages = tool_history(8)  # ~1450 tokens of 2000: between 70% and 80%
    with caplog.at_level(logging.WARNING, logger="ctxproxy.budget"):
        first = run(messages, loaded, store)
        second = run(messages, loaded, store)
    assert first.gate == second.gate == "warn"
    assert not first.changed
    assert len([r for r in caplog.records if "context budget warn" in r.message]) == 1


def test_prune_in_one_batch_down_to_the_low_water_mark_keeping_recent():
    store, loaded = StateStore(), policy()
    messages = tool_history(11)
    outcome = run(messages, loaded, store)
    assert outcome.gate == "prune"
    assert outcome.tokens_after * 1.05 <= 0.5 * 2000 + 60
    tools = [m for m in outcome.messages if m["role"] == "tool"]
    assert all(m["content"].startswith("[summarized: call_id=") for m in tools[:5])
    assert [m["content"] for m in tools[-3:]] == [m["content"] for m in messages if m["role"] == "tool"][-3:]
    assert outcome.tools[-1]["function"]["name"] == "read_tool_result"
    # The next turns stay under prune_at: no re-prune, and the pruned prefix is byte-identical.
    later = [*messages[:-1], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    again = run(later, loaded, store)
    assert again.gate in ("pass", "warn")
    prefix = len(messages) - 1
    assert orjson.dumps(again.messages[:prefix]) == orjson.dumps(outcome.messages[:prefix])


def test_refuse_writes_a_redacted_private_checkpoint(tmp_path):
    loaded = policy(keep_recent=3)
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "word " * 2500}]
    context = pipeline.PipelineContext(loaded, Session("s", "header"), "t", TOKENS, StateStore(),
                                       checkpoints_dir=tmp_path)
    with pytest.raises(pipeline.ContextLengthExceeded) as caught:
        pipeline.run(pipeline.Conversation("gpt-4o", messages, None), context)
    checkpoint_id = caught.value.extra["checkpoint_id"]
    path = tmp_path / f"{checkpoint_id}.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    document = orjson.loads(path.read_bytes())
    assert document["call_id"] == checkpoint_id and document["max_input_tokens"] == 2000
    assert document["estimated_tokens"] >= 2000 and document["redacted"] is True
    assert document["redaction_policy"] == ["tool.content", "assistant.tool_calls.function.arguments",
                                            "secrets:api_keys,tokens,passwords,private_keys"]


def test_refusal_through_the_server(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "tiny.yaml").write_text(
        "budget:\n  max_input_tokens: 1000\nwindow:\n  enabled: false\n")
    secret_args = '{"password": "hunter2"}'
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "login", "arguments": secret_args}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "token=SECRET-TOKEN"},
                {"role": "user", "content": "essay " * 1500}]
    client = openai.OpenAI(base_url=f"{proxy.url}/p/tiny/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=messages)
    error = caught.value.body
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert error["type"] == "invalid_request_error"
    assert caught.value.response.headers["x-ctxproxy-gate"] == "refuse"
    assert fake_upstream.chat_requests == []
    path = proxy.data_dir / "checkpoints" / f"{error['checkpoint_id']}.json"
    text = path.read_text()
    assert "hunter2" not in text and "SECRET-TOKEN" not in text and "[redacted: " in text
    proxy.flush()
    ticket = next(proxy.query("select * from tickets"))
    assert ticket["kind"] == "decompose-required" and ticket["checkpoint_id"] == error["checkpoint_id"]
    row = next(proxy.query("select gate, status from exchanges"))
    assert (row["gate"], row["status"]) == ("refuse", 400)


def test_gate_headers_on_every_response(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "small.yaml").write_text(
        "budget:\n  max_input_tokens: 2000\nwindow:\n  enabled: false\n")
    response = httpx.post(f"{proxy.url}/p/small/v1/chat/completions",
                          json={"model": "gpt-4o", "messages": tool_history(11)})
    assert response.headers["x-ctxproxy-gate"] == "prune"
    forwarded = fake_upstream.chat_requests[-1].json()
    assert forwarded["messages"][3]["content"].startswith("[summarized: call_id=c0]")
    headers = response.headers
    assert int(headers["x-ctxproxy-tokens-after"]) < int(headers["x-ctxproxy-tokens-before"])
