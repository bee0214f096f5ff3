"""Server-sent events: split a byte stream into events and fold chat-completion chunks into one message."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy import shallow_json

DONE = b"[DONE]"


class EventSplitter:
    """Incrementally cut raw bytes into complete SSE events (separated by a blank line).

    Bytes are kept as bytes until an event is complete, so a multi-byte UTF-8 character split across
    network chunks is never decoded in halves. Each byte is searched about once, so a huge event
    arriving in many small reads costs linear time.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._cr = False  # a carriage return seen: the stream may use the other two separators

    def feed(self, chunk: bytes) -> list[bytes]:
        return self.feed_raw(chunk)[1]

    def feed_raw(self, chunk: bytes) -> tuple[bytes, list[bytes]]:
        """(the bytes of the events completed by `chunk`, separators included, as received; the events)."""
        buffer = self._buffer
        # What is buffered holds no separator: one can only end in the new bytes.
        scan = max(0, len(buffer) - 3)
        buffer += chunk
        if not self._cr and b"\r" not in chunk:
            return self._feed_lf(buffer, scan)
        self._cr = True
        events: list[bytes] = []
        found = {separator: buffer.find(separator, scan) for separator in SEPARATORS}
        start = 0
        while True:
            hits = [(at, len(separator)) for separator, at in found.items() if at >= 0]
            if not hits:
                break
            cut, width = min(hits)
            events.append(bytes(buffer[start:cut]))
            start = cut + width
            for separator, at in found.items():
                if 0 <= at < start:
                    found[separator] = buffer.find(separator, start)
        complete = bytes(buffer[:start])
        del buffer[:start]
        return complete, events

    @staticmethod
    def _feed_lf(buffer: bytearray, scan: int) -> tuple[bytes, list[bytes]]:
        """`feed_raw` for a stream with only `\\n\\n` between its events (what providers send): one split in C
        where the loop above costs each event a few Python steps (~2 µs)."""
        if buffer.find(b"\n\n", scan) < 0:
            return b"", []
        whole = bytes(buffer)
        events = whole.split(b"\n\n")  # (leftmost first, as the loop cuts)
        cut = len(whole) - len(events.pop())
        del buffer[:cut]
        return whole[:cut], events

    def rest(self) -> bytes:
        return bytes(self._buffer)


SEPARATORS = (b"\n\n", b"\r\n\r\n", b"\r\r")


# Events as providers send them: one `data:` line (after one `event:` line in the Messages format), LF
# line ends, a blank line after each. A match starts only where an event does (the start, or after a blank
# line), so each match is one whole event as `EventSplitter` cuts them.
_PLAIN_DATA = re.compile(rb"(?:\A|(?<=\n\n))data: *([^\n]*)\n\n")
_PLAIN_NAMED = re.compile(rb"(?:\A|(?<=\n\n))event:([^\n]*)\ndata: *([^\n]*)\n\n")


def plain_events(whole: bytes, named: bool) -> tuple[list[Any], int] | None:
    """The complete events of a recorded stream when every one is plain (above): their data (`named`:
    their (name, data) pairs, the name unstripped), found by one regular expression in C where cutting
    each event and reading it line by line costs ~1 µs; and where the last one ends (the rest is not an
    event). None when some event is not plain: read those line by line."""
    if b"\r" in whole:
        return None
    end = whole.rfind(b"\n\n") + 2 if b"\n\n" in whole else 0
    found = (_PLAIN_NAMED if named else _PLAIN_DATA).findall(whole, 0, end)
    return (found, end) if len(found) == whole.count(b"\n\n", 0, end) else None


