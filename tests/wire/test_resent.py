"""A resent history is parsed only past what an earlier body had (proxy/wire/resent.py): the result is
always what a full parse gives, and the repeated messages are the earlier parse's very objects."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import orjson
from hypothesis import event, given, settings
from hypothesis import strategies as st

from proxy.held_memory import held_bytes
from proxy.wire import resent
from proxy.wire.json_layout import layout_of
from proxy.wire.resent import ResentBodies
from tests.strategies import dump_styled as dump
from tests.strategies import json_styles as styles

# Strings that would confuse a careless scanner: quotes, escapes, brackets, non-ASCII, a fake key.
tricky_text = st.lists(st.sampled_from([*'ab "\\{}[]:,\n\té€😀', '"messages":[']), max_size=20).map("".join)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": tricky_text},
    optional={"name": tricky_text, "extra": st.lists(st.dictionaries(tricky_text, tricky_text, max_size=2),
                                                       max_size=2)})


def body(messages: list[dict[str, Any]], style: str, before: dict[str, Any], after: dict[str, Any]) -> bytes:
    return dump({**before, "messages": messages, **after}, style)


def full(raw: bytes) -> Any:
    return json.loads(raw)


@settings(max_examples=300, deadline=None)
@given(st.lists(message, min_size=1, max_size=8), st.lists(message, max_size=4), styles,
       st.dictionaries(st.sampled_from(["model", "temperature", "metadata"]), tricky_text, max_size=2),
       st.dictionaries(st.sampled_from(["stream", "tools", "user"]), tricky_text, max_size=2),
       st.integers(min_value=-1, max_value=7), tricky_text, st.booleans())
def test_a_resent_body_parses_as_a_full_parse_would(history: list[dict[str, Any]], more: list[dict[str, Any]],
                                                   style: str, before: dict[str, Any], after: dict[str, Any],
                                                   edit: int, edited: str, probed: bool) -> None:
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    first = body(history, style, before, after)
    parsed_first = full(first)
    cache.remember(first, "messages", parsed_first)
    resent = history + more
    if 0 <= edit < len(resent):  # the client changed an earlier message (an edited history)
        resent = [*resent[:edit], {**resent[edit], "content": edited}, *resent[edit + 1:]]
    second = body(resent, style, before, after)
    if probed:  # as the server does: how much is new first, then the parse (which takes what it found)
        cache.fresh_bytes(second, "messages")
    got = cache.parse(second, "messages")
    event("reused" if got is not None else "parsed whole")
    if got is None:
        return  # nothing reusable: the caller parses it whole
    parsed, reused = got.body, got.reused
    assert parsed == full(second)
    assert list(parsed) == list(full(second))  # key order kept (the chat codec re-serializes in it)
    assert reused >= 1
    for index in range(reused):  # the very objects of the first parse
        assert parsed["messages"][index] is parsed_first["messages"][index]
    assert json.loads(dump(parsed_first["messages"][:reused], "orjson")) == resent[:reused]


def test_each_turn_of_a_growing_history_reuses_all_of_the_previous_one() -> None:
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    history = [{"role": "system", "content": "be brief"}]
    previous: list[Any] = []
    for turn in range(30):
        history = [*history, {"role": "user", "content": f"turn {turn} \"quoted\" {{braces}} [{turn}]"},
                   {"role": "assistant", "content": f"answer {turn}"}]
        raw = orjson.dumps({"model": "m", "messages": history[:-1], "stream": False})
        got = cache.parse(raw, "messages")
        if got is None:
            parsed = orjson.loads(raw)
            cache.remember(raw, "messages", parsed)
            assert turn == 0
        else:
            cache.keep(got)
            parsed, reused = got.body, got.reused
            assert reused == len(previous)
            assert all(a is b for a, b in zip(parsed["messages"], previous, strict=False))
            assert parsed == orjson.loads(raw)
        previous = parsed["messages"]


def test_duplicate_keys_are_left_to_the_full_parse() -> None:
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    first = b'{"model":"m","messages":[{"role":"user","content":"a"}]}'
    cache.remember(first, "messages", orjson.loads(first))
    for second in (b'{"model":"m","messages":[{"role":"user","content":"a"}],"messages":[]}',
                   b'{"model":"m","messages":[{"role":"user","content":"a"}],"model":"other"}'):
        got = cache.parse(second, "messages")
        assert got is None or got.body == orjson.loads(second)
    # A body with a key before and after the array, remembered, then resent with the same bytes after it:
    # the later value counts, in the first one's place, as in a full parse.
    twice = b'{"model":"m","messages":[{"role":"user","content":"a"}],"model":"other"}'
    cache.remember(twice, "messages", orjson.loads(twice))
    again = twice.replace(b'"a"}]', b'"a"},{"role":"assistant","content":"b"}]')
    got = cache.parse(again, "messages")
    assert got is not None and list(got.body.items()) == list(orjson.loads(again).items())


def test_shapes_it_cannot_reuse_are_parsed_whole() -> None:
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    for raw in (b'{"messages":["text",{"role":"user"}]}',  # a string element: no boundaries kept
                b'{"messages":[1,{"role":"user"}]}',  # a number: element counts differ
                b'{"messages":"not a list"}', b'[{"messages":[{}]}]'):
        parsed = orjson.loads(raw)
        if isinstance(parsed, dict):
            cache.remember(raw, "messages", parsed)
        assert cache.parse(raw + b" ", "messages") is None


def test_not_json_after_the_reused_prefix_is_left_to_the_full_parse() -> None:
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    first = b'{"messages":[{"role":"user","content":"a"}]}'
    cache.remember(first, "messages", orjson.loads(first))
    assert cache.parse(b'{"messages":[{"role":"user","content":"a"},{"role":', "messages") is None


def test_small_bodies_are_not_remembered_and_memory_is_bounded() -> None:
    small = ResentBodies()
    raw = orjson.dumps({"messages": [{"role": "user", "content": "hi"}]})
    small.remember(raw, "messages", orjson.loads(raw))
    assert small.held_bytes == 0
    cache = ResentBodies(limit_bytes=3000, min_bytes=0)
    for n in range(10):
        raw = orjson.dumps({"messages": [{"role": "user", "content": f"{n}" * 1000}]})
        cache.remember(raw, "messages", orjson.loads(raw))
        assert cache.held_bytes <= 3000
    off = ResentBodies(limit_bytes=0, min_bytes=0)
    off.remember(raw, "messages", orjson.loads(raw))
    assert off.held_bytes == 0 and off.parse(raw, "messages") is None


def _structured(session: int, turns: int) -> list[dict[str, Any]]:
    """A history of many small fields: its parse holds ~9 times its bytes (tau2-bench's up to ~4)."""
    def parts(n: int) -> list[dict[str, Any]]:
        return [{"type": "text", "text": f"{session}:{n}:{k}", "flags": [k, k + 1]} for k in range(8)]

    return [{"role": "tool", "tool_call_id": f"c{session}-{n}", "content": parts(n)} for n in range(turns)]


def test_the_budget_holds_for_the_memory_the_parsed_bodies_hold() -> None:
    """The budget is what remembering holds, the parse included (counting the bytes alone let bodies like
    these hold eight times it). Measured by tracemalloc: the cache and nothing else holds them."""
    limit = 512 * 1024
    cache = ResentBodies(limit_bytes=limit, min_bytes=0, group_prefix=1)
    bodies = [orjson.dumps({"model": "m", "messages": _structured(session, 60)}) for session in range(60)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for raw in bodies:
            cache.remember(raw, "messages", orjson.loads(raw))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert sum(map(len, bodies)) > 2 * limit  # (more than the budget, even by their bytes alone)
    assert cache.held_bytes <= limit
    assert held <= 1.25 * limit


def test_a_growing_session_is_counted_as_its_bytes_and_its_parse() -> None:
    """Each turn's body builds on the previous one's parse: what it holds is summed from what was counted
    for the elements it reuses and the new ones alone, and it equals a count of the whole."""
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    before = {"model": "m", "tools": [{"name": "lookup", "schema": {"type": "object"}}]}
    history = _structured(0, 3)
    raw = orjson.dumps({**before, "messages": history})
    cache.remember(raw, "messages", orjson.loads(raw))
    for turn in range(5):
        history += _structured(1, turn + 1)[turn:]
        raw = orjson.dumps({**before, "messages": history})
        got = cache.parse(raw, "messages")
        assert got is not None
        cache.keep(got)
        whole = orjson.loads(raw)
        tools_and_model = held_bytes({k: whole[k] for k in before})
        assert cache.held_bytes == len(raw) + tools_and_model + sum(map(held_bytes, whole["messages"]))


def test_keys_after_the_array_with_the_same_bytes_are_the_earlier_bodys_objects() -> None:
    """Claude Code sends its system prompt and tools after the messages: resent with the same bytes they
    are the objects parsed (and checked, counted, decoded) before, as the repeated messages are; with
    other bytes, a parse of their own."""
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    history = [{"role": "user", "content": "task"}]
    schema = {"type": "object", "properties": {"command": {"type": "string"}}}
    tools = [{"name": "Bash", "input_schema": schema}]

    def body(messages: list[dict[str, Any]], system: str) -> bytes:
        return orjson.dumps({"model": "m", "messages": messages, "system": system, "tools": tools})

    raw = body(history, "be brief")
    first = orjson.loads(raw)
    cache.remember(raw, "messages", first)
    history.append({"role": "assistant", "content": "ok"})
    got = cache.parse(body(history, "be brief"), "messages")
    assert got is not None and got.body == json.loads(body(history, "be brief"))
    assert got.body["tools"] is first["tools"] and got.body["system"] is first["system"]
    assert got.same_keys == {"model", "system", "tools"}
    cache.keep(got)
    history.append({"role": "user", "content": "next"})
    again = cache.parse(body(history, "be brief"), "messages")
    assert again is not None and again.body["tools"] is first["tools"]  # (turn after turn)
    changed = cache.parse(body(history, "be thorough"), "messages")
    assert changed is not None and changed.body == json.loads(body(history, "be thorough"))
    assert changed.body["tools"] is not first["tools"] and changed.same_keys == {"model"}


def test_only_checked_bodies_are_built_on() -> None:
    """A resent body is remembered only once the caller kept it (its new elements passed the checks):
    a body with a bad new message, never kept, is not a base whose messages go unchecked later."""
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    good = [{"role": "user", "content": "a"}]
    first = orjson.dumps({"messages": good})
    cache.remember(first, "messages", orjson.loads(first))
    bad = orjson.dumps({"messages": [*good, {"role": 5}]})
    got = cache.parse(bad, "messages")
    assert got is not None and got.reused == 1  # not kept: the caller's check failed
    again = cache.parse(orjson.dumps({"messages": [*good, {"role": 5}, {"role": "user"}]}), "messages")
    assert again is not None and again.reused == 1  # built on the checked body, not on the bad one


def test_fresh_bytes_are_what_a_resend_adds() -> None:
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    history = [{"role": "user", "content": f"message {n} " + "x" * 500} for n in range(20)]
    first = orjson.dumps({"model": "m", "messages": history})
    assert cache.fresh_bytes(first, "messages") == len(first)  # nothing remembered yet
    cache.remember(first, "messages", orjson.loads(first))
    second = orjson.dumps({"model": "m", "messages": [*history, {"role": "user", "content": "new"}]})
    shared = len(orjson.dumps({"model": "m", "messages": history})) - len("]}")  # up to the last message
    # (what follows the array's `]`, the same bytes as before, is not read anew)
    assert cache.fresh_bytes(second, "messages") == len(second) - shared - len("}") < 60
    other = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "another session"}]})
    assert cache.fresh_bytes(other, "messages") == len(other)
    assert ResentBodies(limit_bytes=0).fresh_bytes(second, "messages") == len(second)  # cache off


