"""Anthropic Messages and OpenAI Responses: a resent history takes what its earlier body decoded to
(wire/decoded_prefix.py) and decodes only its new messages, with exactly what a decode from nothing gives:
the same neutral conversation, the same origins, the same bytes encoded back."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proxy
from proxy.wire import messages as codec
from proxy.wire import responses
from proxy.wire.messages_format import MESSAGES
from proxy.wire.neutral_cache import NEUTRAL
from proxy.wire.resent import BODIES
from proxy.wire.responses_format import RESPONSES

MARK = {"type": "ephemeral"}


@pytest.fixture(autouse=True)
def _fresh_caches():
    BODIES.clear()  # (process-wide: bodies other tests sent are no base here)
    NEUTRAL.clear()
    yield
    BODIES.clear()
    NEUTRAL.clear()


def opening(tag: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Task {tag}: fix the bug. " + "context " * 1200}]


def turn(n: int, kind: str) -> list[dict[str, Any]]:
    """One step of an agent: a tool call and its result, plain text, or the provider's compaction."""
    if kind == "compaction":
        return [{"role": "assistant", "content": [{"type": "compaction", "content": f"summary up to {n}"},
                                                  {"type": "text", "text": f"resuming {n}"}]},
                {"role": "user", "content": f"go on {n}"}]
    if kind == "text":
        return [{"role": "assistant", "content": f"thinking aloud {n}"},
                {"role": "user", "content": [{"type": "text", "text": f"ok {n}"}]}]
    return [{"role": "assistant", "content": [
                {"type": "text", "text": f"step {n}"},
                {"type": "tool_use", "id": f"toolu_{n}", "name": "bash", "input": {"cmd": f"run {n}"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": f"output {n} " * 40},
                {"type": "text", "text": f"note {n}"}]}]


def body_bytes(messages: list[dict[str, Any]], marked: bool) -> bytes:
    """Claude Code's shape: its breakpoint on the last block, moved every turn (so the last message's bytes
    change and a resend shares all but it)."""
    if marked and isinstance(messages[-1]["content"], list):
        last = messages[-1]
        messages = [*messages[:-1], {**last, "content": [*last["content"][:-1],
                                                         {**last["content"][-1], "cache_control": MARK}]}]
    tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    return orjson.dumps({"model": "claude-sonnet-4-5", "max_tokens": 100, "system": "Be careful.",
                         "messages": messages, "tools": tools})


def origins_of(encoder: codec.Encoder, neutral: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(o.k, o.blocks, o.native) for o in (encoder.origins[id(m)] for m in neutral)]


def alone(raw: bytes) -> codec.Encoder:
    """The same body decoded from nothing: parsed anew, no earlier body."""
    return codec.Encoder(orjson.loads(raw), raw, None)


def summarized_first_tool_result(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    at = next((i for i, m in enumerate(messages) if m.get("role") == "tool"), None)
    if at is None:
        return messages
    return [*messages[:at], {**messages[at], "content": "[summarized] output"}, *messages[at + 1:]]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["tool", "tool", "text", "compaction"]), st.booleans()),
                min_size=2, max_size=7))
def test_a_resent_history_decodes_as_from_nothing(steps: list[tuple[str, bool]]) -> None:
    BODIES.clear()
    NEUTRAL.clear()
    messages = opening(str(len(steps)))
    for n, (kind, marked) in enumerate(steps):
        messages = [*messages, *turn(n, kind)]
        raw = body_bytes(messages, marked)
        decoded = MESSAGES.decode(raw)
        encoder, fresh = decoded.encode.__self__, alone(raw)  # type: ignore[attr-defined]
        assert encoder.start == fresh.start
        assert decoded.messages == fresh.neutral
        assert origins_of(encoder, decoded.messages) == origins_of(fresh, fresh.neutral)
        assert encoder.call_owner == fresh.call_owner
        rewritten = summarized_first_tool_result(decoded.messages)
        assert decoded.encode(rewritten, decoded.messages, decoded.tools) == \
            fresh.encode(summarized_first_tool_result(fresh.neutral), fresh.neutral, fresh.body.get("tools"))


