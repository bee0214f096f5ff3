"""Resent histories through the real server (wire/resent.py): each turn of a long session is parsed only
past what the previous turn had, and what the proxy archives and checks is exactly what the client sent —
growing, edited earlier on, or wrong in a new message — with the official openai and anthropic SDKs."""

from __future__ import annotations

import openai
import pytest

from proxy.wire import resent
from tests.anthropic_upstream import text
from tests.servers import Step


@pytest.fixture
def reused(monkeypatch) -> list[int]:
    """How many messages each parse took from an earlier body (0: parsed whole)."""
    seen: list[int] = []
    resent.BODIES.clear()  # (process-wide: bodies other tests sent are no base here)
    parse = resent.BODIES.parse

    def spy(raw: bytes, key: str, scope: str = "") -> resent.Resent | None:
        got = parse(raw, key, scope)
        seen.append(got.reused if got is not None else 0)
        return got

    monkeypatch.setattr(resent.BODIES, "parse", spy)
    return seen


def opening(n: int = 40) -> list[dict]:
    # ~120 KB, past the size from which bodies are remembered; strings that look like JSON structure.
    return [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f'turn {i}: {{"messages": [}}] "quoted" \\ back\\slash ' + "é€ 😀 " * 500}
            for i in range(n)]


def archived(proxy) -> list[list[tuple[str, str]]]:
    """Each exchange's request as the archive holds it: (role, text) per message."""
    proxy.flush()
    rows = list(proxy.query("select request_leaf from exchanges order by rowid"))
    return [[(m["role"], m["content"]) for m in proxy.reader().chain(row["request_leaf"])] for row in rows]


def as_pairs(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


def test_a_chat_session_is_archived_as_sent_turn_by_turn_and_after_an_edit(proxy, fake_upstream, reused):
    client = proxy.client(default_headers={"x-ctxproxy-session": "resent-chat"})
    history = opening()
    sent = []
    for turn in range(4):
        history = [*history, {"role": "user", "content": f"next step {turn}"}]
        answer = client.chat.completions.create(model="gpt-4o", messages=history)
        assert answer.choices[0].message.content == f"echo: next step {turn}"
        sent.append(history)
        history = [*history, {"role": "assistant", "content": answer.choices[0].message.content}]
    edited = [*history[:3], {**history[3], "content": "an earlier turn, edited"}, *history[4:],
              {"role": "user", "content": "after the edit"}]
    client.chat.completions.create(model="gpt-4o", messages=edited)
    sent.append(edited)
    assert archived(proxy) == [as_pairs(messages) for messages in sent]
    assert fake_upstream.chat_requests[-1].json()["messages"][3]["content"] == "an earlier turn, edited"
    assert reused == [0, 41, 43, 45, 3]  # each turn on the last one's messages; the edit from message 3


def test_a_mistake_in_a_new_message_of_a_resent_history_is_a_400_naming_it(proxy, fake_upstream):
    client = proxy.client(default_headers={"x-ctxproxy-session": "resent-bad"})
    history = [*opening(), {"role": "user", "content": "go"}]
    client.chat.completions.create(model="gpt-4o", messages=history)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[
            *history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": 5}])
    assert caught.value.body["param"] == f"messages[{len(history) + 1}].content"
    # The same history, now right: answered (the bad body was never a base to build on).
    client.chat.completions.create(model="gpt-4o", messages=[
        *history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "fine"}])
    assert len(fake_upstream.chat_requests) == 2


def test_an_anthropic_session_is_archived_as_sent_turn_by_turn(proxy, fake_upstream, reused):
    client = proxy.anthropic(default_headers={"x-ctxproxy-session": "resent-messages"})
    history = opening()
    sent = []
    for turn in range(3):
        fake_upstream.then(Step(blocks=[text(f"answer {turn}")]))
        history = [*history, {"role": "user", "content": f"next step {turn}"}]
        reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=history)
        assert reply.content[0].text == f"answer {turn}"
        sent.append(history)
        history = [*history, {"role": "assistant", "content": f"answer {turn}"}]
    assert archived(proxy) == [as_pairs(messages) for messages in sent]
    assert fake_upstream.messages_requests[-1].json()["messages"] == sent[-1]
    assert reused == [0, 41, 43]


def test_resent_cache_bytes_zero_parses_every_body_whole(make_proxy, fake_upstream, reused):
    proxy = make_proxy({"server": {"resent_cache_bytes": 0}})
    try:
        client = proxy.client(default_headers={"x-ctxproxy-session": "resent-off"})
        history = [*opening(), {"role": "user", "content": "go"}]
        for _ in range(2):
            client.chat.completions.create(model="gpt-4o", messages=history)
            history = [*history, {"role": "assistant", "content": "echo: go"},
                       {"role": "user", "content": "go"}]
        assert reused == [0, 0] and resent.BODIES.held_bytes == 0
        assert archived(proxy)[-1] == as_pairs(history[:-2])
    finally:
        resent.BODIES.limit_bytes = 64 * 1024 * 1024  # (process-wide; other proxies of the run set their own)