def test_the_same_keys_after_the_array_are_not_fresh_and_other_ones_are() -> None:
    # Claude Code's shape: the messages first, its system prompt and tools after them, the same every turn.
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    history = [{"role": "user", "content": f"message {n} " + "x" * 500} for n in range(20)]
    after = {"system": "You are Claude Code. " * 200, "tools": [{"name": f"tool_{n}"} for n in range(16)]}
    first = orjson.dumps({"messages": history, **after})
    cache.remember(first, "messages", orjson.loads(first))
    added = {"role": "user", "content": "new"}
    second = orjson.dumps({"messages": [*history, added], **after})
    assert cache.fresh_bytes(second, "messages") == len(orjson.dumps(added)) + 2  # (its comma, the `]`)
    changed = orjson.dumps({"messages": [*history, added], **after, "system": "Another prompt."})
    assert cache.fresh_bytes(changed, "messages") > len(orjson.dumps({"tools": after["tools"]}))
    # What a parse then reads anew agrees: the keys after the array are the earlier body's very objects.
    resent = cache.parse(second, "messages")
    assert resent is not None and resent.same_keys == frozenset(after)


def test_a_parse_takes_what_fresh_bytes_found_and_holds_few_bodies_for_it(monkeypatch) -> None:
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    history = [{"role": "user", "content": f"message {n} " + "x" * 500} for n in range(20)]
    first = orjson.dumps({"model": "m", "messages": history})
    cache.remember(first, "messages", orjson.loads(first))
    compared = []
    real = resent.ResentBodies._best
    monkeypatch.setattr(resent.ResentBodies, "_best", lambda self, group, raw: compared.append(raw) or real(
        self, group, raw))
    second = orjson.dumps({"model": "m", "messages": [*history, {"role": "user", "content": "new"}]})
    cache.fresh_bytes(second, "messages")
    got = cache.parse(second, "messages")
    assert got is not None and got.reused == 20 and compared == [second]  # compared once, not twice
    assert cache.parse(second, "messages") is not None and len(compared) == 2  # (taken: compared anew)
    for n in range(10):  # probes whose parse never came: at most PROBES bodies held
        more = [*history, {"role": "user", "content": n}]
        cache.fresh_bytes(orjson.dumps({"model": "m", "messages": more}), "messages")
    assert len(cache._probes) == resent.PROBES


