"""Issue 9 through the real server and the openai SDK: a tool result that left the prompt (never
summarized) is found by recall, which names its call id and shows the matching line with its number, and
read back byte for byte by that call id; a later recall does not find the earlier recall and read-back
traffic; another API key reads nothing."""

from __future__ import annotations

import httpx
import orjson

from tests.conftest import BOTH_BACKENDS
from tests.servers import Seen, Step
from tests.test_window_e2e import SECRET, history_with_secret, post, tool_turn, windowed  # noqa: F401

ORIGINAL = f"HOME=/root\n{SECRET}\nPATH=/bin"  # call_cfg's output in history_with_secret


def internal(ident: str, name: str, **arguments: str) -> dict:
    return {"id": ident, "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}


def last_tool_answer(seen: Seen, call_id: str) -> str:
    answer = seen.json()["messages"][-1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == call_id
    return answer["content"]


def left_the_prompt(proxy, fake_upstream) -> list[dict]:
    messages = history_with_secret()
    for end in range(8, len(messages) + 1, 4):  # the agent's requests as the session grew
        assert post(proxy, messages[:end]).status_code == 200
    forwarded = fake_upstream.chat_requests[-1].json()["messages"]
    assert not any(m.get("content") == ORIGINAL for m in forwarded), "call_cfg should have left the prompt"
    proxy.flush()
    fake_upstream.reset()
    return messages


@BOTH_BACKENDS
def test_recall_names_the_call_and_read_tool_result_reads_it_back(windowed, fake_upstream):  # noqa: F811
    messages = left_the_prompt(windowed, fake_upstream)
    client = windowed.client(api_key="key-1", base_url=f"{windowed.url}/p/w16k/v1")
    session = {"x-ctxproxy-session": "long-1"}

    def after_recall(seen: Seen) -> Step:
        text = last_tool_answer(seen, "int_r")
        assert 'call_id="call_cfg"' in text and f"line 2: {SECRET}" in text
        return Step(tool_calls=[internal("int_b", "read_tool_result", call_id="call_cfg")])

    def after_read(seen: Seen) -> Step:
        assert last_tool_answer(seen, "int_b") == ORIGINAL  # byte for byte, nothing added
        return Step(content="The key is KX-7731-ALPHA.")

    fake_upstream.then(Step(tool_calls=[internal("int_r", "recall", query="staging deploy key")]),
                       after_recall, after_read)
    question = [*messages, {"role": "user", "content": "What was the deploy key?"}]
    reply = client.chat.completions.create(model="gpt-4o", messages=question, extra_headers=session)
    assert reply.choices[0].message.content == "The key is KX-7731-ALPHA."
    assert reply.choices[0].message.tool_calls is None
    windowed.flush()

    # Asked again later: the earlier recall answer and read-back (archived as rounds) are not hits.
    def again(seen: Seen) -> Step:
        text = last_tool_answer(seen, "int_r2")
        assert text.startswith("recall 'staging deploy key':") and text.count("recall '") == 1
        assert text.count('call_id="call_cfg"') == 1  # not again as the read-back's answer
        assert "int_r" not in text and "int_b" not in text
        return Step(content="Same key.")

    fake_upstream.then(Step(tool_calls=[internal("int_r2", "recall", query="staging deploy key")]), again)
    later = [*question, {"role": "assistant", "content": "The key is KX-7731-ALPHA."},
             {"role": "user", "content": "Check it once more."}]
    reply = client.chat.completions.create(model="gpt-4o", messages=later, extra_headers=session)
    assert reply.choices[0].message.content == "Same key."


def test_another_api_key_cannot_read_it_back(windowed, fake_upstream):  # noqa: F811
    left_the_prompt(windowed, fake_upstream)
    # The other key's own long session (the window offers the internal tools), which never had call_cfg.
    messages = [{"role": "system", "content": "You are an ops agent."}, {"role": "user", "content": "Build."}]
    for k in range(40):
        messages += tool_turn(k)
    with httpx.Client(timeout=30) as http:
        for end in range(8, len(messages) + 1, 8):
            assert http.post(f"{windowed.url}/p/w16k/v1/chat/completions",
                             json={"model": "gpt-4o", "messages": messages[:end]},
                             headers={"authorization": "Bearer key-2", "x-ctxproxy-session": "long-1"}
                             ).status_code == 200
    windowed.flush()
    fake_upstream.reset()

    def refused(seen: Seen) -> Step:
        assert last_tool_answer(seen, "int_x").startswith("error: no stored tool result")
        return Step(content="Nothing there.")

    fake_upstream.then(Step(tool_calls=[internal("int_x", "read_tool_result", call_id="call_cfg")]), refused)
    other = windowed.client(api_key="key-2", base_url=f"{windowed.url}/p/w16k/v1")
    reply = other.chat.completions.create(model="gpt-4o", extra_headers={"x-ctxproxy-session": "long-1"},
                                          messages=[*messages, {"role": "user", "content": "Read call_cfg."}])
    assert reply.choices[0].message.content == "Nothing there."


@BOTH_BACKENDS
def test_recall_finds_what_was_answered_a_moment_before(proxy, fake_upstream):
    """The archive writer lingers for company before it commits (here far longer than the test): /recall
    and the recall tool first wait for what was already submitted, so the exchange just answered is found."""
    proxy.state.archive.linger_s = 600
    client = proxy.client(api_key="key-1")
    session = {"x-ctxproxy-session": "moment-1"}
    fake_upstream.then(Step(content="Noted."))
    told = [{"role": "user", "content": "The release codename is QUOKKA-MARMALADE."}]
    client.chat.completions.create(model="gpt-4o", messages=told, extra_headers=session)
    asked = [*told, {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": "/recall quokka"}]
    reply = client.chat.completions.create(model="gpt-4o", messages=asked, extra_headers=session)
    assert "QUOKKA-MARMALADE" in reply.choices[0].message.content
