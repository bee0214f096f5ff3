"""The end of a relayed stream waits for the archive, and only the end: events that arrive in the same read
as the closing one go out at once (issue 14: time to first byte when a fast upstream's answer comes in one
read)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.relay import CHAT_ENDS, archived

MESSAGES_ENDS = (b"event: message_stop", b"event: error")


def relay(reads: list[bytes], ends: tuple[bytes, ...] = CHAT_ENDS) -> list[bytes | str]:
    """What the client gets, in order, with "archived" where the exchange reached the archive."""
    order: list[bytes | str] = []

    async def events() -> AsyncIterator[bytes]:
        for read in reads:
            yield read

    async def done() -> None:
        order.append("archived")

    async def run() -> None:
        async for chunk in archived(events(), [], done, ends):
            order.append(chunk)

    asyncio.run(run())
    return order


def test_a_stream_whose_end_is_done_at_once_and_one_that_leaves_work_both_end_archived() -> None:
    """`on_done` archives what it can at once (None: nothing left) or returns what is left to await (the
    records spooled from a thread): either way the closing event goes out after the archive has it."""
    order: list[Any] = []

    async def events() -> AsyncIterator[bytes]:
        yield b"data: {}\n\ndata: [DONE]\n\n"

    async def left() -> None:
        await asyncio.sleep(0)
        order.append("archived later")

    def at_once() -> None:
        order.append("archived")

    def leaving() -> Coroutine[Any, Any, None]:
        return left()

    async def run(on_done: Any) -> None:
        async for chunk in archived(events(), [], on_done):
            order.append(chunk)

    asyncio.run(run(at_once))
    asyncio.run(run(leaving))
    assert order == [b"data: {}\n\n", "archived", b"data: [DONE]\n\n",
                     b"data: {}\n\n", "archived later", b"data: [DONE]\n\n"]


def test_events_read_together_with_the_end_go_out_before_the_archive_has_them() -> None:
    read = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    assert relay([read]) == [b'data: {"a":1}\n\ndata: {"b":2}\n\n', "archived", b"data: [DONE]\n\n"]


def test_crlf_events_and_the_messages_end_are_split_the_same_way() -> None:
    read = b"event: content_block_delta\r\ndata: {}\r\n\r\nevent: message_stop\r\ndata: {}\r\n\r\n"
    assert relay([read], MESSAGES_ENDS) == [b"event: content_block_delta\r\ndata: {}\r\n\r\n", "archived",
                                            b"event: message_stop\r\ndata: {}\r\n\r\n"]


def test_a_done_inside_content_is_not_the_end() -> None:
    first = b'data: {"text":"say data: [DONE] please"}\n\n'
    assert relay([first, b"data: [DONE]\n\n"]) == [first, "archived", b"data: [DONE]\n\n"]


content = st.binary(max_size=20).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" "))


@settings(max_examples=300, deadline=None)
@given(st.lists(content, max_size=6), st.lists(st.integers(0, 6), max_size=4),
       st.sampled_from([b"\n\n", b"\r\n\r\n"]))
def test_the_stream_is_relayed_whole_and_only_its_closing_event_waits(
        texts: list[bytes], cuts: list[int], blank: bytes) -> None:
    events = [b"data: " + text + blank for text in texts] + [b"data: [DONE]" + blank]
    bounds = sorted({0, len(events), *(min(c, len(events)) for c in cuts)})
    reads = [b"".join(events[a:b]) for a, b in itertools.pairwise(bounds) if a < b]
    order = relay(reads)
    assert b"".join(part for part in order if isinstance(part, bytes)) == b"".join(events)
    before = b"".join(part for part in order[:order.index("archived")] if isinstance(part, bytes))
    assert before == b"".join(events[:-1])  # everything but the closing event, before the archive