@given(st.integers(1, 300), st.integers(0, 300), st.booleans())
def test_reusable_is_the_longest_run_of_whole_messages_repeated(length: int, cut: int, longer: bool) -> None:
    history = [{"role": "user", "content": f"message {n}"} for n in range(length)]
    raw = orjson.dumps({"messages": history})
    layout = layout_of(raw, "messages", length)
    assert layout is not None
    earlier = resent._Body(raw, orjson.loads(raw), layout)
    changed = [*history[:cut], *({"role": "user", "content": "edited"} for _ in history[cut:cut + 1]),
               *history[cut + 1:], *([{"role": "user", "content": "new"}] if longer else [])]
    assert earlier.reusable(orjson.dumps({"messages": changed})) == min(cut, length)


def test_a_body_that_parts_early_costs_a_few_comparisons(monkeypatch) -> None:
    """Concurrent sessions of one agent share their opening bytes (one group) and part at the task: each
    remembered body of another session is told apart in a few memcmp calls, not a search of its length."""
    history = [{"role": "system", "content": "be brief"}, *({"role": "user", "content": f"a {n}"}
                                                             for n in range(500))]
    raw = orjson.dumps({"messages": history})
    layout = layout_of(raw, "messages", len(history))
    assert layout is not None
    earlier = resent._Body(raw, orjson.loads(raw), layout)
    calls = []
    real = resent.same_start
    monkeypatch.setattr(resent, "same_start", lambda *args: calls.append(args[2]) or real(*args))
    other = orjson.dumps({"messages": [history[0], {"role": "user", "content": "another task"},
                                       *history[2:]]})
    assert earlier.reusable(other) == 1 and len(calls) <= 4


