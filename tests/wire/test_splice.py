"""A rewritten body from the client's own bytes (proxy/wire/splice.py): whatever the forwarded array holds,
the body says what a full serialization says, and the client's unchanged messages are its own bytes."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire.chat import CHAT
from proxy.wire.resent import ResentBodies, layout_of
from proxy.wire.splice import Spans, spliced_body

tricky_text = st.lists(st.sampled_from([*'ab "\\{}[]:,\n\té€😀', '"messages":[', "\x00ctxproxy"]),
                       max_size=20).map("".join)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": tricky_text},
    optional={"n": st.integers(min_value=-(2**63), max_value=2**64 - 1),
              "extra": st.lists(tricky_text, max_size=2)})
styles = st.sampled_from(["orjson", "python", "indent", "ascii"])


def dump(value: Any, style: str) -> bytes:
    if style == "orjson":
        return orjson.dumps(value)
    if style == "python":
        return json.dumps(value, ensure_ascii=False).encode()  # ", " and ": " separators
    if style == "indent":
        return json.dumps(value, indent=2, ensure_ascii=False).encode()
    return json.dumps(value).encode()  # \\uXXXX escapes


def spans_of(raw: bytes, count: int) -> Spans:
    layout = layout_of(raw, "messages", count)
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