def event_data(event: bytes) -> bytes | None:
    """The joined `data:` payload of one event, or None for comments and other fields."""
    lines = [line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def iter_data(chunks: Iterable[bytes]) -> Iterator[bytes]:
    splitter = EventSplitter()
    for chunk in chunks:
        for event in splitter.feed(chunk):
            data = event_data(event)
            if data is not None:
                yield data
    tail = splitter.rest().strip()
    if tail:
        data = event_data(tail)
        if data is not None:
            yield data


@dataclass
class StreamAssembly:
    """The pieces of a streamed chat completion folded back into a non-streamed shape."""

    response_id: str | None = None
    model: str | None = None
    role: str = "assistant"
    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # (names, arguments: `pieces`)
    # each call's name and arguments deltas, joined by `message` (`joined_calls`)
    pieces: dict[int, tuple[list[str], list[str]]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    chunks: int = 0  # chat-completion chunks folded in
    problems: list[str] = field(default_factory=list)  # what did not have the expected shape (first few)

    def problem(self, text: str) -> None:
        if len(self.problems) < 8 and text not in self.problems:
            self.problems.append(text)

    def add(self, chunk: Any) -> None:
        """Fold one parsed `data:` payload in; anything of the wrong shape is noted and skipped."""
        if not isinstance(chunk, dict):
            self.problem(f"a data event is {type(chunk).__name__}, not an object")
            return
        self.chunks += 1
        if self.response_id is None and isinstance(chunk.get("id"), str):
            self.response_id = chunk["id"]
        if self.model is None and isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if usage:
                self.usage = usage
        elif usage is not None:
            self.problem(f"usage is {type(usage).__name__}, not an object")
        choices = chunk.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list):
            self.problem(f"choices is {type(choices).__name__}, not a list")
            return
        for choice in choices:
            if not isinstance(choice, dict):
                self.problem(f"a choice is {type(choice).__name__}, not an object")
                continue
            if choice.get("index", 0) != 0:
                continue
            self._add_delta(choice.get("delta"))
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                self.finish_reason = finish

    def _add_delta(self, delta: Any) -> None:
        if delta is None:
            return
        if not isinstance(delta, dict):
            self.problem(f"a delta is {type(delta).__name__}, not an object")
            return
        if isinstance(delta.get("role"), str) and delta["role"]:
            self.role = delta["role"]
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        calls = delta.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            self.problem(f"tool_calls is {type(calls).__name__}, not a list")
            return
        for call in calls or ():
            if not isinstance(call, dict):
                self.problem(f"a tool call delta is {type(call).__name__}, not an object")
                continue
            index = call.get("index")
            if not isinstance(index, int) or isinstance(index, bool):
                index = len(self.tool_calls)
            slot = self.tool_calls.setdefault(
                index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            if isinstance(call.get("id"), str) and call["id"]:
                slot["id"] = call["id"]
            if isinstance(call.get("type"), str) and call["type"]:
                slot["type"] = call["type"]
            function = call.get("function")
            if not isinstance(function, dict):
                if function is not None:
                    self.problem(f"a tool call's function is {type(function).__name__}, not an object")
                continue
            names, arguments = self.pieces.setdefault(index, ([], []))
            if isinstance(function.get("name"), str):
                names.append(function["name"])
            if isinstance(function.get("arguments"), str):
                arguments.append(function["arguments"])

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.content) or None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.tool_calls:
            message["tool_calls"] = joined_calls(self.tool_calls, self.pieces)
        return message


def joined_calls(calls: dict[int, dict[str, Any]],
                 pieces: dict[int, tuple[list[str], list[str]]]) -> list[dict[str, Any]]:
    """Chat tool calls by index, each call's name and arguments deltas (`pieces`) joined onto it: kept
    apart as they came, since joining each as it came copied the arguments so far on every delta."""
    for index, (names, arguments) in pieces.items():
        function = calls[index]["function"]
        function["name"], function["arguments"] = "".join(names), "".join(arguments)
    return [calls[i] for i in sorted(calls)]


def assemble(chunks: Iterable[bytes]) -> StreamAssembly:
    """Fold a recorded SSE byte stream (as relayed) into one assistant message. Never raises: data that
    is not JSON, or JSON of another shape, is skipped and named in `problems`."""
    assembly = StreamAssembly()
    whole = b"".join(chunks)
    plain = plain_events(whole, named=False)
    datas: Iterable[bytes] = iter_data([whole]) if plain is None else _with_tail(plain[0], whole[plain[1]:])
    for data in datas:
        if data.strip() == DONE:
            break
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            try:  # the stdlib reads what orjson refuses (escaped lone surrogates, integers past 64 bits)
                chunk = shallow_json.loads(data)
            except ValueError:
                assembly.problem(f"a data event is not JSON: {bytes(data[:80])!r}")
                continue
        assembly.add(chunk)
    return assembly


def _with_tail(datas: list[bytes], tail: bytes) -> list[bytes]:
    """The data of the complete events, then that of an unfinished one (as `iter_data` reads it)."""
    data = event_data(tail.strip()) if tail.strip() else None
    return datas if data is None else [*datas, data]