def test_another_session_sharing_a_prefix_does_not_displace_a_remembered_body() -> None:
    """A body is dropped when its own session resends it whole and more; a body that only shares its
    opening messages (another session of the same agent) leaves it for its session's next request."""
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    system = {"role": "system", "content": "be brief"}
    mine = [system, *({"role": "user", "content": f"mine {n}"} for n in range(20))]
    first = orjson.dumps({"messages": mine})
    cache.remember(first, "messages", orjson.loads(first))
    theirs = [system, {"role": "user", "content": "theirs"}]
    other = cache.parse(orjson.dumps({"messages": theirs}), "messages")
    assert other is not None and other.reused == 1
    cache.keep(other)
    again = cache.parse(orjson.dumps({"messages": [*mine, {"role": "user", "content": "next"}]}), "messages")
    assert again is not None and again.reused == len(mine)
    cache.keep(again)
    assert cache.parse(first, "messages") is not None  # (now built on the longer body)
    assert len(cache._groups[("", "messages", first[:1])]) == 2  # the longer replaced the first; theirs stays


def test_a_hundred_concurrent_sessions_of_one_agent_each_build_on_their_own_body(monkeypatch) -> None:
    """They share their opening bytes (one group): each turn finds its session's previous body whole,
    and the others' bodies cost one comparison each (none is searched for a shared part)."""
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    system = {"role": "system", "content": "the same agent"}
    histories = [[system, {"role": "user", "content": f"task {n}"}] for n in range(100)]
    for history in histories:
        raw = orjson.dumps({"messages": history})
        cache.remember(raw, "messages", orjson.loads(raw))
    searched = []
    real = resent._Body.reusable
    monkeypatch.setattr(resent._Body, "reusable", lambda self, raw: searched.append(raw) or real(self, raw))
    for turn in range(3):
        for history in histories:
            history.append({"role": "user", "content": f"turn {turn}"})
            got = cache.parse(orjson.dumps({"messages": history}), "messages")
            assert got is not None and got.reused == len(history) - 1
            cache.keep(got)
    assert searched == []


