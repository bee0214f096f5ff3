"""The Anthropic Messages codec against the chat path, over generated agent conversations.

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
from proxy import pipeline
from proxy.app import rewrite
from proxy.errors import ContextLengthExceeded
from proxy.internal_tools import READ_TOOL_RESULT, RECALL
from proxy.pins import Pin
from proxy.policy import LoadedPolicy, Policy
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter
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
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REMINDER = "<system-reminder>\n"


def CLOCK() -> float:  # headlines carry times: a fixed clock keeps the two runs comparable
    return 1_760_000_000.0


def make_policy(window: int, threshold: int = 120) -> LoadedPolicy:
    policy = Policy.model_validate({"tool_results": {"threshold_tokens": threshold},
                                    "budget": {"max_input_tokens": window}, "window": {"enabled": True}})
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


def as_decoded(prefix: list[dict[str, Any]], thinking: set[str]) -> list[dict[str, Any]]:
    """The chat conversation as the codec must read it back: a thinking block becomes a part after the
    assistant's text (counted, never rewritten)."""
    out = []
    for message in prefix:
        calls = message.get("tool_calls") or ()
        if message["role"] == "assistant" and calls and calls[0]["id"] in thinking:
            parts = [{"type": "text", "text": message["content"]}] if message["content"] else []
            message = {**message, "content": [*parts, {"type": "thinking",
                                                       "thinking": f"plan for {calls[0]['id']}"}]}
        out.append(message)
    return out


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


def replay_both(messages: list[dict[str, Any]], window: int, marks: tuple[set[str], set[str], bool],
                pins: bool = False) -> list[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """Every request of the conversation through both paths; returns the decisions of each request."""
    policy = make_policy(window)
    chat_store, messages_store = StateStore(), StateStore()
    session = Session("s1", "header")
    pinned = (lambda: [Pin("p1", "rules", "Always run the tests before you answer.", 12)]) if pins else None
    found = []
    for prefix in request_prefixes(messages):
        body = claude_body(prefix, messages, marks)
        raw = orjson.dumps(body)
        decoded = decode(raw)
        expected = as_decoded(prefix, marks[0])
        assert decoded.messages == expected  # the codec reads back exactly the chat conversation
        chat_context = pipeline.PipelineContext(policy, session, TENANT, TOKENS, chat_store, now=CLOCK,
                                                pins=pinned)
        messages_context = pipeline.PipelineContext(policy, session, TENANT, TOKENS, messages_store,
                                                    now=CLOCK, pins=pinned)
        chat_messages = copy.deepcopy(expected)
        try:
            chat = pipeline.run(pipeline.Conversation(MODEL, chat_messages, decoded.tools), chat_context)
        except ContextLengthExceeded:
            chat = None
        try:
            outcome, content, _ = rewrite(pipeline.Conversation(MODEL, decoded.messages, decoded.tools),
                                          messages_context, decoded)
        except ContextLengthExceeded:
            assert chat is None, "the messages run refused where the chat run did not"
            found.append((None, None))
            continue
        assert chat is not None, "the chat run refused where the messages run did not"
        assert outcome.messages == chat.messages  # the same forwarded neutral conversation
        chat_decisions = decisions(chat, chat_messages, chat_store)
        messages_decisions = decisions(outcome, decoded.messages, messages_store)
        assert messages_decisions == chat_decisions
        check_encoded(body, orjson.loads(content), decoded.messages, outcome)
        # an unchanged request goes out as the client's bytes; a changed one never falls back to them
        assert (content is raw) == (not outcome.changed)
        found.append((chat_decisions, messages_decisions))
    return found


# ------------------------------------------------------------------------------------------- tests

@SETTINGS
@given(data=st.data(), messages=agent_conversation(), window=st.sampled_from([1500, 4000, 128_000]),
       pins=st.booleans())
def test_messages_codec_decides_like_chat_and_encodes_valid_bodies(data: st.DataObject,
                                                                   messages: list[dict[str, Any]],
                                                                   window: int, pins: bool) -> None:
    replay_both(messages, window, data.draw(claude_marks(messages)), pins)


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


def test_unchanged_request_is_forwarded_as_the_clients_bytes() -> None:
    prefix = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "hello"}]
    raw = orjson.dumps(to_messages(prefix))
    decoded = decode(raw)
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


