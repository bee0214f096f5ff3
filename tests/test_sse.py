"""Server-sent events cut out of a byte stream however it is chunked (proxy/sse.py)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import sse
from proxy.sse import EventSplitter

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
