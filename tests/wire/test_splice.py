"""A rewritten body from the client's own bytes (proxy/wire/splice.py): whatever the forwarded array holds,
the body says what a full serialization says, and the client's unchanged messages are its own bytes."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.validate import parse_chat_body
from proxy.wire.chat import CHAT
from proxy.wire.json_layout import layout_of
from proxy.wire.messages import Encoder as MessagesEncoder
from proxy.wire.messages_check import validate_messages_request
from proxy.wire.resent import ResentBodies
from proxy.wire.responses import Encoder as ResponsesEncoder
from proxy.wire.responses_check import validate_responses_request
from proxy.wire.splice import Spans, spliced_body
from tests.strategies import dump_styled as dump
from tests.strategies import json_styles as styles

tricky_text = st.lists(st.sampled_from([*'ab "\\{}[]:,\n\té€😀', '"messages":[', "\x00ctxproxy"]),
                       max_size=20).map("".join)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": tricky_text},
    optional={"n": st.integers(min_value=-(2**63), max_value=2**64 - 1),
              "extra": st.lists(tricky_text, max_size=2)})


def spans_of(raw: bytes, count: int, key: str = "messages") -> Spans:
    layout = layout_of(raw, key, count)
    assert layout is not None
    return Spans(raw, layout.opening, layout.ends)


@settings(max_examples=300, deadline=None)
@given(st.lists(message, min_size=1, max_size=10), styles, st.lists(message, max_size=4),
       st.dictionaries(st.sampled_from(["model", "temperature", "tools"]), tricky_text, max_size=3),
       st.randoms(use_true_random=False), st.booleans())
def test_a_spliced_body_says_what_a_full_serialization_says(
        history: list[dict[str, Any]], style: str, new: list[dict[str, Any]], others: dict[str, Any],
        rng: random.Random, stand_in: bool) -> None:
    if stand_in:  # a client string equal to the array's stand-in: the body is serialized whole
        others["model"] = "\x00ctxproxy:spliced-array\x00"
    raw = dump({**others, "messages": history}, style)
    body = json.loads(raw)
    parsed = body["messages"]
    # What the pipeline forwards: the client's messages (some dropped, some twice), new objects among them.
    forwarded = [m for m in parsed if rng.random() < 0.8]
    for extra in new:
        forwarded.insert(rng.randint(0, len(forwarded)), extra)
    if parsed and rng.random() < 0.3:
        forwarded.insert(rng.randint(0, len(forwarded)), rng.choice(parsed))

    out = spliced_body(body, "messages", forwarded, spans_of(raw, len(parsed)), parsed)

    assert json.loads(out) == {**body, "messages": forwarded}
    assert list(json.loads(out)) == list(body)  # the array keeps its place among the keys


@settings(max_examples=200, deadline=None)
@given(st.lists(message, min_size=1, max_size=8), st.lists(message, min_size=1, max_size=4), styles)
def test_the_spans_a_parse_leaves_locate_each_message(history: list[dict[str, Any]],
                                                      more: list[dict[str, Any]], style: str) -> None:
    """Where the elements lie, from a whole parse (remember) and from a resent one (parse past the part an
    earlier body had): each span parses to its message."""
    cache = ResentBodies(min_bytes=0, group_prefix=1)
    first = dump({"model": "m", "messages": history}, style)
    spans = cache.remember(first, "messages", json.loads(first))
    second = dump({"model": "m", "messages": history + more}, style)
    resent = cache.parse(second, "messages")
    assert spans is not None and resent is not None
    cache.keep(resent)
    for raw, messages, where in ((first, history, spans), (second, history + more, resent.entry)):
        located = where if isinstance(where, Spans) else Spans(raw, where.layout.opening, where.layout.ends)
        starts = [located.opening, *located.ends[:-1]]
        got = [json.loads(raw[s:e].lstrip(b" \t\r\n,")) for s, e in zip(starts, located.ends, strict=True)]
        assert got == messages


def test_unchanged_messages_go_as_the_client_wrote_them() -> None:
    """Spacing, escapes and an integer past 64 bits (which a re-serialization would turn into a float) are
    kept for the messages the proxy left alone; what it changed is serialized."""
    history = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "caf\u00e9", "n": 2**70},
               {"role": "tool", "tool_call_id": "c1", "content": "x" * 5000},
               {"role": "user", "content": "next"}]
    raw = json.dumps({"model": "m", "messages": history}, indent=1).encode()  # \u00e9 escaped, 2**70 kept
    body = orjson.loads(raw)  # (2**70 parsed as a float, as the proxy's parse does)
    parsed = body["messages"]
    summary = {**parsed[2], "content": "[summary]"}
    block = {"role": "user", "content": "<memory>"}

    located = spans_of(raw, 4)

    out = spliced_body(body, "messages", [parsed[0], parsed[1], summary, parsed[3], block], located, parsed)

    client_two = raw[located.opening:located.ends[1]].strip()  # the first two, as sent
    assert b'\n   "role": "system",\n' in client_two and client_two in out
    assert b"\\u00e9" in out and str(2**70).encode() in out
    assert orjson.dumps(summary) in out and orjson.dumps(block) in out
    assert b"x" * 5000 not in out


def test_spans_that_do_not_fit_are_not_used() -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}]})
    body = orjson.loads(raw)
    wrong = Spans(raw, 13, [])  # (another body's count of elements)
    forwarded = [*body["messages"], {"role": "user", "content": "b"}]
    assert spliced_body(body, "messages", forwarded, wrong, body["messages"]) == \
        orjson.dumps({**body, "messages": forwarded})


def test_the_chat_codec_copies_a_resent_history() -> None:
    """Through the codec as the server calls it: a large body, then the same history resent with one more
    turn; a rewrite of the second (one result summarized, a block added) keeps the client's bytes for the
    rest, pretty-printed as the client sent them."""
    history = [{"role": "system", "content": "Be brief."}]
    for turn in range(40):
        history += [{"role": "user", "content": f"step {turn} " + "y" * 2000},
                    {"role": "assistant", "content": f"ok {turn}"}]
    first = json.dumps({"model": "gpt-4o", "messages": history}, indent=2).encode()
    CHAT.decode(first)
    grown = [*history, {"role": "user", "content": "and now?"}]
    second = json.dumps({"model": "gpt-4o", "messages": grown}, indent=2).encode()
    decoded = CHAT.decode(second)
    client = decoded.messages
    assert client[1] is not None and len(first) > 64 * 1024
    forwarded = [client[0], {"role": "user", "content": "<memory>"}, *client[1:5],
                 {**client[5], "content": "[summary]"}, *client[6:]]

    out = decoded.encode(forwarded, client, [{"type": "function", "function": {"name": "recall"}}])

    assert orjson.loads(out) == {"model": "gpt-4o", "messages": forwarded,
                                 "tools": [{"type": "function", "function": {"name": "recall"}}]}
    located = spans_of(second, len(grown))
    as_sent = second[located.ends[5]:located.ends[-1]].lstrip(b" \n,")  # the untouched run after the summary
    assert b"\n      " in as_sent and as_sent in out


def _resent_pair(turns: list[dict[str, Any]], more: dict[str, Any], key: str, validate: Any,
                 **rest: Any) -> tuple[bytes, dict[str, Any], Spans | None]:
    """A large pretty-printed body validated (remembered), then the same one more item longer: the second
    body, as parsed, and where its items lie."""
    first = json.dumps({**rest, key: turns}, indent=2).encode()
    assert len(first) > 64 * 1024
    validate(first)
    second = json.dumps({**rest, key: [*turns, more]}, indent=2).encode()
    body, spans = validate(second)
    return second, body, spans


def test_the_messages_codec_copies_a_resent_history() -> None:
    """Anthropic Messages: the native messages the rewrite leaves as they were go as the client sent them;
    the body says what the codec's whole serialization says."""
    turns = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} " + "z" * 2000}
             for n in range(60)]
    raw, body, spans = _resent_pair(turns, {"role": "user", "content": "and now?"}, "messages",
                                    validate_messages_request, model="claude", max_tokens=64,
                                    system="Be brief.")
    copying, whole = MessagesEncoder(body, raw, spans), MessagesEncoder(body, raw, None)
    original = copying.neutral
    assert whole.neutral == original and spans is not None
    forwarded = [*original[:10], {**original[10], "content": "[summary]"}, *original[11:]]

    out = copying.encode(forwarded, original, None)

    assert orjson.loads(out) == orjson.loads(whole.encode(forwarded, original, None))
    located = spans_of(raw, len(body["messages"]))
    as_sent = raw[located.ends[9]:located.ends[-1]].lstrip(b" \n,")  # after the changed one, as sent
    assert b"\n      " in as_sent and as_sent in out


