"""The archive's reading of a streamed Responses answer (wire/responses_archive.py): the response object
of the stream's last final event, found without parsing the stream's deltas."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.archive_codec import loads
from proxy.sse import iter_data
from proxy.wire import responses_archive
from proxy.wire.responses_archive import final_response


def event(kind: str, **fields: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"


def delta(text: str) -> bytes:
    return event("response.output_text.delta", delta=text, item_id="msg_1", output_index=0)


def stream(*events: bytes, split: int = 7) -> list[bytes]:
    """The events as an upstream's chunks: cut at arbitrary places."""
    whole = b"".join(events)
    return [whole[i:i + split] for i in range(0, len(whole), split)]


def test_the_last_final_event_is_the_answer() -> None:
    first = {"id": "resp_1", "status": "completed", "output": []}
    last = {"id": "resp_2", "status": "incomplete", "output": []}
    chunks = stream(event("response.created", response={"id": "resp_1", "status": "in_progress"}),
                    event("response.completed", response=first),
                    delta('the text says "response.completed" and response.failed'),
                    event("response.incomplete", response=last),
                    delta("after it"),
                    b"event: response.failed\ndata: {not json response.failed\n\n")
    assert final_response(chunks) == last
    assert final_response(stream(delta("no end"), delta("response.completed"))) is None


def test_only_events_naming_a_final_kind_are_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []
    loads = responses_archive.loads

    def counting(data: bytes) -> Any:
        parsed.append(data)
        return loads(data)

    monkeypatch.setattr(responses_archive, "loads", counting)
    answer = {"id": "resp_1", "status": "completed", "output": []}
    deltas = [delta(f"w{n} ") for n in range(50)]
    chunks = stream(event("response.created", response={"id": "resp_1"}), *deltas,
                    event("response.completed", response=answer))

    assert final_response(chunks) == answer
    assert len(parsed) == 1


def every_event_parsed(chunks: list[bytes]) -> dict[str, Any] | None:
    """The plain reading: every event parsed, the last final one kept."""
    found = None
    for data in iter_data(chunks):
        try:
            event = loads(data)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("response"), dict) and event.get("type") in (
                "response.completed", "response.incomplete", "response.failed"):
            found = event["response"]
    return found


KINDS = ["response.completed", "response.incomplete", "response.failed", "response.output_text.delta",
         "response.created"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(["", "response.completed", "x\r\n"]),
                          st.sampled_from(["\n", "\r\n", "\r"]), st.booleans(), st.booleans()),
                max_size=8),
       st.integers(1, 40))
def test_the_search_from_the_end_reads_what_every_event_parsed_reads(events, split):
    """Any line endings (LF, CRLF, CR), data split over two lines, bodies that are not JSON, texts naming
    a final kind, chunks cut anywhere."""
    wire = b""
    for n, (kind, text, newline, two_lines, broken) in enumerate(events):
        data = orjson.dumps({"type": kind, "response": {"id": f"resp_{n}", "text": text}, "delta": text})
        data = data[:-3] if broken else data
        lines = [b"event: " + kind.encode()]
        lines += [b"data: " + data[:9], b"data: " + data[9:]] if two_lines else [b"data: " + data]
        ending = newline.encode()
        wire += ending.join(lines) + ending + ending
    chunks = [wire[i:i + split] for i in range(0, len(wire), split)]
    assert final_response(chunks) == every_event_parsed(chunks)