def test_only_the_new_messages_are_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = opening("only-new")
    for n in range(3):
        messages = [*messages, *turn(n, "tool")]
    first = MESSAGES.decode(body_bytes(messages, marked=True))
    earlier = MESSAGES.decode(body_bytes([*messages, *turn(3, "tool")], marked=True))
    seen: list[int] = []
    decoded_one = codec.Encoder._decoded

    def spy(self: codec.Encoder, k: int, native: Any, cache: Any) -> Any:
        seen.append(k)
        return decoded_one(self, k, native, cache)

    monkeypatch.setattr(codec.Encoder, "_decoded", spy)
    later = MESSAGES.decode(body_bytes([*messages, *turn(3, "tool"), *turn(4, "tool")], marked=True))

    # The last message of the earlier body moved its breakpoint (new bytes): it and the new two decode.
    assert seen == [codec.SYSTEM, 8, 9, 10]
    assert later.messages[:len(first.messages) - 1] == first.messages[:-1]
    assert all(a is b for a, b in zip(earlier.messages[:-2], later.messages, strict=False))
    spans = later.encode.__self__.spans  # type: ignore[attr-defined]
    assert spans.derived is not None and spans.derived_before() is None  # (no chain of bodies held)


def test_a_compaction_among_the_new_messages_starts_the_decoding_there() -> None:
    messages = opening("compacted")
    for n in range(3):
        messages = [*messages, *turn(n, "tool")]
    MESSAGES.decode(body_bytes(messages, marked=False))
    MESSAGES.decode(body_bytes([*messages, *turn(3, "tool")], marked=False))
    messages = [*messages, *turn(3, "tool"), *turn(4, "compaction")]
    later = MESSAGES.decode(body_bytes(messages, marked=False))

    assert later.encode.__self__.start == 9  # type: ignore[attr-defined]
    assert later.messages[0]["content"] == "Be careful." and later.messages[1] == {
        "role": "system", "content": "summary up to 4"}
    assert len(later.messages) == 4  # system, the compaction's summary, its text, the user's "go on"


# ------------------------------------------------------------------------------------ OpenAI Responses


def items_of(n: int, kind: str) -> list[dict[str, Any]]:
    """Codex's items: a run of the model's own (reasoning, a call) closed by the call's output, an
    assistant message and the user's answer, or the provider's compaction."""
    if kind == "compaction":
        return [{"type": "compaction", "encrypted_content": f"enc{n}"}]
    if kind == "message":
        return [{"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": f"a{n}"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"u{n}"}]}]
    return [{"type": "reasoning", "id": f"rs_{n}", "summary": [{"type": "summary_text", "text": "hmm"}]},
            {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": "shell",
             "arguments": orjson.dumps({"cmd": f"run {n}"}).decode()},
            {"type": "function_call_output", "call_id": f"call_{n}", "output": f"output {n} " * 40}]


def responses_bytes(items: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"model": "gpt-5", "instructions": "You are Codex.", "input": items, "store": False,
                         "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]})


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["call", "call", "message", "compaction"]), st.integers(0, 2)),
                min_size=2, max_size=7))
