"""A whole streamed round's answer, read as it was relayed (wire/framing.py): the archive writer takes it
instead of reading the kept chunks again, so it must be exactly what that reading gives, and be left out
wherever the two could differ (a kept prefix, a last event without its blank line, an event the round
could not read, an id rewritten for the client)."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator
from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.archive import ExchangeRecord
from proxy.archive_parse import parse_response
from proxy.upstream_response import UpstreamResponse
from proxy.wire import Decoded
from proxy.wire.framing import EventFramer
from proxy.wire.messages_framer import MessagesFramer
from proxy.wire.responses_framer import ResponsesFramer
from tests.test_answer_readers_fuzz import MESSAGES, RESPONSES, named
from tests.wire.test_messages_stream import (
    STOP,
    message_delta,
    message_start,
    text_block,
    thinking_block,
    tool_block,
)
from tests.wire.test_responses_stream import upstream

CAP = 1 << 20


class Chunks:
    """The upstream's body as the relay reads it (UpstreamResponse.aiter_raw)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def record(route: str) -> ExchangeRecord:
    return ExchangeRecord(id="ex-1", created_at="2026-12-07T00:00:00Z", session_id="s", session_source="h",
                          tenant="t", policy="default", route=route, model="m", stream=True,
                          request_messages=[], params={}, status=200)


def relayed(framer: EventFramer, chunks: list[bytes], route: str, cap: int = CAP) -> ExchangeRecord:
    kept = record(route)

    async def relay() -> None:
        async for _ in framer.events(cast(UpstreamResponse, Chunks(chunks)), kept, cap):
            pass

    asyncio.run(relay())
    framer.end(None, kept)
    return kept


def read_from_chunks(kept: ExchangeRecord) -> Any:
    """What the writer reads of the record without the relay's answer (a record replayed from the spool)."""
    alone = copy.copy(kept)
    alone.answer = None
    return parse_response(alone)


def split(whole: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(whole)) for c in cuts} | {0, len(whole)})
    return [whole[a:b] for a, b in itertools.pairwise(points) if b > a]


def messages_framer() -> MessagesFramer:
    return MessagesFramer(cast(Decoded, None))


def responses_framer() -> ResponsesFramer:
    return ResponsesFramer(cast(Decoded, None))


def claude_answer(kinds: list[str]) -> bytes:
    events: list[dict[str, Any]] = [message_start(42, "msg_7")]
    for index, kind in enumerate(kinds):
        if kind == "text":
            events += text_block(index, f"part {index}: some text\n\nwith a blank line", 4)
        elif kind == "thinking":
            events += thinking_block(index, f"thought {index}", f"sig{index}")
        else:
            events += tool_block(index, f"toolu_{index}", "bash", {"command": f"ls /srv/{index}"})
    events += [message_delta("tool_use" if "tool" in kinds else "end_turn", 17), STOP]
    return b"".join(named(event) + b"\n\n" for event in events)


block_kinds = st.lists(st.sampled_from(["text", "thinking", "tool"]), max_size=5)
cuts = st.lists(st.integers(0, 4000), max_size=12)


@settings(max_examples=150, deadline=None)
@given(block_kinds, cuts)
def test_a_whole_claude_answer_is_read_once_and_as_its_chunks_read(kinds: list[str], at: list[int]) -> None:
    kept = relayed(messages_framer(), split(claude_answer(kinds), at), "messages")
    assert kept.answer is not None
    assert kept.answer == read_from_chunks(kept)
    assert kept.answer.response_id == "msg_7"
    assert kept.answer.usage is not None and kept.answer.usage["completion_tokens"] == 17


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["message", "reasoning", "client"]), max_size=4), cuts)
def test_a_whole_codex_answer_is_read_once_and_as_its_chunks_read(kinds: list[str], at: list[int]) -> None:
    items = [(kind, f"label{n}") for n, kind in enumerate(kinds)]
    whole = b"".join(event + b"\n\n" for event in upstream("resp_9", items))
    kept = relayed(responses_framer(), split(whole, at), "responses")
    assert kept.answer is not None
    assert kept.answer == read_from_chunks(kept)
    assert kept.answer.response_id == "resp_9"


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(MESSAGES, max_size=12), cuts)
def test_claude_events_of_any_shape_are_kept_only_as_the_chunks_read(events: list[dict[str, Any]],
                                                                     at: list[int]) -> None:
    whole = b"".join(named(event) + b"\n\n" for event in events)
    kept = relayed(messages_framer(), split(whole, at), "messages")
    assert kept.answer is None or kept.answer == read_from_chunks(kept)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(RESPONSES, max_size=12), cuts)
def test_codex_events_of_any_shape_are_kept_only_as_the_chunks_read(events: list[dict[str, Any]],
                                                                    at: list[int]) -> None:
    whole = b"".join(named(event) + b"\n\n" for event in events)
    kept = relayed(responses_framer(), split(whole, at), "responses")
    assert kept.answer is None or kept.answer == read_from_chunks(kept)


def test_a_kept_prefix_of_a_huge_answer_is_read_from_what_was_kept() -> None:
    whole = claude_answer(["text", "tool"])
    kept = relayed(messages_framer(), [whole], "messages", cap=len(whole) // 2)
    assert kept.response_truncated and kept.answer is None


def test_a_last_event_without_its_blank_line_is_left_to_the_chunks_reader() -> None:
    """The relay feeds such a tail (the round ends well for the client); the chunks' reader drops it."""
    kept = relayed(messages_framer(), [claude_answer(["text"]).removesuffix(b"\n\n")], "messages")
    assert kept.error is None and kept.answer is None


def test_a_round_with_an_unreadable_event_is_left_to_the_chunks_reader() -> None:
    bad = b"event: content_block_delta\ndata: {nope\n\n"
    whole = claude_answer(["text"]).replace(b"event: message_stop", bad + b"event: message_stop", 1)
    kept = relayed(messages_framer(), [whole], "messages")
    assert kept.answer is None and "malformed" in str(kept.error)


def test_a_later_rounds_answer_under_the_clients_id_is_left_to_the_chunks_reader() -> None:
    """Round 1's response objects are re-served under round 0's id: what the relay holds is no longer
    what the upstream sent."""
    framer = responses_framer()
    relayed(framer, [b"".join(e + b"\n\n" for e in upstream("resp_0", [("message", "a")]))], "responses")
    later = record("responses")

    async def relay() -> None:
        chunks = Chunks([b"".join(e + b"\n\n" for e in upstream("resp_1", [("message", "b")]))])
        async for _ in framer.relay(cast(UpstreamResponse, chunks), later, 1, CAP):
            pass

    asyncio.run(relay())
    framer.end(None, later)
    assert later.error is None and later.answer is None
    assert read_from_chunks(later).response_id == "resp_1"


def test_the_answer_stays_out_of_the_spool() -> None:
    """A record read back from the spool (a restart) has no answer: its chunks are read."""
    from proxy.archive_items import decode_item, encode_item

    kept = relayed(messages_framer(), [claude_answer(["text"])], "messages")
    assert kept.answer is not None
    back = decode_item(encode_item(kept))
    assert isinstance(back, ExchangeRecord) and back.answer is None
    assert parse_response(back) == kept.answer