def test_the_responses_codec_copies_a_resent_history() -> None:
    """OpenAI Responses: the same for the input items."""
    turns = [{"type": "message", "role": "user" if n % 2 == 0 else "assistant",
              "content": [{"type": "input_text" if n % 2 == 0 else "output_text",
                           "text": f"turn {n} " + "z" * 2000}]} for n in range(60)]
    more = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and now?"}]}
    raw, body, spans = _resent_pair(turns, more, "input", validate_responses_request, model="gpt-5",
                                    instructions="Be brief.")
    copying, whole = ResponsesEncoder(body, raw, spans), ResponsesEncoder(body, raw, None)
    original = copying.neutral
    assert whole.neutral == original and spans is not None
    changed = next(i for i, m in enumerate(original) if m.get("role") == "user" and i > 20)
    forwarded = [*original[:changed], {**original[changed], "content": "[summary]"}, *original[changed + 1:]]

    out = copying.encode(forwarded, original, None)

    assert orjson.loads(out) == orjson.loads(whole.encode(forwarded, original, None))
    assert b'"[summary]"' in out
    located = spans_of(raw, len(body["input"]), "input")
    as_sent = raw[located.ends[-10]:located.ends[-1]].lstrip(b" \n,")  # the last items, as sent
    assert b"\n      " in as_sent and as_sent in out



