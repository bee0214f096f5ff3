"""The sliding window through the real server: long sessions are never refused, evicted facts are
recallable (tool and slash command, streaming and not), and the admin search API is guarded."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from tests.conftest import BOTH_BACKENDS
from tests.servers import Seen, Step, stream_chunks

# A small window budget: old results are masked first, so only a tight budget evicts whole exchanges.
WINDOW_POLICY = "budget:\n  max_input_tokens: 16000\nwindow:\n  max_tokens: 3000\n"
SECRET = "the staging deploy key is KX-7731-ALPHA"


def tool_turn(k: int) -> list[dict]:
    arguments = orjson.dumps({"cmd": f"step {k}"}).decode()
    call = {"id": f"call_{k}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    output = "\n".join(f"step {k} line {i}: compiled module_{i} ok" for i in range(30))  # ~450 tokens
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{k}", "content": output},
            {"role": "assistant", "content": f"Step {k} done."},
            {"role": "user", "content": f"Continue with step {k + 1}."}]


@pytest.fixture
def windowed(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "w16k.yaml").write_text(WINDOW_POLICY)
    return proxy


def post(proxy, messages, **extra):
    return httpx.post(f"{proxy.url}/p/w16k/v1/chat/completions", timeout=30,
                      json={"model": "gpt-4o", "messages": messages, **extra},
                      headers={"authorization": "Bearer key-1", "x-ctxproxy-session": "long-1"})


def test_three_hundred_turns_are_never_refused(windowed, fake_upstream):
    messages = [{"role": "system", "content": "You are a build agent."},
                {"role": "user", "content": "Build every module."}]
    gates, after = set(), []
    with httpx.Client(timeout=30) as http:  # the SDK's own per-request cost on ~1 MB bodies dominates
        for k in range(300):
            response = http.post(f"{windowed.url}/p/w16k/v1/chat/completions",
                                 content=orjson.dumps({"model": "gpt-4o", "messages": messages}),
                                 headers={"authorization": "Bearer key-1", "x-ctxproxy-session": "long-1",
                                          "content-type": "application/json"})
            assert response.status_code == 200
            gates.add(response.headers["x-ctxproxy-gate"])
            after.append(int(response.headers["x-ctxproxy-tokens-after"]))
            messages += tool_turn(k)
    assert "refuse" not in gates and max(after) * 1.05 < 16000
    assert len(messages) > 1000  # the client's history really is long
    forwarded = fake_upstream.chat_requests[-1].json()["messages"]
    assert forwarded[0]["content"] == "You are a build agent."
    assert forwarded[1]["content"] == "Build every module."  # the task statement stays
    assert forwarded[2]["content"].startswith("[ctxproxy auto-summary:")  # after it: the cache keeps both
    assert [t["function"]["name"] for t in fake_upstream.chat_requests[-1].json()["tools"]] == \
        ["read_tool_result", "recall"]


def history_with_secret(turns: int = 40) -> list[dict]:
    read = {"id": "call_cfg", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "env"}'}}
    messages = [{"role": "system", "content": "You are an ops agent."},
                {"role": "user", "content": "Rotate the keys."},
                {"role": "assistant", "content": None, "tool_calls": [read]},
                {"role": "tool", "tool_call_id": "call_cfg", "content": f"HOME=/root\n{SECRET}\nPATH=/bin"},
                {"role": "assistant", "content": "Keys checked."},
                {"role": "user", "content": "Now check the builds."}]
    for k in range(turns):
        messages += tool_turn(k)
    return messages


def recall_call(query: str) -> dict:
    return {"id": "int_r", "type": "function",
            "function": {"name": "recall", "arguments": orjson.dumps({"query": query}).decode()}}


def check_recall_answer(seen: Seen) -> None:
    answer = seen.json()["messages"][-1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == "int_r"
    assert "KX-7731-ALPHA" in answer["content"] and "this session" in answer["content"]


def evict_the_secret(proxy, fake_upstream) -> list[dict]:
    messages = history_with_secret()
    for end in range(8, len(messages) + 1, 4):  # the agent's requests as the session grew
        assert post(proxy, messages[:end]).status_code == 200
    last = fake_upstream.chat_requests[-1].json()["messages"]
    assert not any(m.get("tool_call_id") == "call_cfg" for m in last), "the fact should have left"
    proxy.flush()  # what was evicted was archived long ago in a real session
    fake_upstream.reset()
    return messages


@BOTH_BACKENDS
def test_recall_finds_an_evicted_fact(windowed, fake_upstream):
    messages = evict_the_secret(windowed, fake_upstream)

    def second_round(seen: Seen) -> Step:
        check_recall_answer(seen)
        return Step(content="The key is KX-7731-ALPHA.")

    fake_upstream.then(Step(tool_calls=[recall_call("staging deploy key")]), second_round)
    response = post(windowed, [*messages, {"role": "user", "content": "What was the deploy key?"}])
    assert response.json()["choices"][0]["message"]["content"] == "The key is KX-7731-ALPHA."


def test_recall_finds_an_evicted_fact_streaming(windowed, fake_upstream):
    messages = evict_the_secret(windowed, fake_upstream)

    def second_round(seen: Seen) -> Step:
        check_recall_answer(seen)
        return Step(kind="stream", chunks=stream_chunks(["The key is ", "KX-7731-ALPHA."]))

    fake_upstream.then(Step(kind="stream", chunks=stream_chunks([], tool_calls=[recall_call("deploy key")])),
                       second_round)
    stream = windowed.client(api_key="key-1", base_url=f"{windowed.url}/p/w16k/v1").chat.completions.create(
        model="gpt-4o", stream=True, extra_headers={"x-ctxproxy-session": "long-1"},
        messages=[*messages, {"role": "user", "content": "What was the deploy key?"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The key is KX-7731-ALPHA."
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_recall_slash_command_answers_without_the_model(windowed, fake_upstream, stream):
    messages = evict_the_secret(windowed, fake_upstream)
    client = windowed.client(api_key="key-1", base_url=f"{windowed.url}/p/w16k/v1")
    request = {"model": "gpt-4o", "messages": [*messages, {"role": "user", "content": "/recall deploy key"}],
               "extra_headers": {"x-ctxproxy-session": "long-1"}}
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            stream=True, **request) if c.choices)
    else:
        text = client.chat.completions.create(**request).choices[0].message.content
    assert "KX-7731-ALPHA" in text
    assert fake_upstream.chat_requests == []  # answered by the proxy
    other_tenant = windowed.client(api_key="key-2", base_url=f"{windowed.url}/p/w16k/v1")
    foreign = other_tenant.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "/recall deploy key"}])
    assert "KX-7731" not in foreign.choices[0].message.content


@BOTH_BACKENDS
def test_admin_search_needs_the_token(make_proxy, fake_upstream, monkeypatch):
    monkeypatch.setenv("CTXPROXY_ADMIN", "s3cret")
    proxy = make_proxy({"admin": {"token_env": "CTXPROXY_ADMIN"}})
    proxy.state.archive.linger_s = 600  # (no flush: the search waits for what was answered)
    proxy.client().chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "remember build 4417 failed on arm64"}])
    url = f"{proxy.url}/ctxproxy/search"
    assert httpx.get(url, params={"q": "arm64"}).status_code == 401
    assert httpx.get(url, params={"q": "arm64"}, headers={"authorization": "Bearer nope"}).status_code == 401
    ok = httpx.get(url, params={"q": "arm64 4417"}, headers={"authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and "[arm64]" in ok.json()["hits"][0]["snippet"]
    missing = httpx.get(url, headers={"authorization": "Bearer s3cret"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "q"


def test_admin_search_is_off_without_a_token(proxy, fake_upstream):
    response = httpx.get(f"{proxy.url}/ctxproxy/search", params={"q": "x"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "admin_disabled"


@BOTH_BACKENDS
def test_model_headlines_arrive_in_the_background_and_show_from_the_next_batch(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "heads.yaml").write_text(
        "budget:\n  max_input_tokens: 4000\nsummary:\n  summarizer_model: head-model\n"
        "tool_results:\n  enabled: false\n")  # no masking: every batch evicts (what this test is about)
    fake_upstream.by_model["head-model"] = lambda seen: Step(content="MODEL HEADLINE: built a module")
    messages = [{"role": "system", "content": "You are a build agent."},
                {"role": "user", "content": "Build every module."}]
    blocks: list[str] = []
    for k in range(30):
        response = httpx.post(f"{proxy.url}/p/heads/v1/chat/completions", timeout=30,
                              json={"model": "gpt-4o", "messages": messages},
                              headers={"x-ctxproxy-session": "heads-1"})
        assert response.status_code == 200
        forwarded = [r for r in fake_upstream.chat_requests if r.json()["model"] == "gpt-4o"][-1].json()
        sent = forwarded["messages"]
        block = (sent[2]["content"] if len(sent) > 2 else None) or ""  # the auto-summary follows the task
        if block.startswith("[ctxproxy auto-summary") and (not blocks or blocks[-1] != block):
            blocks.append(block)
            deadline = time.monotonic() + 10
            while proxy.state.tasks and time.monotonic() < deadline:  # condition wait: headlines written
                time.sleep(0.01)
        if len(blocks) == 2:
            break
        messages += tool_turn(k)
    assert len(blocks) == 2, "expected two eviction batches"
    assert "MODEL HEADLINE" not in blocks[0]  # the first batch is rendered before any model answered
    assert "MODEL HEADLINE: built a module" in blocks[1]  # picked up at the next batch
    assert any(r.json()["model"] == "head-model" for r in fake_upstream.chat_requests)