def test_a_resent_responses_history_decodes_as_from_nothing(steps: list[tuple[str, int]]) -> None:
    """Including a resend that parts from the earlier body inside a run of the model's items (its last
    items dropped before new ones): the run is decoded again from its start."""
    BODIES.clear()
    NEUTRAL.clear()
    items = [{"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": f"Fix it {len(steps)}. " + "ctx " * 2500}]}]
    for n, (kind, dropped) in enumerate(steps):
        items = [*items[:max(1, len(items) - dropped)], *items_of(n, kind)]
        raw = responses_bytes(items)
        decoded = RESPONSES.decode(raw)
        encoder = decoded.encode.__self__  # type: ignore[attr-defined]
        fresh = responses.Encoder(orjson.loads(raw), raw, None)
        assert encoder.start == fresh.start
        assert decoded.messages == fresh.neutral
        assert [encoder.origins[id(m)] for m in decoded.messages] == \
            [fresh.origins[id(m)] for m in fresh.neutral]
        assert encoder.call_owner == fresh.call_owner
        rewritten = summarized_first_tool_result(decoded.messages)
        assert decoded.encode(rewritten, decoded.messages, decoded.tools) == \
            fresh.encode(summarized_first_tool_result(fresh.neutral), fresh.neutral, fresh.body.get("tools"))


def test_only_the_new_items_are_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ctx " * 2500}]}]
    for n in range(3):
        items = [*items, *items_of(n, "call")]
    RESPONSES.decode(responses_bytes(items))
    RESPONSES.decode(responses_bytes([*items, *items_of(3, "call")]))
    seen: list[list[int]] = []
    decoded_one = responses.Encoder._decoded

    def spy(self: responses.Encoder, indexes: list[int], cache: Any) -> Any:
        seen.append(list(indexes))
        return decoded_one(self, indexes, cache)

    monkeypatch.setattr(responses.Encoder, "_decoded", spy)
    RESPONSES.decode(responses_bytes([*items, *items_of(3, "call"), *items_of(4, "call")]))

    assert seen == [[13, 14], [15]]  # the new run (reasoning, call) and its output


def _chatty_turn(session: int, n: int) -> list[dict[str, Any]]:
    """A step whose messages are many small blocks: what they decode to is mostly containers."""
    calls = [{"type": "tool_use", "id": f"toolu_{session}_{n}_{k}", "name": "read", "input": {"k": k}}
             for k in range(6)]
    results = [{"type": "tool_result", "tool_use_id": f"toolu_{session}_{n}_{k}", "content": f"r{k}"}
               for k in range(6)]
    return [{"role": "assistant", "content": calls}, {"role": "user", "content": results}]


def test_what_the_decoded_prefixes_hold_is_counted_in_the_resent_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A body's decoded prefix is counted with the body in the resent cache's budget: what dropping every
    prefix frees (measured by tracemalloc, with the neutral-message cache cleared so that only the prefixes
    hold those messages) is what was counted for them, or a little less (the codec's constant strings, a
    role or a call's type, are counted with each message)."""
    monkeypatch.setattr(BODIES, "limit_bytes", 2 * 1024 * 1024)
    tracemalloc.start()
    try:
        for session in range(40):
            messages = opening(f"s{session}")[:1]
            messages[0]["content"] = f"Task {session}: " + "context " * 600
            for n in range(12):
                messages = [*messages, *_chatty_turn(session, n)]
                MESSAGES.decode(body_bytes(messages, marked=True))
        NEUTRAL.clear()
        gc.collect()
        entries = [entry for _, entry in BODIES._order.values()]
        counted = sum(entry.derived_cost for entry in entries)
        assert BODIES.held_bytes == sum(entry.cost for entry in entries) <= BODIES.limit_bytes
        before = tracemalloc.take_snapshot()
        for entry in entries:
            entry.spans.derived = None
        gc.collect()
        # Only what proxy code allocated: a thread an earlier test left winding down (a server's) allocates
        # and frees elsewhere meanwhile, which the process's total would count.
        ours = [tracemalloc.Filter(True, str(Path(proxy.__file__).parent / "*"))]
        after = tracemalloc.take_snapshot().filter_traces(ours)
        change = after.compare_to(before.filter_traces(ours), "filename")
        freed = -sum(stat.size_diff for stat in change)
    finally:
        tracemalloc.stop()
    assert len(entries) >= 8 and counted > 0
    assert freed <= counted <= 1.2 * freed, (freed, counted)
