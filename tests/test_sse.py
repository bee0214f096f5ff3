"""Reading server-sent events (proxy/sse.py): a stream of plain events read in one pass gives what the
splitter's event-by-event, line-by-line reading gives, and any other stream is left to that reading."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.sse import EventSplitter, event_data, iter_data, plain_events

PLAIN = [b"event: message_start\ndata: {\"type\":\"message_start\"}", b"data: {\"choices\":[]}",
         b"event:ping\ndata:{}", b"data: [DONE]", b"event: x\ndata:    {\"a\": \"b: c\"}", b"data: ",
         b"event: \xe2\x82\xac\ndata: \xff\xfe", b"data: {\"text\": \"event: y\"}"]
# not plain: comments, other fields, two data lines, two event lines, a name alone, an empty event
ODD = [b": keep-alive", b"id: 3\ndata: {}", b"data: {\ndata: }", b"event: a\nevent: b\ndata: {}",
       b"event: a", b"retry: 10", b"", b"data: {}\n: note", b"\n"]


def read_line_by_line(whole: bytes) -> list[tuple[bytes, bytes | None]]:
    """Each whole event as (its first line when that is an `event:` line, else b""; its data)."""
    out = []
    for event in EventSplitter().feed(whole):
        first = event.split(b"\n", 1)[0]
        out.append((first + b"\n" if first.startswith(b"event:") and b"\n" in event else b"",
                    event_data(event)))
    return out


def data_line_by_line(chunks: list[bytes]) -> list[bytes]:
    """iter_data as the splitter reads it, chunk by chunk, with an unfinished last event."""
    splitter, out = EventSplitter(), []
    for chunk in chunks:
        out.extend(data for data in map(event_data, splitter.feed(chunk)) if data is not None)
    tail = splitter.rest().strip()
    if tail and (data := event_data(tail)) is not None:
        out.append(data)
    return out


def stream(events: list[bytes], newline: bytes, tail: bytes) -> bytes:
    return b"".join(event.replace(b"\n", newline) + newline * 2 for event in events) + tail


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PLAIN), max_size=20), st.binary(max_size=10))
def test_a_stream_of_plain_events_is_read_in_one_pass_as_line_by_line(events: list[bytes],
                                                                      tail: bytes) -> None:
    unfinished = b"\n".join(filter(None, tail.replace(b"\r", b"").split(b"\n")))  # (no blank line)
    whole = stream(events, b"\n", unfinished)
    plain = plain_events(whole)
    assert plain is not None  # the one-pass reading is taken
    assert plain == read_line_by_line(whole)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PLAIN), st.sampled_from(ODD)), max_size=20),
       st.sampled_from([b"\n", b"\r\n", b"\r"]), st.binary(max_size=10))
def test_any_stream_read_in_one_pass_reads_as_line_by_line(events: list[bytes], newline: bytes,
                                                           tail: bytes) -> None:
    whole = stream(events, newline, tail)
    plain = plain_events(whole)
    if plain is not None:
        assert plain == read_line_by_line(whole)


def test_streams_that_are_not_plain_are_left_to_the_line_by_line_reading() -> None:
    for odd in ODD:
        assert plain_events(stream([PLAIN[0], odd, PLAIN[1]], b"\n", b"")) is None, odd
    assert plain_events(stream(PLAIN[:2], b"\r\n", b"")) is None
    assert plain_events(b"") == []
    assert plain_events(b"data: {}") == []  # an unfinished event is not a whole one


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(PLAIN), st.sampled_from(ODD)), max_size=20),
       st.sampled_from([b"\n", b"\r\n"]), st.one_of(st.binary(max_size=10), st.sampled_from(PLAIN)),
       st.lists(st.integers(1, 40), min_size=1))
def test_data_payloads_are_those_of_the_splitter_chunk_by_chunk(events: list[bytes], newline: bytes,
                                                               tail: bytes, cuts: list[int]) -> None:
    whole = stream(events, newline, tail)
    chunks, at = [], 0
    while at < len(whole):
        chunks.append(whole[at:at + cuts[len(chunks) % len(cuts)]])
        at += len(chunks[-1])
    assert list(iter_data(chunks)) == data_line_by_line(chunks)
