"""Server-sent events cut out of a byte stream however it is chunked (proxy/sse.py)."""

from __future__ import annotations

import re

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import sse
from proxy.sse import EventSplitter
from proxy.wire.messages_stream import event_name

_SEPARATOR = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def reference(stream: bytes) -> tuple[list[bytes], bytes]:
    """The events of the whole stream at once (leftmost separator first) and what follows the last."""
    *events, rest = _SEPARATOR.split(stream)
    return events, rest


def chunked(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(stream)) for cut in cuts})
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


streams = st.lists(st.sampled_from([b"data: x", b"\n", b"\r", b"\n\n", b"\r\n", b"event: y", b"\xc3\xa9"]),
                   max_size=40).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(streams, st.lists(st.integers(0, 400), max_size=12))
def test_events_are_the_whole_streams_however_it_is_chunked(stream: bytes, cuts: list[int]) -> None:
    splitter = EventSplitter()
    events, complete = [], b""
    for chunk in chunked(stream, cuts):
        done, found = splitter.feed_raw(chunk)
        complete += done
        events += found
        assert done == b"".join(e + sep for e, sep in zip(found, _separators(done), strict=True))
    expected, rest = reference(stream)
    assert events == expected
    assert splitter.rest() == rest and complete + rest == stream


def _separators(done: bytes) -> list[bytes]:
    return _SEPARATOR.findall(done)


def test_a_stream_of_line_feeds_is_cut_in_one_split(monkeypatch) -> None:
    """Providers separate events with `\\n\\n` only: those reads are cut by one split in C, not the
    three-separator loop (a few Python steps an event); one carriage return sends the rest of the stream
    there."""
    fast = []
    real = EventSplitter._feed_lf
    monkeypatch.setattr(EventSplitter, "_feed_lf", staticmethod(lambda *args: fast.append(1) or real(*args)))
    splitter = EventSplitter()
    assert splitter.feed_raw(b"data: 1\n\ndata: 2\n\nda") == (b"data: 1\n\ndata: 2\n\n",
                                                           [b"data: 1", b"data: 2"])
    assert splitter.feed_raw(b"ta: 3\n\n") == (b"data: 3\n\n", [b"data: 3"])
    assert len(fast) == 2
    assert splitter.feed_raw(b"data: 4\r\n\r\n") == (b"data: 4\r\n\r\n", [b"data: 4"])
    assert splitter.feed(b"data: 5\n\n") == [b"data: 5"] and len(fast) == 2


def test_a_huge_event_in_small_reads_is_copied_about_once(monkeypatch) -> None:
    """A 4 MB event in 4 KB reads: no read copies what is buffered (that would be quadratic)."""
    copied = []
    monkeypatch.setattr(sse, "bytes", lambda value=b"": copied.append(len(value)) or bytes(value),
                        raising=False)
    splitter = EventSplitter()
    for _ in range(1024):
        assert splitter.feed_raw(b"x" * 4096) == (b"", [])
    assert splitter.feed(b"\n\n") == [b"x" * 4096 * 1024]
    assert sum(copied) <= 2 * (4096 * 1024 + 2)


plain_parts = st.lists(st.sampled_from([
    b"data: x", b'data:{"a":1}', b"data:   y", b"event: y\n", b"event:z\ndata: w", b"event: a b \ndata: 2",
    b"\n", b"\r", b"\n\n", b": c", b"data: [DONE]", b"retry: 1", b"data:", b"\xc3\xa9"]), max_size=30)


@settings(max_examples=700, deadline=None)
@given(plain_parts, st.booleans())
def test_plain_events_are_the_events_read_line_by_line(parts: list[bytes], named: bool) -> None:
    stream = b"".join(parts)
    expected, rest = reference(stream)
    plain = sse.plain_events(stream, named)
    if plain is None:  # (some event is not plain, or a carriage return is about)
        return
    found, end = plain
    assert stream[end:].strip() == rest.strip()
    assert len(found) == len(expected)
    for event, hit in zip(expected, found, strict=True):
        name, data = hit if named else (b"", hit)
        assert data == sse.event_data(event)
        if named:
            assert name.strip().decode("utf-8", "replace") == event_name(event)
        else:
            assert not any(line.startswith(b"event:") for line in event.splitlines())


def test_plain_events_find_what_providers_send() -> None:
    messages = (b'event: ping\ndata: {"type":"ping"}\n\n'
                b'event: message_stop\ndata: {"type":"message_stop"}\n\nev')
    assert sse.plain_events(messages, named=True) == (
        [(b" ping", b'{"type":"ping"}'), (b" message_stop", b'{"type":"message_stop"}')], len(messages) - 2)
    chat = b'data: {"id":"c"}\n\ndata: [DONE]\n\n'
    assert sse.plain_events(chat, named=False) == ([b'{"id":"c"}', b"[DONE]"], len(chat))
    assert sse.plain_events(chat, named=True) is None  # (no event lines)
    assert sse.plain_events(b"data: 1\r\n\r\n", named=False) is None
    assert sse.plain_events(b"data: 1\n\n: keep-alive\n\n", named=False) is None
    assert sse.plain_events(b"", named=False) == ([], 0)


def chat_chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    return b"data: " + orjson.dumps({"id": "c1", "model": "m", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]})


chat_events = st.lists(st.one_of(
    st.sampled_from([chat_chunk({"role": "assistant", "content": ""}), chat_chunk({"content": "he"}),
                     chat_chunk({"content": "llo\n\n"}), chat_chunk({}, "stop"),
                     chat_chunk({"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f",
                                                                                    "arguments": "{"}}]}),
                     chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}),
                     b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":3}}', b"data: [DONE]"]),
    st.sampled_from([b": keep-alive", b"data: {not json", b"data: [1]", b"event: x\ndata: {}", b""])),
    max_size=20)


@settings(max_examples=400, deadline=None)
@given(chat_events, st.sampled_from([b"\n", b"\r\n"]), st.lists(st.integers(1, 50), min_size=1),
       st.sampled_from([b"", b"data: {\"choices\":[{\"delta\":{\"content\":\"!\"}}]}", b"da"]))
def test_a_chat_stream_folds_as_read_line_by_line(events: list[bytes], newline: bytes, cuts: list[int],
                                                  tail: bytes) -> None:
    whole = b"".join(event.replace(b"\n", newline) + newline * 2 for event in events) + tail
    chunks = chunked(whole, [sum(cuts[:n + 1]) for n in range(len(cuts))])
    reference_fold = sse.StreamAssembly()
    for data in sse.iter_data(chunks):
        if data.strip() == sse.DONE:
            break
        try:
            reference_fold.add(orjson.loads(data))
        except orjson.JSONDecodeError:
            reference_fold.problem(f"a data event is not JSON: {bytes(data[:80])!r}")
    folded = sse.assemble(chunks)
    assert folded == reference_fold
