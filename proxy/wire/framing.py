"""What the Messages and Responses streams share: relaying one round's events through the format's round
object, deciding how the round ended (whole, an upstream error relayed, or broken: our error event), and
watching how a relayed stream of named events ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import orjson

from proxy import faults
from proxy.archive import ExchangeRecord
from proxy.archive_parse import ParsedResponse
from proxy.sse import EventSplitter, event_data
from proxy.upstream_response import TransportError, UpstreamResponse


class Round(Protocol):
    """One upstream round seen event by event (MessagesRound, ResponsesRound)."""

    malformed: str | None
    error: Any
    done: bool

    def feed(self, event: bytes) -> bytes | None: ...


class EventFramer:
    """The shared half of a `round_stream.Framer` over named SSE events. A subclass makes `self.round`
    before each round, says what a whole round adds up (`whole`), and how it ends (`is_whole`, its end
    event's name, its error event)."""

    round: Round
    end_name = "the end event"

    def __init__(self) -> None:
        self.cut_tail = False
        self.fed_tail = False  # the round's last event came without its blank line (the chunks' reader
        # drops it)

    async def events(self, response: UpstreamResponse, record: ExchangeRecord,
                     cap: int) -> AsyncIterator[bytes]:
        """The round's events as the client gets them; stops at an upstream error event."""
        splitter = EventSplitter()
        self.fed_tail = False
        async for chunk in response.aiter_raw():
            record.keep_chunk(chunk, cap)
            for event in splitter.feed(chunk):
                out = self.round.feed(event)
                if out:
                    yield out
                if self.round.error is not None:
                    return
        tail = splitter.rest()
        if faults.complete_tail(tail):  # the last event came without its blank line
            self.fed_tail = True
            out = self.round.feed(tail.rstrip(b"\r\n"))
            if out:
                yield out
        elif tail.strip():
            self.cut_tail = True

    def end(self, broke: TransportError | None, record: ExchangeRecord) -> bytes | None:
        """None when the round is whole; else b"" (the upstream's error event was relayed) or ours."""
        state = self.round
        if state.malformed:
            record.error = f"malformed upstream event relayed untouched: {state.malformed}"
        if state.error is not None:
            record.error = f"upstream sent an error in the stream: {faults.error_message(state.error)}"
            return b""
        if broke is not None:
            message = faults.stream_failure(broke)[1]
            if state.done:
                record.error = f"{message} (after {self.end_name})"
                self.whole()
                return None
        elif self.is_whole():
            self.whole()
            if not (record.response_truncated or self.fed_tail or state.malformed):
                # every event of the kept chunks was fed to the round, and nothing else: the archive
                # writer takes what it read instead of reading the chunks again (~70 µs a Claude answer)
                record.answer = self.answer()
            return None
        else:
            message = f"upstream stream ended without {self.end_name}"
        if self.cut_tail:
            message += " (mid-event)"
        record.error = message
        return self.broken(message)

    def is_whole(self) -> bool:
        raise NotImplementedError

    def answer(self) -> ParsedResponse | None:
        """What the archive keeps of the whole round just relayed (None: the writer reads the chunks)."""
        return None

    def whole(self) -> None:
        raise NotImplementedError

    def broken(self, message: str) -> bytes:
        raise NotImplementedError


class NamedEventWatch(faults.StreamWatch):
    """How a relayed stream of named events ends: an end event (done), a finishing event (`finished`
    says which), an error event. Events named otherwise are passed without parsing their data."""

    def __init__(self, ends: frozenset[str], finishing: str | None = None,
                 finished: Callable[[dict[str, Any]], bool] = lambda event: False) -> None:
        super().__init__()
        self.ends, self.finishing, self.is_finish = ends, finishing, finished
        names = (*ends, "error", *([finishing] if finishing else []))
        self.names = tuple(f"event: {name}".encode() for name in names)

    def _see(self, event: bytes) -> None:
        if event.startswith(b"event: ") and not event.startswith(self.names):
            return  # named, and not an end: the common case, decided without parsing the data
        data = event_data(event)
        if data is None:
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        kind = obj.get("type")
        if kind in self.ends:
            self.done = True
        elif kind == self.finishing and self.is_finish(obj):
            self.finished = True
        elif kind == "error" and self.upstream_error is None:
            self.upstream_error = obj.get("error") or obj
