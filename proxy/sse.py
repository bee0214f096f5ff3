"""Server-sent events: split a byte stream into events and fold chat-completion chunks into one message."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

DONE = b"[DONE]"


class EventSplitter:
    """Incrementally cut raw bytes into complete SSE events (separated by a blank line).

    Bytes are kept as bytes until an event is complete, so a multi-byte UTF-8 character split across
    network chunks is never decoded in halves.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        events: list[bytes] = []
        while True:
            cut, width = _find_boundary(self._buffer)
            if cut < 0:
                return events
            events.append(self._buffer[:cut])
            self._buffer = self._buffer[cut + width:]

    def rest(self) -> bytes:
        return self._buffer


def _find_boundary(buffer: bytes) -> tuple[int, int]:
    best, width = -1, 0
    for separator in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        at = buffer.find(separator)
        if at >= 0 and (best < 0 or at < best):
            best, width = at, len(separator)
    return best, width


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
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        self.response_id = self.response_id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("role"):
                self.role = delta["role"]
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            if isinstance(delta.get("refusal"), str):
                self.refusal.append(delta["refusal"])
            for call in delta.get("tool_calls") or ():
                slot = self.tool_calls.setdefault(
                    call.get("index", len(self.tool_calls)),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                if call.get("id"):
                    slot["id"] = call["id"]
                if call.get("type"):
                    slot["type"] = call["type"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.content) or None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message


def assemble(chunks: Iterable[bytes]) -> StreamAssembly:
    """Fold a recorded SSE byte stream (as relayed) into one assistant message."""
    assembly = StreamAssembly()
    for data in iter_data(chunks):
        if data.strip() == DONE:
            break
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(chunk, dict):
            assembly.add(chunk)
    return assembly
