"""The Anthropic Messages and OpenAI Responses codecs against the chat path, over generated agent
conversations.

Each generated chat conversation is sent, request by request, as a Claude client would send it
(bench/to_messages.py, with thinking blocks and cache_control breakpoints added as Claude clients add
them), decoded by the codec, rewritten by the pipeline and encoded back (`proxy.app.rewrite`, as the
server does). Beside it the chat conversation itself runs through the pipeline with its own state.

- The codec reads back exactly the chat conversation (plus the thinking parts it counts, which a chat
  client does not send: the chat run gets them too), so the pipeline decides the same: the same forwarded
  neutral conversation, tool results replaced (by call id), exchanges evicted, gate and session state.
  Both runs get the same (native) tools list: tools are counted as one opaque list, and a different list
  would move token totals, not test the codec.
- Every encoded body is one the Messages API accepts (bench.to_messages.violations), keeps the client's
  system prompt and tools first, and keeps every thinking block and cache_control breakpoint of the blocks
  it keeps byte-identical; an unchanged request goes out as the client's bytes.
- The same for Responses (bench/to_responses.py, a stateless client such as Codex: `store: false`,
  signed `reasoning` items with `encrypted_content` before marked calls): the same decisions as chat;
  every encoded body is one the Responses API accepts (bench.to_responses.violations), keeps the
  instructions, the other fields and the client's tools first, keeps every item it keeps byte-identical
  (reasoning items with them), swaps only `output` of a replaced result, adds only developer items.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.to_messages import NO_RESULT, START, breakpoints, to_messages, violations
from bench.to_responses import is_model_item, to_responses
from bench.to_responses import violations as responses_violations
from proxy import pipeline
from proxy.app import rewrite
from proxy.errors import ContextLengthExceeded
from proxy.internal_tools import READ_TOOL_RESULT, RECALL
from proxy.pins import Pin
from proxy.policy import LoadedPolicy, Policy
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter
from proxy.wire import responses as responses_codec
from proxy.wire.messages import decode
from tests.strategies import CLIENT_TOOLS, request_prefixes, text, tool_output

ROOT = Path(__file__).resolve().parents[2]
TOKENS = TokenCounter()
MODEL = "gpt-4o"  # both runs count with the same tokenizer and window
TENANT = "tenant-a"
PROSE = ["the", "build", "step", "compiles", "module", "and", "links", "objects", "for", "target", "ok"]
# Wordy output with no identifiers: what a summary shortens (strategies' texts name ids on most lines).
prose = st.lists(st.lists(st.sampled_from(PROSE), min_size=8, max_size=12).map(" ".join),
                 min_size=40, max_size=150).map("\n".join)
SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REMINDER = "<system-reminder>\n"


def CLOCK() -> float:  # headlines carry times: a fixed clock keeps the two runs comparable
    return 1_760_000_000.0


def make_policy(window: int, threshold: int = 120) -> LoadedPolicy:
    # (no assembly deadline: a slow run must not skip a block in one of the runs compared)
    policy = Policy.model_validate({"tool_results": {"threshold_tokens": threshold},
                                    "budget": {"max_input_tokens": window}, "window": {"enabled": True},
                                    "assembly": {"time_ms": 600_000}})
    return LoadedPolicy("prop", policy, None)


# ------------------------------------------------------------------------------------ conversations

@st.composite
def agent_conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    """System, user task, then turns of assistant tool calls (with or without text) answered by tool
    results of random sizes, sometimes a user follow-up right after the results, sometimes a text answer
    and the user's next instruction. Call ids are unique (the Messages API requires it)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. " + draw(text)},
                                      {"role": "user", "content": "Task: " + draw(text)}]
    number = 0
    for _ in range(draw(st.integers(1, 8))):
        calls = []
        for _ in range(draw(st.integers(1, 2))):
            number += 1
            arguments = orjson.dumps({"path": f"src/mod_{number}.py"}).decode()  # as the codec writes them
            calls.append({"id": f"toolu_{number:03d}", "type": "function", "function": {
                "name": draw(st.sampled_from(["run", "read_file"])), "arguments": arguments}})
        said = draw(st.one_of(st.none(), text))
        messages.append({"role": "assistant", "content": said, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": draw(st.one_of(tool_output, prose))}
                     for c in calls]
        if draw(st.booleans()):
            messages.append({"role": "user", "content": "Also: " + draw(text)})
        if draw(st.booleans()):
            messages += [{"role": "assistant", "content": draw(text)},
                         {"role": "user", "content": "Next: " + draw(text)}]
    return messages


@st.composite
def claude_marks(draw: st.DrawFn, messages: list[dict[str, Any]]) -> tuple[set[str], set[str], bool]:
    """Which assistant turns carry a thinking block (by their first call id), which tool results carry a
    cache_control breakpoint (at most 3) and whether the system prompt carries one."""
    ids = [c["id"] for m in messages for c in m.get("tool_calls") or ()]
    thinking = draw(st.sets(st.sampled_from(ids))) if ids else set()
    cached = draw(st.sets(st.sampled_from(ids), max_size=3)) if ids else set()
    return thinking, cached, draw(st.booleans())


def claude_body(prefix: list[dict[str, Any]], messages: list[dict[str, Any]],
                marks: tuple[set[str], set[str], bool]) -> dict[str, Any]:
    """The request as a Claude client sends it: thinking blocks (signed) lead marked assistant turns,
    breakpoints on marked tool results and on the system prompt."""
    thinking, cached, system_mark = marks
    body = to_messages(prefix, CLIENT_TOOLS, called_in=messages)
    if system_mark and isinstance(body.get("system"), str):
        body["system"] = [{"type": "text", "text": body["system"], "cache_control": {"type": "ephemeral"}}]
    for message in body["messages"]:
        blocks = message["content"]
        uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
        if message["role"] == "assistant" and uses and uses[0] in thinking:
            blocks.insert(0, {"type": "thinking", "thinking": f"plan for {uses[0]}",
                              "signature": f"sig-{uses[0]}-EqQBCgIYAhIM"})
        for block in blocks:
            if block["type"] == "tool_result" and block["tool_use_id"] in cached:
                block["cache_control"] = {"type": "ephemeral"}
    return body


def as_decoded(prefix: list[dict[str, Any]], thinking: set[str], kind: str = "thinking",
               unsummarized: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The chat conversation as the codec must read it back: a thinking block (a reasoning item) becomes
    a part after the assistant's text (counted, never rewritten)."""
    out = []
    for message in prefix:
        calls = message.get("tool_calls") or ()
        if message["role"] == "assistant" and calls and calls[0]["id"] in thinking:
            parts = [{"type": "text", "text": message["content"]}] if message["content"] else []
            said = "" if calls[0]["id"] in unsummarized else f"plan for {calls[0]['id']}"
            message = {**message, "content": [*parts, {"type": kind, "thinking": said}]}
        out.append(message)
    return out


@st.composite
def codex_marks(draw: st.DrawFn, messages: list[dict[str, Any]]) -> tuple[set[str], set[str], bool]:
    """Which assistant turns start with a reasoning item (by their first call id), which of those carry
    no summary (only encrypted_content), and whether the client sends a prompt_cache_key."""
    ids = [c["id"] for m in messages for c in m.get("tool_calls") or ()]
    reasoning = draw(st.sets(st.sampled_from(ids))) if ids else set()
    bare_ones = draw(st.sets(st.sampled_from(sorted(reasoning)))) if reasoning else set()
    return reasoning, bare_ones, draw(st.booleans())


def reasoning_item(call_id: str, summarized: bool) -> dict[str, Any]:
    summary = [{"type": "summary_text", "text": f"plan for {call_id}"}] if summarized else []
    return {"type": "reasoning", "id": f"rs_{call_id}", "summary": summary,
            "encrypted_content": f"gAAAAB{call_id}-opaque-" + "x" * 40}


def codex_body(prefix: list[dict[str, Any]], messages: list[dict[str, Any]],
               marks: tuple[set[str], set[str], bool]) -> dict[str, Any]:
    """The request as a stateless Responses client sends it: a signed reasoning item leads each marked
    turn (before its text and calls), the encrypted content asked back, a cache key per conversation."""
    reasoning, bare_ones, cache_key = marks
    body = to_responses(prefix, CLIENT_TOOLS, called_in=messages, model=MODEL)
    items: list[dict[str, Any]] = []
    source = body["input"]
    for index, item in enumerate(source):
        if is_model_item(item) and not (items and is_model_item(items[-1])):  # a turn starts
            turn = source[index:]
            end = next((k for k, later in enumerate(turn) if not is_model_item(later)), len(turn))
            first = next((i["call_id"] for i in turn[:end] if i.get("type") == "function_call"), None)
            if first in reasoning:
                items.append(reasoning_item(first, first not in bare_ones))
        items.append(item)
    body["input"] = items
    body["include"] = ["reasoning.encrypted_content"]
    if cache_key:
        body["prompt_cache_key"] = "conv-0001"
    return body


def response_origins(body: dict[str, Any]) -> list[tuple[int, tuple[int, ...]]]:
    """Independently of the codec: the input items each neutral message comes from, in order (-1: the
    instructions); a run of the model's own items is one message."""
    found: list[tuple[int, tuple[int, ...]]] = [(-1, ())] if body.get("instructions") else []
    run: list[int] = []
    for k, item in enumerate(body["input"]):
        if is_model_item(item):
            run.append(k)
            continue
        if run:
            found.append((run[0], tuple(run)))
            run = []
        found.append((k, (k,)))
    if run:
        found.append((run[0], tuple(run)))
    return found


def origins(body: dict[str, Any]) -> list[tuple[int, tuple[int, ...]]]:
    """Independently of the codec: the native (message, blocks) each neutral message comes from, in
    order (the system prompt is message -1)."""
    found: list[tuple[int, tuple[int, ...]]] = [(-1, ())] if body.get("system") else []
    for k, message in enumerate(body["messages"]):
        blocks = message["content"]
        if message["role"] == "assistant":
            found.append((k, tuple(range(len(blocks)))))
            continue
        run: list[int] = []
        for index, block in enumerate(blocks):
            if block["type"] == "tool_result":
                if run:
                    found.append((k, tuple(run)))
                    run = []
                found.append((k, (index,)))
            else:
                run.append(index)
        if run:
            found.append((k, tuple(run)))
    return found


# ------------------------------------------------------------------------------------------ checks

def decisions(outcome: pipeline.Outcome, client: list[dict[str, Any]], store: StateStore) -> dict[str, Any]:
    """What the pipeline decided, in terms both runs share (positions in the client's list, call ids)."""
    position = {id(m): i for i, m in enumerate(client)}
    original = outcome.original or client
    replaced = {(sent["tool_call_id"], sent["content"]) for before, sent in zip(original, outcome.messages,
                                                                               strict=True)
                if before.get("role") == "tool" and before is not sent and before != sent}
    state = store.get(TENANT, "s1")
    return {
        "gate": outcome.gate, "tokens": (outcome.tokens_before, outcome.tokens_after),
        "kept": sorted(position[id(m)] for m in original if id(m) in position),
        "replaced": replaced,
        "evicted": [(headline, messages) for headline, messages in outcome.evicted],
        "handles": {h: (r.call_id, r.kind, r.replacement) for h, r in state.by_handle.items()},
        "warned": set(state.warned), "cut": state.window.cut, "headlines": list(state.window.headlines),
        "tools": [spec.get("name") or spec["function"]["name"] for spec in outcome.tools or ()],
    }


def bare(block: dict[str, Any]) -> bytes:
    return orjson.dumps({k: v for k, v in block.items() if k != "cache_control"})


def same(sent: dict[str, Any], client: dict[str, Any], anchored: list[dict[str, Any]]) -> bool:
    """`sent` is the client's block byte for byte, or with a re-anchored breakpoint added (noted)."""
    if orjson.dumps(sent) == orjson.dumps(client):
        return True
    if "cache_control" in sent and "cache_control" not in client and bare(sent) == orjson.dumps(client):
        anchored.append(sent)
        return True
    return False


def check_encoded(body: dict[str, Any], sent: dict[str, Any], decoded_messages: list[dict[str, Any]],
                  outcome: pipeline.Outcome) -> None:
    """The encoded body: valid, the client's system and tools first, kept blocks byte-identical (thinking
    and breakpoints with them), replaced tool results carrying the pipeline's text."""
    assert violations(sent) == []
    assert breakpoints(sent) <= 4
    # system prompt first and unchanged (pinned blocks may follow it)
    if isinstance(body.get("system"), list):
        assert sent["system"][:len(body["system"])] == body["system"]
    elif body.get("system"):
        assert sent["system"] == body["system"] or sent["system"][0]["text"] == body["system"]
    # the client's tools unchanged and first; ours, in native form, after them
    assert sent.get("tools", [])[:len(body.get("tools") or [])] == (body.get("tools") or [])
    ours = [t["name"] for t in sent.get("tools", [])[len(body.get("tools") or []):]]
    assert ours in ([], [READ_TOOL_RESULT, RECALL])
    assert all("input_schema" in t for t in sent.get("tools", []))

    where = origins(body)
    assert len(where) == len(decoded_messages)
    original = outcome.original or decoded_messages
    forwarded_by_id = {id(before): after for before, after in zip(original, outcome.messages, strict=True)}
    out_blocks = [(n, b) for n, m in enumerate(sent["messages"]) for b in m["content"]]
    out_results = {b["tool_use_id"]: n for n, b in out_blocks if b["type"] == "tool_result"}
    kept_natives: dict[int, bool] = {}
    evicted_marks = 0  # breakpoints on blocks that left the prompt: one may be re-anchored
    anchored: list[dict[str, Any]] = []  # kept blocks that got a breakpoint they did not have
    home: dict[int, int] = {}  # native message -> the output message its kept blocks went to
    at = 0  # kept blocks appear in the output in the client's order
    for neutral, (k, indexes) in zip(decoded_messages, where, strict=True):
        if k < 0:
            continue
        after = forwarded_by_id.get(id(neutral))
        unchanged = after is not None and after == neutral
        kept_natives[k] = kept_natives.get(k, True) and unchanged
        native_blocks = [body["messages"][k]["content"][i] for i in indexes]
        if after is None:  # evicted: none of its results remains
            assert not {b.get("tool_use_id") for b in native_blocks} & out_results.keys()
            evicted_marks += sum(1 for b in native_blocks if b.get("cache_control"))
            continue
        if neutral.get("role") == "tool" and not unchanged:  # replaced: only `content` differs
            n = out_results[neutral["tool_call_id"]]
            block = next(b for m, b in out_blocks
                         if m == n and b.get("tool_use_id") == neutral["tool_call_id"])
            assert block["content"] == after["content"]
            assert {key: v for key, v in block.items() if key != "content"} == \
                {key: v for key, v in native_blocks[0].items() if key != "content"}
            assert home.setdefault(k, n) == n
            continue
        assert unchanged
        for block in native_blocks:  # byte-identical, in order, all in one output message
            while at < len(out_blocks) and not same(out_blocks[at][1], block, anchored):
                at += 1
            assert at < len(out_blocks), f"kept block missing or out of order: {block}"
            assert home.setdefault(k, out_blocks[at][0]) == out_blocks[at][0]
            at += 1
    # a native message kept whole, with nothing merged into it, is the client's message byte for byte
    # (assistant turns always: thinking blocks and signatures intact)
    for k, kept in kept_natives.items():
        native = body["messages"][k]
        if kept and native["role"] == "assistant":
            assert any(len(m["content"]) == len(native["content"]) and all(
                same(a, b, []) for a, b in zip(m["content"], native["content"], strict=True))
                for m in sent["messages"])
    # the only change to a kept block: one breakpoint moved from an evicted block onto the block before
    # the gap (re-anchored), never over the limit
    assert len(anchored) <= 1 and (not anchored or evicted_marks)
    # nothing else appears: blocks are the client's, replaced results, our reminders, our splices
    known = {bare(b) for m in body["messages"] for b in m["content"]}
    for _, block in out_blocks:
        if bare(block) in known or block["type"] == "tool_result":
            continue
        assert block["type"] == "text" and block["text"].startswith(REMINDER), block
    # thinking blocks: each one sent is the client's, byte-identical
    thinking = {orjson.dumps(b) for m in body["messages"] for b in m["content"] if b["type"] == "thinking"}
    assert all(orjson.dumps(b) in thinking for _, b in out_blocks if b["type"] == "thinking")


def check_encoded_responses(body: dict[str, Any], sent: dict[str, Any],
                            decoded_messages: list[dict[str, Any]], outcome: pipeline.Outcome) -> None:
    """The encoded Responses body: valid, the same instructions and other fields, the client's tools first,
    kept items byte-identical and in order (reasoning with them), a replaced output differing only in
    `output`, nothing added but developer items carrying the pipeline's blocks."""
    assert responses_violations(sent) == []
    assert {k: v for k, v in sent.items() if k not in ("input", "tools")} == \
        {k: v for k, v in body.items() if k not in ("input", "tools")}  # instructions, include, store...
    client_tools = body.get("tools") or []
    assert sent.get("tools", [])[:len(client_tools)] == client_tools
    ours = sent.get("tools", [])[len(client_tools):]
    assert [t["name"] for t in ours] in ([], [READ_TOOL_RESULT, RECALL])
    assert all(t["type"] == "function" and "parameters" in t for t in ours)

    where = response_origins(body)
    assert len(where) == len(decoded_messages)
    original = outcome.original or decoded_messages
    forwarded_by_id = {id(before): after for before, after in zip(original, outcome.messages, strict=True)}
    items = sent["input"]
    sent_ids = {i.get("call_id") or i.get("id") for i in items}
    known = {orjson.dumps(i) for i in body["input"]}
    at = 0  # kept items appear in the output in the client's order
    for neutral, (k, indexes) in zip(decoded_messages, where, strict=True):
        if k < 0:
            continue
        natives = [body["input"][i] for i in indexes]
        after = forwarded_by_id.get(id(neutral))
        if after is None:  # evicted: none of its calls, outputs or reasoning remains
            assert not {n.get("call_id") or n.get("id") for n in natives} - {None} & sent_ids
            continue
        if after != neutral:  # replaced (a tool result, a user observation): only its text differs
            assert neutral["role"] in ("tool", "user") and len(natives) == 1
            natives = [{**natives[0], "output" if neutral["role"] == "tool" else "content": after["content"]}]
            known.add(orjson.dumps(natives[0]))
        for native in natives:  # byte-identical, in order
            while at < len(items) and orjson.dumps(items[at]) != orjson.dumps(native):
                at += 1
            assert at < len(items), f"kept item missing or out of order: {native}"
            at += 1
    # nothing else appears: the client's items, replaced ones, and our blocks as developer items
    made = {str(m.get("content")) for m in outcome.messages if id(m) not in forwarded_by_id
            or forwarded_by_id[id(m)] is not m}
    for item in items:
        if orjson.dumps(item) in known:
            continue
        assert item["type"] == "message" and item["role"] == "developer", item
        assert [p["type"] for p in item["content"]] == ["input_text"]
        assert item["content"][0]["text"] in made | {str(m.get("content")) for m in outcome.messages}
    # reasoning items: each one sent is the client's, byte-identical, with the item it led to after it
    assert all(orjson.dumps(i) in known for i in items if i.get("type") == "reasoning")


CODECS = {"messages": (claude_body, decode, "thinking", check_encoded),
          "responses": (codex_body, responses_codec.decode, "reasoning", check_encoded_responses)}


def replay_both(messages: list[dict[str, Any]], window: int, marks: tuple[set[str], set[str], bool],
                pins: bool = False, fmt: str = "messages",
                ) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """Every request of the conversation through both paths (chat, and the wire format `fmt` through its
    codec); returns the decisions of each request."""
    build, decode_native, part, check = CODECS[fmt]
    unsummarized = frozenset(marks[1]) if fmt == "responses" else frozenset()
    policy = make_policy(window)
    chat_store, native_store = StateStore(), StateStore()
    session = Session("s1", "header")
    pinned = (lambda: [Pin("p1", "rules", "Always run the tests before you answer.", 12)]) if pins else None
    found = []
    for prefix in request_prefixes(messages):
        body = build(prefix, messages, marks)
        raw = orjson.dumps(body)
        decoded = decode_native(raw)
        expected = as_decoded(prefix, marks[0], part, unsummarized)
        assert decoded.messages == expected  # the codec reads back exactly the chat conversation
        chat_context = pipeline.PipelineContext(policy, session, TENANT, TOKENS, chat_store, now=CLOCK,
                                                pins=pinned)
        native_context = pipeline.PipelineContext(policy, session, TENANT, TOKENS, native_store,
                                                  now=CLOCK, pins=pinned)
        chat_messages = copy.deepcopy(expected)
        try:
            chat = pipeline.run(pipeline.Conversation(MODEL, chat_messages, decoded.tools), chat_context)
        except ContextLengthExceeded:
            chat = None
        try:
            outcome, content, _ = rewrite(pipeline.Conversation(MODEL, decoded.messages, decoded.tools),
                                          native_context, decoded)
        except ContextLengthExceeded:
            assert chat is None, f"the {fmt} run refused where the chat run did not"
            found.append((None, None))
            continue
        assert chat is not None, f"the chat run refused where the {fmt} run did not"
        assert not outcome.unrewritten, "the codec refused the rewrite"
        assert outcome.messages == chat.messages  # the same forwarded neutral conversation
        chat_decisions = decisions(chat, chat_messages, chat_store)
        native_decisions = decisions(outcome, decoded.messages, native_store)
        assert native_decisions == chat_decisions
        check(body, orjson.loads(content), decoded.messages, outcome)
        # an unchanged request goes out as the client's bytes; a changed one never falls back to them
        assert (content is raw) == (not outcome.changed)
        found.append((chat_decisions, native_decisions))
    return found


# ------------------------------------------------------------------------------------------- tests

@SETTINGS
@given(data=st.data(), messages=agent_conversation(), window=st.sampled_from([1500, 4000, 128_000]),
       pins=st.booleans())
def test_messages_codec_decides_like_chat_and_encodes_valid_bodies(data: st.DataObject,
                                                                   messages: list[dict[str, Any]],
                                                                   window: int, pins: bool) -> None:
    replay_both(messages, window, data.draw(claude_marks(messages)), pins)


@SETTINGS
@given(data=st.data(), messages=agent_conversation(), window=st.sampled_from([1500, 4000, 128_000]),
       pins=st.booleans())
def test_responses_codec_decides_like_chat_and_encodes_valid_bodies(data: st.DataObject,
                                                                    messages: list[dict[str, Any]],
                                                                    window: int, pins: bool) -> None:
    replay_both(messages, window, data.draw(codex_marks(messages)), pins, fmt="responses")


def heavy_conversation() -> list[dict[str, Any]]:
    """Summaries, pruning placeholders and evictions all happen in this one at an 8,000-token window:
    ten build logs (identifiers on every line: pruned, then evicted) and a last, wordy one (summarized)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."},
                                      {"role": "user", "content": "Fix the build of service ORD-7."}]
    for k in range(10):
        call = {"id": f"toolu_{k:02d}", "type": "function",
                "function": {"name": "run", "arguments": orjson.dumps({"cmd": f"make step{k}"}).decode()}}
        log = "\n".join(f"{i:04d} compile src/pkg{k}/mod_{i}.py -> build/obj_{k}_{i}.o in {i * 7 % 97} ms "
                        f"status={'ok' if i % 13 else f'FAILED code={i}'}" for i in range(60))
        messages += [{"role": "assistant", "content": "I will run the build now. " * 8, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": log},
                     {"role": "user", "content": f"step {k} done, next"}]
    words = ["the", "build", "step", "compiles", "module", "and", "links", "objects", "for", "target", "ok"]
    messages[-2] = {**messages[-2], "content": "\n".join(
        " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(10)) for i in range(100))}
    return messages


def test_summaries_masking_and_eviction_all_happen_and_stay_valid() -> None:
    messages = heavy_conversation()
    ids = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
    results = replay_both(messages, 8000, (ids, {"toolu_08", "toolu_09"}, True), pins=True)
    done = [d for d, _ in results if d is not None]
    assert len(done) == len(results)
    kinds = {kind for d in done for _, kind, _ in d["handles"].values()}
    assert kinds >= {"summary", "placeholder", "evicted"}
    assert any(d["evicted"] for d in done) and done[-1]["headlines"]
    assert {d["gate"] for d in done} >= {"pass", "prune"}
    assert done[-1]["tools"][-2:] == [READ_TOOL_RESULT, RECALL]


def test_responses_summaries_masking_and_eviction_all_happen_and_stay_valid() -> None:
    """The same in Responses, a reasoning item (two with encrypted content only) before every call."""
    messages = heavy_conversation()
    ids = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
    results = replay_both(messages, 8000, (ids, {"toolu_08", "toolu_09"}, True), pins=True, fmt="responses")
    done = [d for d, _ in results if d is not None]
    assert len(done) == len(results)
    kinds = {kind for d in done for _, kind, _ in d["handles"].values()}
    assert kinds >= {"summary", "placeholder", "evicted"}
    assert any(d["evicted"] for d in done) and done[-1]["headlines"]
    assert {d["gate"] for d in done} >= {"pass", "prune"}
    assert done[-1]["tools"][-2:] == [READ_TOOL_RESULT, RECALL]


@pytest.mark.parametrize("fmt", ["messages", "responses"])
def test_unchanged_request_is_forwarded_as_the_clients_bytes(fmt: str) -> None:
    prefix = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "hello"}]
    raw = orjson.dumps(to_messages(prefix) if fmt == "messages" else to_responses(prefix, CLIENT_TOOLS))
    decoded = CODECS[fmt][1](raw)
    assert decoded.encode(decoded.messages, decoded.messages, decoded.tools) is raw
    context = pipeline.PipelineContext(make_policy(128_000), Session("s1", "header"), TENANT, TOKENS,
                                       StateStore(), now=CLOCK)
    outcome, content, _ = rewrite(pipeline.Conversation(MODEL, decoded.messages, decoded.tools), context,
                                  decoded)
    assert not outcome.changed and content is raw


# ------------------------------------------------------------------------------- the converter itself

def test_converter_alternates_merges_and_pairs() -> None:
    call = {"id": "call.1", "type": "function", "function": {"name": "grep", "arguments": "not json"}}
    again = {"id": "call.1", "type": "function", "function": {"name": "grep", "arguments": '["x"]'}}
    chat = [{"role": "system", "content": "s1"}, {"role": "system", "content": "s2"},
            {"role": "assistant", "content": "Hi", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call.1", "content": "r1"},
            {"role": "user", "content": "more"}, {"role": "user", "content": "and more"},
            {"role": "assistant", "content": None, "tool_calls": [again]},
            {"role": "assistant", "content": ""},
            {"role": "tool", "tool_call_id": "nobody", "content": "stray"}]
    body = to_messages(chat)
    assert body["system"] == "s1\n\ns2" and body["model"] == "claude-sonnet-4-5"
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert body["messages"][0]["content"] == [{"type": "text", "text": START}]
    assert body["messages"][1]["content"][1] == {"type": "tool_use", "id": "call_1", "name": "grep",
                                                 "input": {"raw": "not json"}}
    assert [b.get("text") or b.get("content") for b in body["messages"][2]["content"]] == \
        ["r1", "more", "and more"]
    assert body["messages"][3]["content"] == [{"type": "tool_use", "id": "call_1_2", "name": "grep",
                                               "input": {"raw": '["x"]'}}]
    assert body["messages"][4]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1_2", "content": NO_RESULT},
        {"type": "text", "text": "[tool result nobody] stray"}]
    assert body["tools"] == [{"name": "grep", "description": "", "input_schema": {"type": "object"}}]
    assert violations(body) == []
    assert orjson.dumps(to_messages(chat)) == orjson.dumps(body)  # deterministic


USE = {"type": "tool_use", "id": "t", "name": "f", "input": {}}


@pytest.mark.parametrize(("body", "expected"), [
    ({"messages": [{"role": "assistant", "content": "x"}]}, "the first turn is assistant"),
    ({"messages": [{"role": "user", "content": "a"},
                   {"role": "assistant", "content": [USE]},
                   {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]},
     "no tool_result for ['t']"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                {"type": "tool_result", "tool_use_id": "t"}]}]},
     "after other content"),
    ({"messages": [{"role": "user", "content": "a"},
                   {"role": "assistant", "content": [USE]},
                   {"role": "user", "content": "b"}]}, "no tool_result for ['t']"),
    ({"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}] * 5,
      "messages": [{"role": "user", "content": "a"}]}, "5 cache_control breakpoints"),
])
def test_violations_name_what_the_api_rejects(body: dict[str, Any], expected: str) -> None:
    assert any(expected in line for line in violations(body)), violations(body)


def test_responses_converter_maps_items_and_pairs() -> None:
    call = {"id": "call.1", "type": "function", "function": {"name": "grep", "arguments": "not json"}}
    again = {"id": "call.1", "type": "function", "function": {"name": "grep", "arguments": {"q": "x"}}}
    picture = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    chat = [{"role": "system", "content": "s1"}, {"role": "system", "content": "s2"},
            {"role": "assistant", "content": "Hi", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call.1", "content": "r1"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, picture]},
            {"role": "system", "content": "be brief"},
            {"role": "assistant", "content": None, "tool_calls": [again]},
            {"role": "assistant", "content": ""},
            {"role": "tool", "tool_call_id": "nobody", "content": "stray"}]
    body = to_responses(chat, model="gpt-4o")
    assert body["instructions"] == "s1\n\ns2" and body["model"] == "gpt-4o" and body["store"] is False
    assert body["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": START}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]},
        {"type": "function_call", "call_id": "call.1", "name": "grep", "arguments": "not json"},
        {"type": "function_call_output", "call_id": "call.1", "output": "r1"},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"}]},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {"type": "function_call", "call_id": "call.1_2", "name": "grep", "arguments": '{"q":"x"}'},
        {"type": "function_call_output", "call_id": "call.1_2", "output": NO_RESULT},
        {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                          "text": "[tool result nobody] stray"}]}]
    assert body["tools"] == [{"type": "function", "name": "grep", "description": "",
                              "parameters": {"type": "object"}}]
    assert responses_violations(body) == []
    assert orjson.dumps(to_responses(chat, model="gpt-4o")) == orjson.dumps(body)  # deterministic
    tools = to_responses([*chat[:2], {"role": "user", "content": "x"}], CLIENT_TOOLS)["tools"]
    assert tools == [{"type": "function", "name": n, "description": "", "parameters": {"type": "object"}}
                     for n in ("run", "read_file")]
    decoded = responses_codec.decode(orjson.dumps(body))
    assert [m["role"] for m in decoded.messages] == ["system", "user", "assistant", "tool", "user", "system",
                                                    "assistant", "tool", "user"]


def _item(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, **fields}


USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]}
CALL = _item("function_call", call_id="c1", name="f", arguments="{}")
OUTPUT = _item("function_call_output", call_id="c1", output="r")
THOUGHT = _item("reasoning", id="rs_1", summary=[], encrypted_content="E")


@pytest.mark.parametrize(("items", "expected"), [
    ([], "input: missing or empty"),
    ([USER, CALL], "calls ['c1'] have no output"),
    ([USER, OUTPUT], "which no earlier call"),
    ([USER, OUTPUT, CALL], "which no earlier call"),
    ([USER, CALL, OUTPUT, OUTPUT], "answered twice"),
    ([USER, CALL, OUTPUT, CALL, OUTPUT], "call_id c1 used twice"),
    ([USER, CALL, OUTPUT, THOUGHT], "without the item it led to"),
    ([USER, THOUGHT, USER], "without the item it led to"),
    ([USER, THOUGHT, {**THOUGHT, "id": "rs_2"}, USER], "without the item it led to"),
    ([USER, THOUGHT, THOUGHT, CALL, OUTPUT], "item id rs_1 used twice"),
    ([USER, _item("custom_tool_call", call_id="c1", name="p", input="x"), OUTPUT], "which no earlier call"),
    ([{"type": "message", "role": "developer", "content": [{"type": "output_text", "text": "x"}]}],
     "part type 'output_text' in a developer message"),
    ([{"type": "message", "role": "tool", "content": "x"}], "role 'tool'"),
])
def test_responses_violations_name_what_the_api_rejects(items: list[dict[str, Any]], expected: str) -> None:
    found = responses_violations({"model": "m", "input": items})
    assert any(expected in line for line in found), found
    assert responses_violations({"model": "m", "input": [USER, THOUGHT, CALL, OUTPUT]}) == []


# ----------------------------------------------------------- the benchmarks in Messages and Responses format

def bench_conversation() -> dict[str, Any]:
    """A trace-shaped conversation: a big early result (summarized), later ones, a final answer that
    reuses its identifiers (needles)."""
    messages = heavy_conversation()[:8]
    messages[3] = {**messages[3], "content": messages[3]["content"] + "\nITEM00007 is in data/part7.csv"}
    messages.append({"role": "assistant", "content": "Done: ITEM00007 in data/part7.csv fixed."})
    return {"id": "m1", "model": "gpt-4o", "messages": messages, "tools": CLIENT_TOOLS, "meta": {}}


@pytest.mark.parametrize("fmt", ["messages", "responses"])
def test_replay_in_another_format_matches_chat(tmp_path: Path, fmt: str) -> None:
    from bench.format_run import FORMATS
    from bench.format_run import replay_files as replay_native
    from bench.replay import with_window
    from proxy.policy import PolicyStore
    from proxy.replay import replay_files

    (tmp_path / "fixture_dev.jsonl").write_bytes(orjson.dumps(bench_conversation()) + b"\n")
    policy = with_window(PolicyStore(ROOT / "policies").get("default"), 2000)
    chat = replay_files([tmp_path / "fixture_dev.jsonl"], policy, model=MODEL)["overall"]
    native = replay_native([tmp_path / "fixture_dev.jsonl"], policy, model=MODEL, fmt=FORMATS[fmt])["overall"]
    assert native["codec_checked"] == native["requests"] == chat["requests"] == 3
    assert native["codec_violations"] == 0 and native["recoverable"] == 1.0
    assert native["gates"] == chat["gates"] and native["replaced"] == chat["replaced"] > 0
    assert abs(native["token_ratio"] - chat["token_ratio"]) < 0.02


def test_retention_cli_all_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench import retention

    (tmp_path / "fixture_dev.jsonl").write_bytes(orjson.dumps(bench_conversation()) + b"\n")
    retention.main(["--traces", str(tmp_path), "--windows", "4000", "--policies", "default",
                    "--workers", "1", "--format", "all", "--json"])
    overall = orjson.loads(capsys.readouterr().out)["windows"]["4000"]["overall"]
    assert list(overall) == ["ctxproxy:default", "ctxproxy:default/messages", "ctxproxy:default/responses",
                             "passthrough", "truncation", "masking"]
    chat = overall["ctxproxy:default"]
    assert "codec_violations" not in chat
    for fmt in ("messages", "responses"):
        native = overall[f"ctxproxy:default/{fmt}"]
        assert native["codec_violations"] == 0
        assert native["codec_checked"] == native["requests"] == chat["requests"]
        for key in ("needles", "needles_in_prompt", "needles_reachable", "replaced", "read_back", "errors"):
            assert native[key] == chat[key], (fmt, key)
        assert native["replaced"] == 2 and native["needles_reachable"] == 1.0  # summarized, read back
    retention.main(["--traces", str(tmp_path), "--windows", "4000", "--policies", "default",
                    "--workers", "1", "--format", "all"])
    table = capsys.readouterr().out
    assert "default by wire format (chat / messages / responses)" in table
    assert "| **overall** |" in table and "| 0 / 0 |" in table


@pytest.mark.parametrize("fmt", ["messages", "responses"])
def test_client_tool_named_like_ours_is_not_offered_twice(fmt: str) -> None:
    """A native tool (Anthropic's or Responses' flat shape) named like one of ours: ours are not added
    (names must be unique upstream, and the client's own calls must reach the client)."""
    prefix = heavy_conversation()[:8]  # a summarized result: the internal tools would be offered
    tools = [{"type": "function", "function": {"name": RECALL, "parameters": {"type": "object"}}}]
    raw = orjson.dumps(to_messages(prefix, tools) if fmt == "messages" else to_responses(prefix, tools))
    decoded = CODECS[fmt][1](raw)
    context = pipeline.PipelineContext(make_policy(4000), Session("s1", "header"), TENANT, TOKENS,
                                       StateStore(), now=CLOCK)
    outcome, content, _ = rewrite(pipeline.Conversation(MODEL, decoded.messages, decoded.tools), context,
                                  decoded)
    sent = orjson.loads(content)
    assert not outcome.unrewritten
    # before 76a3bef: "tools: names ['recall'] defined twice"
    assert (violations(sent) if fmt == "messages" else responses_violations(sent)) == []
    assert [t["name"] for t in sent["tools"]] == [RECALL]