@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), styles, st.integers(min_value=2, max_value=5))
def test_a_session_resent_turn_by_turn_is_spliced_as_it_grows(rng: random.Random, style: str,
                                                              turns: int) -> None:
    """Through the server's parse (validate.parse_chat_body) over turns: each body resends the last one
    (sometimes edited early on, as a client may), each forwarded array keeps a head, drops a gap (an
    eviction), replaces some messages and adds blocks; where elements lie is carried from body to body."""
    pad = "p" * 1200
    history = [{"role": "system", "content": f"rules {rng.random()}"}]
    history += [{"role": "user" if n % 2 else "assistant", "content": f"{n} {pad}"} for n in range(60)]
    for turn in range(turns):
        history += [{"role": "user", "content": f"turn {turn} {rng.random()}"}]
        if rng.random() < 0.25:  # an edited history: little is shared with the body before
            at = rng.randint(1, len(history) - 1)
            history[at] = {**history[at], "content": f"edited {rng.random()}"}
        raw = dump({"model": "m", "messages": history, "stream": False}, style)
        body, spans = parse_chat_body(raw)
        parsed = body["messages"]
        gap = sorted(rng.sample(range(1, len(parsed)), 2))
        forwarded = [parsed[0], {"role": "user", "content": "<pinned>"}, *parsed[gap[1]:]]
        for _ in range(rng.randint(0, 4)):
            at = rng.randint(2, len(forwarded) - 1)
            forwarded[at] = {**forwarded[at], "content": "[summary]"}

        out = spliced_body(body, "messages", forwarded, spans, parsed)

        assert spans is not None
        assert json.loads(out) == {**body, "messages": forwarded}


def test_an_earlier_bodys_element_is_never_taken_for_this_ones() -> None:
    """The place of an element is carried from the body before; one that body had but this one does not
    (an edited history) is serialized, not copied from the bytes now in its old place."""
    earlier = [{"role": "user", "content": f"old {n}"} for n in range(4)]
    raw_before = orjson.dumps({"messages": earlier})
    before = spans_of(raw_before, 4)
    before.index_of(earlier)
    now = [earlier[0], earlier[1], {"role": "user", "content": "new 2"}, {"role": "user", "content": "new 3"}]
    raw_now = orjson.dumps({"messages": now})
    located = spans_of(raw_now, 4)
    carried = Spans(raw_now, located.opening, located.ends, before, shared=2)
    forwarded = [now[0], earlier[3], now[3]]  # earlier[3]: not in this body (its old place holds "new 3")

    out = spliced_body({"messages": now}, "messages", forwarded, carried, now)

    assert json.loads(out)["messages"] == [{"role": "user", "content": "old 0"},
                                           {"role": "user", "content": "old 3"},
                                           {"role": "user", "content": "new 3"}]
    index = carried.index_of(now)  # carried over (the earlier body's entries are still in it), and right
    assert index[id(earlier[3])] == 3 and all(index[id(m)] == place for place, m in enumerate(now))


def test_through_the_server_the_messages_left_alone_go_upstream_as_the_sdk_sent_them(proxy, fake_upstream):
    """The real server and the official SDK: a long session whose tool result layer 1 summarizes; the
    next turn's forwarded body holds the SDK's own bytes for the messages after it — an integer past 64
    bits in one of them included, which a parse and re-serialization would have made a float."""
    sent: list[bytes] = []
    http = httpx.Client(event_hooks={"request": [lambda request: sent.append(request.read())]})
    client = proxy.client(http_client=http, default_headers={"x-ctxproxy-session": "spliced"})
    log = "\n".join(f"12:00:{k % 60:02d} INFO worker {k % 3} processed batch {k}" for k in range(400))
    call = {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix the parser."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": log}]
    for n in range(40):
        history += [{"role": "assistant", "content": f"Looked at part {n}. " + "détail " * 250},
                    {"role": "user", "content": f"Go on with part {n + 1}."}]
    history[30]["x_trace_ref"] = 2**70  # (an unknown field: passed through untouched)
    for turn in range(2):
        answer = client.chat.completions.create(model="gpt-4o", messages=history)
        history += [{"role": "assistant", "content": answer.choices[0].message.content},
                    {"role": "user", "content": f"And turn {turn}?"}]
    client.chat.completions.create(model="gpt-4o", messages=history)

    forwarded = fake_upstream.chat_requests[-1]
    messages = forwarded.json()["messages"]
    result = next(m for m in messages if m.get("tool_call_id") == "call_1")
    assert result["content"].startswith("[ctxproxy summary of tool result call_id=call_1")
    located = spans_of(sent[-1], len(history))
    as_sent = sent[-1][located.ends[3]:located.ends[60]].lstrip(b" \n,")  # 57 messages after the result
    assert str(2**70).encode() in as_sent and as_sent in forwarded.body
    assert messages[-1] == history[-1] and len(sent[-1]) > 64 * 1024