MARKED = {"cache_control": {"type": "ephemeral"}}


def text(role: str, words: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": words}]}


def marked_body(history: list[dict[str, Any]]) -> bytes:
    """As Claude Code sends a history: the cache marker on the newest message's last block only."""
    last = {**history[-1], "content": [{**history[-1]["content"][0], **MARKED}]}
    return orjson.dumps({"messages": [*history[:-1], last]})


def remembered(histories: list[list[dict[str, Any]]]) -> ResentBodies:
    """A cache holding each history as sent, every one in one group (the same opening byte)."""
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    for history in histories:
        raw = marked_body(history)
        cache.remember(raw, "messages", orjson.loads(raw))
    return cache


def compared_sizes(monkeypatch) -> list[int]:
    """The size of every memcmp the cache makes from now on."""
    compared: list[int] = []
    real = resent.same_start
    monkeypatch.setattr(resent, "same_start", lambda *args: compared.append(args[2]) or real(*args))
    return compared


def test_a_session_of_many_finds_its_own_body_in_one_pass_over_its_bytes(monkeypatch) -> None:
    """A hundred Claude Code sessions of one agent: one group (their opening bytes are the same), their
    tasks differ, the cache marker moves every turn (no body is resent whole). Each parse tells the others'
    bodies apart by a few bytes, and compares its own session's bytes about once (not once a step of a
    search for where they part)."""
    opening = "<system-reminder>the same reminder for every session</system-reminder>"
    histories = [[text("user", f"{opening} task {n}"),
                  *(text("assistant" if k % 2 == 0 else "user", f"step {k}") for k in range(41))]
                 for n in range(100)]
    cache = remembered(histories)
    compared = compared_sizes(monkeypatch)
    for turn in range(3):
        for history in histories:
            history += [text("assistant", f"answer {turn}"), text("user", f"go {turn}")]
            compared.clear()
            raw = marked_body(history)
            got = cache.parse(raw, "messages")
            assert got is not None and got.reused == len(history) - 3
            cache.keep(got)
            assert len(compared) <= 3 and sum(compared) <= 1.2 * len(raw)


def test_the_other_sessions_bodies_are_told_apart_once_a_parse(monkeypatch) -> None:
    """Each remembered body of another session (its first element, the task, differs) is looked at once a
    parse, not once for each way a body can build on it (resent whole, continued, sharing a part)."""
    histories = [[text("user", f"task {n}"), text("assistant", "step"), text("user", "go")]
                 for n in range(60)]
    cache = remembered(histories)
    looked = []
    real = resent._Body.shares_first
    monkeypatch.setattr(resent._Body, "shares_first",
                        lambda self, raw: looked.append(self) or real(self, raw))
    history = histories[7] + [text("assistant", "answer"), text("user", "more")]
    got = cache.parse(marked_body(history), "messages")
    assert got is not None and got.reused == len(history) - 3  # continued: the marker moved
    assert len(looked) == len(set(map(id, looked))) == 60


def test_sessions_that_open_alike_are_not_searched_before_ones_own(monkeypatch) -> None:
    """As in tau2-bench's traces: the sessions of one agent open with the same few messages (a greeting,
    the agent's first answer) and part after them. With the cache marker moving (no body resent whole),
    a parse still compares its own session's bytes about once: the session going on is looked for among
    the bodies before any search for a shared part, which would cost each other session's body a few
    memcmp calls (they share the opening: a search finds it)."""
    opening = [text("user", "Hi, I need help with my order."), text("assistant", "Your user id?"),
               text("user", "Let me look it up."), text("assistant", "Take your time.")]
    names = [f"{'x' * n}-{n}" for n in range(50)]  # (bodies of many lengths, as real sessions' are)
    histories = [[*opening, *(text("user" if k % 2 == 0 else "assistant", f"step {k} of session {name}")
                              for k in range(9))] for name in names]
    cache = remembered(histories)
    compared = compared_sizes(monkeypatch)
    for turn in range(2):
        for name, history in zip(names, histories, strict=True):
            history += [text("assistant", f"answer {turn} of {name}"), text("user", f"go {turn} on {name}")]
            compared.clear()
            got = cache.parse(marked_body(history), "messages")
            assert got is not None and got.reused == len(history) - 3
            cache.keep(got)
            assert len(compared) <= 2


def test_a_session_that_edits_its_last_messages_every_turn_keeps_one_body_and_builds_on_it() -> None:
    """Anthropic clients move their cache marker to the newest message every turn, so each body repeats
    all but the last one or two of the previous one's: that is the session's next turn, which replaces
    its previous body (not a body of another session, kept beside it)."""
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    system = {"role": "system", "content": "the agent"}
    other = [system, {"role": "user", "content": "another session"}, {"role": "assistant", "content": "ok"}]
    raw = orjson.dumps({"messages": other})
    cache.remember(raw, "messages", orjson.loads(raw))
    history: list[dict[str, Any]] = [system, {"role": "user", "content": "task"}]
    held = []
    for turn in range(12):
        sent = [*history[:-1], {**history[-1], **MARKED}]  # the marker on the newest message only
        got = cache.parse(orjson.dumps({"messages": sent}), "messages")
        assert got is not None
        if turn >= 2:
            assert got.reused == len(sent) - 3  # all but the message that lost its marker and the two new
        cache.keep(got)
        held.append(len(cache._groups[("", "messages", raw[:1])]))
        history += [{"role": "assistant", "content": f"answer {turn}"},
                    {"role": "user", "content": f"go {turn}"}]
    assert held[-1] == held[2] <= 4  # not a body more a turn
    again = cache.parse(raw + b" ", "messages")  # the other session's body (sharing the opening) stays
    assert again is not None and again.reused == len(other)


def test_keys_after_the_array_are_counted_too() -> None:
    """Claude Code and OpenAI's SDKs send `system` and `tools` after the messages: their parse is held too."""
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    tools = [{"name": f"tool{n}", "input_schema": {"type": "object", "properties": {}}} for n in range(20)]
    raw = orjson.dumps({"model": "m", "messages": _structured(0, 3), "tools": tools})
    whole = orjson.loads(raw)
    cache.remember(raw, "messages", whole)
    assert cache.held_bytes == len(raw) + held_bytes({"model": "m", "tools": whole["tools"]}) \
        + sum(map(held_bytes, whole["messages"]))