# ----------------------------------------------------------------- the benchmarks in Messages format

def bench_conversation() -> dict[str, Any]:
    """A trace-shaped conversation: a big early result (summarized), later ones, a final answer that
    reuses its identifiers (needles)."""
    messages = heavy_conversation()[:8]
    messages[3] = {**messages[3], "content": messages[3]["content"] + "\nITEM00007 is in data/part7.csv"}
    messages.append({"role": "assistant", "content": "Done: ITEM00007 in data/part7.csv fixed."})
    return {"id": "m1", "model": "gpt-4o", "messages": messages, "tools": CLIENT_TOOLS, "meta": {}}


def test_replay_in_messages_format_matches_chat(tmp_path: Path) -> None:
    from bench.messages_run import replay_files as replay_messages
    from bench.replay import with_window
    from proxy.policy import PolicyStore
    from proxy.replay import replay_files

    (tmp_path / "fixture_dev.jsonl").write_bytes(orjson.dumps(bench_conversation()) + b"\n")
    policy = with_window(PolicyStore(ROOT / "policies").get("default"), 2000)
    chat = replay_files([tmp_path / "fixture_dev.jsonl"], policy, model=MODEL)["overall"]
    messages = replay_messages([tmp_path / "fixture_dev.jsonl"], policy, model=MODEL)["overall"]
    assert messages["codec_checked"] == messages["requests"] == chat["requests"] == 3
    assert messages["codec_violations"] == 0 and messages["recoverable"] == 1.0
    assert messages["gates"] == chat["gates"] and messages["replaced"] == chat["replaced"] > 0
    assert abs(messages["token_ratio"] - chat["token_ratio"]) < 0.02


def test_retention_cli_both_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench import retention

    (tmp_path / "fixture_dev.jsonl").write_bytes(orjson.dumps(bench_conversation()) + b"\n")
    retention.main(["--traces", str(tmp_path), "--windows", "4000", "--policies", "default",
                    "--workers", "1", "--format", "both", "--json"])
    overall = orjson.loads(capsys.readouterr().out)["windows"]["4000"]["overall"]
    assert list(overall) == ["ctxproxy:default", "ctxproxy:default/messages", "passthrough", "truncation",
                             "masking"]
    chat, messages = overall["ctxproxy:default"], overall["ctxproxy:default/messages"]
    assert "codec_violations" not in chat and messages["codec_violations"] == 0
    assert messages["codec_checked"] == messages["requests"] == chat["requests"]
    for key in ("needles", "needles_in_prompt", "needles_reachable", "replaced", "read_back", "errors"):
        assert messages[key] == chat[key], key
    assert messages["replaced"] == 2 and messages["needles_reachable"] == 1.0  # summarized, read back


def test_client_tool_named_like_ours_is_not_offered_twice() -> None:
    """An Anthropic tool named like one of ours: ours are not added (names must be unique upstream, and
    the client's own calls must reach the client)."""
    prefix = heavy_conversation()[:8]  # a summarized result: the internal tools would be offered
    tools = [{"type": "function", "function": {"name": RECALL, "parameters": {"type": "object"}}}]
    raw = orjson.dumps(to_messages(prefix, tools))
    decoded = decode(raw)
    context = pipeline.PipelineContext(make_policy(4000), Session("s1", "header"), TENANT, TOKENS,
                                       StateStore(), now=CLOCK)
    _, content, _ = rewrite(pipeline.Conversation(MODEL, decoded.messages, decoded.tools), context, decoded)
    sent = orjson.loads(content)
    assert violations(sent) == []  # before 76a3bef: "tools: names ['recall'] defined twice"
    assert [t["name"] for t in sent["tools"]] == [RECALL]
